"""Flywheel's four services: actor, replay, learner and gateway."""
