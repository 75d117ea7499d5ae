"""The learner service's cadence and numbers: publishing by time, set_publish_interval, data wait, metric reads."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from flywheel import proto


def _distinct(versions: list[int]) -> list[int]:
    return [v for i, v in enumerate(versions) if i == 0 or v != versions[i - 1]]


def test_publishes_by_time_only_while_training(harness) -> None:
    h = harness(publish_interval_updates=1_000_000, publish_interval_s=0.3, weights_republish_s=0.1)
    h.loop.start()
    h.drive(lambda: len(_distinct(h.versions)) >= 3, timeout=20)
    assert _distinct(h.versions)[:3] == [1, 2, 3]
    assert h.core.steps < 1_000_000
    h.replay.answer = False  # no more batches: the last trained weights go out once, then only repeats
    h.drive(lambda: len(h.replay.pending) == 3 and h.loop.waiting_batches == 0, timeout=10)
    trained = h.core.steps
    h.drive(lambda: h.loop.snapshots.steps_at_last == trained, timeout=5)
    latest = h.loop.version
    deadline = time.monotonic() + 1.0
    h.drive(lambda: time.monotonic() > deadline)
    assert h.loop.version == latest
    assert h.versions[-1] == latest and h.versions.count(latest) >= 2  # re-sent for late subscribers


def test_publishes_the_acting_average_where_the_learner_keeps_one(harness) -> None:
    h = harness(publish_interval_updates=4, publish_interval_s=0, acting_ema=0.05)
    h.loop.start()
    h.drive(lambda: h.core.steps >= 20 and h.loop.version >= 5)
    h.replay.answer = False  # no more batches: the last trained weights go out, then only repeats
    h.drive(lambda: len(h.replay.pending) == 3 and h.loop.waiting_batches == 0, timeout=10)
    trained = h.core.steps
    h.drive(lambda: h.loop.snapshots.steps_at_last == trained and h.versions[-1] == h.loop.version, timeout=5)
    last = h.weights[-1]
    for key, value in h.core.acting.state_dict().items():
        np.testing.assert_array_equal(last.tensors[key], value.numpy())
    online = h.core.online.state_dict()
    assert any(not np.array_equal(last.tensors[key], online[key].numpy()) for key in online)


def test_publishes_every_k_updates_with_strictly_increasing_versions(harness) -> None:
    h = harness(publish_interval_updates=4, publish_interval_s=0)
    h.loop.start()
    h.drive(lambda: h.core.steps >= 20 and h.loop.version >= 6)
    distinct = _distinct(h.versions)
    assert distinct == list(range(1, len(distinct) + 1))
    assert h.loop.version == 1 + h.core.steps // 4  # version 1 at start, then one per 4 updates


def test_set_publish_interval_is_validated_applied_and_logged(harness, caplog: pytest.LogCaptureFixture) -> None:
    h = harness()
    h.loop.start()
    with caplog.at_level(logging.INFO, logger="flywheel.learner"):
        h.send_control("set_publish_interval", updates=3, seconds=0.5)
        h.drive(lambda: h.loop.snapshots.every_updates == 3)
    assert h.loop.snapshots.every_seconds == 0.5
    assert any("publishing weights every 3 updates / 0.5 s" in r.getMessage() for r in caplog.records)
    h.send_control("set_publish_interval", seconds=2)
    h.drive(lambda: h.loop.snapshots.every_seconds == 2.0)
    assert h.loop.snapshots.every_updates == 3  # the part not given stays
    bad = [{"updates": 0}, {"updates": True}, {"updates": 2.5}, {"seconds": -1.0}, {"seconds": float("inf")},
           {}, {"updates": 5, "bogus": 1}, {"updates": 5, "seconds": "soon"}]
    for args in bad:
        h.send_control("set_publish_interval", **args)
    h.drive(lambda: h.loop.control.rejected >= len(bad))
    assert (h.loop.snapshots.every_updates, h.loop.snapshots.every_seconds) == (3, 2.0)
    assert h.loop.faults.counts["control:bad_args"] == len(bad)
    h.send_control("set_lr", lr=2e-4)
    h.send_control("set_lr", rate=2e-4)
    h.send_control("launch")  # no such command
    h.drive(lambda: h.loop.control.rejected >= len(bad) + 2 and h.core.lr == pytest.approx(2e-4))
    assert h.loop.faults.counts["control:bad_args"] == len(bad) + 1
    assert h.loop.faults.counts["control:unknown_command"] == 1
    h.drive(lambda: h.counter("control_rejected_total") == len(bad) + 2)
    assert h.reports[-1].counters['rejected_total{where="control",reason="bad_args"}'] == len(bad) + 1


def test_the_lr_follows_its_schedule_until_a_set_lr_command(harness, caplog: pytest.LogCaptureFixture) -> None:
    h = harness(lr=1e-3, lr_final=1e-4, lr_decay_updates=40)
    h.loop.start()
    assert h.core.lr == pytest.approx(1e-3)
    h.drive(lambda: h.core.steps >= 20)
    # set before each update from the steps taken so far: after k updates, the k-th used step k-1's rate
    assert h.core.lr == pytest.approx(1e-3 + (1e-4 - 1e-3) * (h.core.steps - 1) / 40)
    h.drive(lambda: h.core.steps >= 45)
    assert h.core.lr == pytest.approx(1e-4)  # the end of the schedule, held
    with caplog.at_level(logging.INFO, logger="flywheel.learner"):
        h.send_control("set_lr", lr=5e-4)
        h.drive(lambda: h.core.lr == pytest.approx(5e-4))
    assert any("schedule is off from here" in r.getMessage() for r in caplog.records)
    steps = h.core.steps
    h.drive(lambda: h.core.steps >= steps + 5)
    assert h.core.lr == pytest.approx(5e-4) and not h.loop.lr_scheduled


def test_a_resumed_run_goes_on_where_its_lr_schedule_was(harness) -> None:
    schedule = {"lr": 1e-3, "lr_final": 1e-4, "lr_decay_updates": 40}
    h = harness(**schedule)
    h.loop.start()
    h.drive(lambda: h.core.steps >= 20)
    h.loop.finish()  # leaves its checkpoint
    h2 = harness(resume=True, **schedule)
    assert h2.core.steps == h.core.steps and h2.core.lr == pytest.approx(1e-3)  # the checkpoint keeps no rate
    h2.loop.start()
    assert h2.core.lr == pytest.approx(1e-3 + (1e-4 - 1e-3) * h.core.steps / 40)


def test_data_wait_is_measured_when_starved(harness) -> None:
    h = harness(telemetry_interval_s=0.2)
    h.replay.answer = False
    h.loop.start()
    start = len(h.reports)
    h.drive(lambda: len(h.reports) >= start + 3)
    last = h.reports[-1]
    assert last.gauges["data_wait_ratio"] > 0.5
    assert last.counters["data_wait_seconds_total"] > 0.3
    assert last.counters["updates_total"] == 0
    h.replay.answer = True
    h.drive(lambda: h.counter("updates_total") >= 20)
    for name in ("loss", "td_error_mean", "q_mean", "updates_per_second", "samples_per_second",
                 "weight_version", "publish_interval_updates"):
        assert name in h.reports[-1].gauges, name
    assert h.reports[-1].info["compile"] == "off" and h.reports[-1].info["precision"] == "fp32"


def test_metrics_are_read_from_the_device_every_n_updates(harness) -> None:
    h = harness(metrics_interval_updates=5, telemetry_interval_s=60)
    h.loop.start()
    h.drive(lambda: h.core.steps >= 12)
    h.replay.answer = False
    assert h.loop.window.batches == 10  # read at update 5 and 10, not per update
    assert h.core.drain_metrics().batches == h.core.steps - 10


def test_priorities_reach_the_replay_for_every_batch(harness) -> None:
    h = harness()
    h.loop.start()
    h.drive(lambda: h.core.steps >= 15)
    h.replay.answer = False
    h.drive(lambda: sum(len(u.index) for u in h.replay.priorities) >= 32 * h.core.steps)
    assert len(h.replay.priorities) < h.core.steps  # coalesced: one message per request's batches, not per batch
    indices = np.concatenate([u.index for u in h.replay.priorities])
    assert len(indices) == 32 * h.core.steps and len(np.unique(indices)) == len(indices)  # each batch once
    assert set(indices.tolist()) <= set(np.concatenate(list(h.replay.sent_index.values())).tolist())


def test_one_batch_per_request_when_asked(harness) -> None:
    h = harness(batches_per_request=1)
    h.loop.start()
    assert h.loop.group == 1
    h.drive(lambda: h.core.steps >= 10 and sum(len(u.index) for u in h.replay.priorities) >= 320)
    assert all(len(sent) == 32 for sent in h.replay.sent_index.values())  # one training batch per request
    assert all(len(u.index) % 32 == 0 for u in h.replay.priorities)
    assert h.replay.max_pending == 3


def test_failed_sampling_stops_the_learner_with_a_checkpoint(harness, tmp_path, caplog) -> None:
    import threading

    from flywheel.services.learner.checkpoint import CHECKPOINT_FILE

    h = harness()

    def broken_check(batch: proto.SampleBatch) -> None:
        raise MemoryError("simulated failure while checking a batch")

    h.loop.feeder.check = broken_check
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(h.loop.run()))
    with caplog.at_level(logging.ERROR, logger="flywheel.learner"):
        thread.start()
        deadline = time.monotonic() + 20
        while thread.is_alive() and time.monotonic() < deadline:
            h.replay.pump()
            time.sleep(0.005)
        thread.join(timeout=5)
    assert codes == [1]
    assert any("sampling failed" in r.getMessage() and "simulated" in r.getMessage()
               for r in caplog.records)
    assert (tmp_path / CHECKPOINT_FILE).exists()
