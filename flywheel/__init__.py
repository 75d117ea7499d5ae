"""Flywheel: distributed Ape-X deep Q-learning over ZeroMQ."""

__version__ = "0.1.0"
