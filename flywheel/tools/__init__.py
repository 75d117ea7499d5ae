"""The commands a user runs after training: ``flywheel eval``, ``export``, ``play``, and the end-of-run film."""
