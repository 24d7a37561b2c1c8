"""Vertex AI's prediction protocol (`AIP_MODE=PREDICTION`)."""
