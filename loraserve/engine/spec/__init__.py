"""Speculative decoding that never changes an answer: drafts (n-gram lookups in the request's
own text, a pool shared by the requests of one adapter cache key, or a draft model) verified
as extra rows of the engine's batched step (`config`, `ngram`, `drafter`, `draft_model`)."""
