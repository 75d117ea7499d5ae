"""The actor service."""
