"""The replay service."""
