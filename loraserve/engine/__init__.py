"""The engine: requests, scheduler, model runner, sampling."""
