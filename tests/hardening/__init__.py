"""Hardening over HTTP: auth on every route, limits, fuzz, schema, load, stalls, shutdown."""
