"""Eight actors at full speed against a deliberately slow learner: memory and queues stay bounded, and the
metrics show where the back-pressure is. ``flywheel bench reliability`` runs the same for minutes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.services.learner.sampling import batches_per_request
from flywheel.testing.load import MAX_PENDING, load_cluster, run_load, summarize

pytestmark = [pytest.mark.system, pytest.mark.timeout(420)]


def test_eight_actors_against_a_slow_learner_stay_bounded(tmp_path: Path) -> None:
    cluster = load_cluster(tmp_path, actors=8, envs=8, tight=True)
    try:
        run = run_load(cluster, 50.0, progress=print)
    finally:
        codes = cluster.stop()
    figures = summarize(run)
    print(json.dumps(figures, indent=1))
    assert all(code == 0 for code in codes.values()), codes
    # Memory: no process grows from the first half of the run to the second by more than a little.
    for name in run.names:
        first, second = figures[f"rss_first_half_max_mib.{name}"], figures[f"rss_second_half_max_mib.{name}"]
        assert second <= first * 1.15 + 64, (name, first, second)
    # Queues: bounded by their settings.
    assert figures["replay_pending_max"] <= MAX_PENDING
    group = batches_per_request(0, 512, (4,))  # training batches per reply (the learner's auto grouping)
    assert figures["learner_in_flight_max"] <= 4 and figures["learner_batches_waiting_max"] <= 2 * 4 * group
    # Back-pressure: the learner is the bottleneck (rarely waits for data); the replay's rate limiter holds
    # inserts back, so the blocking actors wait and the dropping ones drop, each counted.
    assert figures["updates_per_s"] > 0 and figures["learner_data_wait_share"] < 0.5
    assert figures["replay_insert_wait_share"] > 0.3
    assert figures["actor_blocked_share"] > 0.3 and figures["actor_dropped_per_s"] > 0
    assert figures["inserts_per_s"] < figures["env_steps_per_s"]
    # What travels between actors and replay is bounded: high-water marks and kernel buffers, per actor.
    assert figures["in_flight_second_half_max"] <= 8 * 2000
