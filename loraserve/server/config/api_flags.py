"""Flags of the API features, registered here so that the command line owns every flag:
CORS (`--cors-*`, the policy is `server/cors.py`) and embeddings / reranking (`--embedding`,
`--reranking`, `--pooling`, served by `server/native/embeddings.py`)."""

from __future__ import annotations

import argparse

from loraserve.engine.pooling import Pooling


def add_cors_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's CORS flags, with its defaults."""
    g = p.add_argument_group("CORS")
    a = g.add_argument
    a(
        "--cors-origins",
        metavar="ORIGINS",
        help="allowed origins, comma-separated; 'localhost' echoes only a localhost Origin "
        "(default: %(default)s)",
    )
    a("--cors-methods", metavar="METHODS", help="allowed methods (default: %(default)s)")
    a("--cors-headers", metavar="HEADERS", help="allowed headers (default: %(default)s)")
    a(
        "--cors-credentials",
        action=argparse.BooleanOptionalAction,
        help="allow credentials, for a list of origins or 'localhost' only: never from any "
        "origin ('*') (default: %(default)s)",
    )


def add_embedding_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's embedding flags."""
    g = p.add_argument_group("embeddings and reranking")
    a = g.add_argument
    a("--embedding", "--embeddings", action="store_true", help="enable the embedding endpoints")
    a("--reranking", "--rerank", action="store_true", help="enable /rerank (pooling rank)")
    a(
        "--pooling",
        choices=[str(x) for x in Pooling],
        help="pooling of embeddings (default: the model's, else none)",
    )
