"""Helpers for benchmark suites: peer measurements (run here or in a peer's own venv) and benchmark data."""
