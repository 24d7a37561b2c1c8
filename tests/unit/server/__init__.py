"""Server pieces without a server: schemas, flags, chat templates, error bodies."""
