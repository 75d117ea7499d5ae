"""The learner over real ZeroMQ sockets against a tiny fake replay, telemetry sink and control publisher."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from learner_helpers import make_batch

from flywheel import proto
from flywheel.nets import build_q_network, load_weights
from flywheel.services.learner.checkpoint import CHECKPOINT_FILE, load_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore


def test_trains_keeps_requests_in_flight_and_sends_priorities(harness) -> None:
    h = harness()
    h.loop.start()
    h.drive(lambda: h.core.updates >= 20 and len(h.replay.priorities) >= 2)
    assert h.loop.group == 32  # auto: 32 batches of 32 per request for vectors (~4096 transitions, at most 32)
    assert h.replay.max_pending == 3  # requests_in_flight, never more
    sent = np.concatenate(list(h.replay.sent_index.values()))
    for update in h.replay.priorities:  # each message: whole training batches of one or more requests
        assert update.priority.dtype == np.float32 and np.isfinite(update.priority).all()
        assert (update.priority >= 0).all() and len(update.index) % 32 == 0
        assert np.isin(update.index, sent).all()
    h.drive(lambda: len(set(h.versions)) >= 5)
    distinct = [v for i, v in enumerate(h.versions) if i == 0 or v != h.versions[i - 1]]
    assert distinct[0] == 1
    assert all(b > a for a, b in zip(distinct, distinct[1:], strict=False))
    net = build_q_network((4,), 2)
    load_weights(net, h.weights[-1], "mlp-4-2-dueling")


def test_telemetry_reports_contract_metrics(harness) -> None:
    h = harness()
    h.loop.start()
    h.drive(lambda: h.counter("updates_total") >= 10)
    last = h.reports[-1]
    assert (last.service, last.instance) == ("learner", "learner-test")
    for name in ("updates_total", "samples_total", "weights_published_total", "messages_rejected_total"):
        assert name in last.counters
    for name in ("loss", "td_error_mean", "q_mean", "updates_per_second", "data_wait_ratio", "weight_version",
                 "beta", "lr"):
        assert name in last.gauges, name
    assert 0.0 <= last.gauges["data_wait_ratio"] <= 1.0
    assert last.counters["samples_total"] == 32 * last.counters["updates_total"]
    assert last.info["network"] == "mlp-4-2-dueling"


def test_control_pause_resume_set_and_checkpoint(harness, tmp_path: Path) -> None:
    h = harness()
    h.loop.start()
    h.drive(lambda: h.core.updates >= 3)
    h.send_control("set_lr", lr=5e-4)
    h.send_control("set_publish_interval", updates=2)
    h.drive(lambda: h.core.lr == pytest.approx(5e-4) and h.loop.publish_interval == 2)
    h.drive(lambda: bool(h.reports) and h.reports[-1].gauges["lr"] == pytest.approx(5e-4))
    h.send_control("pause")
    h.drive(lambda: h.loop.paused)
    frozen = h.core.updates
    deadline = time.monotonic() + 0.5
    h.drive(lambda: time.monotonic() > deadline)
    assert h.core.updates == frozen
    assert h.reports[-1].info["state"] == "paused"
    h.send_control("resume")
    h.drive(lambda: h.core.updates >= frozen + 5)
    h.send_control("set_lr", lr="fast")  # wrong type: counted, ignored
    h.send_control("set", lr=1e-3)  # the generic form is gone: an unknown command, counted, ignored
    h.drive(lambda: h.loop.faults.total >= 2)
    h.drive(lambda: h.loop.faults.total >= 1)
    assert h.core.lr == pytest.approx(5e-4)
    h.send_control("checkpoint")
    h.drive(lambda: (tmp_path / CHECKPOINT_FILE).exists())


def test_control_is_read_by_the_loop_from_its_socket_not_by_the_sampling_thread(harness) -> None:
    h = harness()  # not started: no sampling thread runs, no request goes out
    h.send_control("set_lr", lr=7e-4)
    h.send_control("pause")
    h.drive(lambda: h.core.lr == pytest.approx(7e-4) and h.loop.paused)
    assert h.replay.requests == 0 and h.loop.feeder.delivered == 0


def test_bad_replies_are_counted_and_dropped(harness) -> None:
    h = harness()
    h.loop.start()
    h.drive(lambda: h.core.updates >= 2)
    h.replay.answer = False
    h.drive(lambda: len(h.replay.pending) == 3)
    identity, _ = h.replay.pending.pop()
    h.replay.sock.send_multipart([identity, b"\x93garbage"])
    identity, req = h.replay.pending.pop()
    wrong = make_batch(h.replay.rng, 32, obs_shape=(5,), request_id=req.request_id)
    h.replay.sock.send_multipart([identity, *proto.encode(wrong)])
    h.drive(lambda: h.loop.faults.total >= 2)
    h.replay.answer = True
    before = h.core.updates
    h.drive(lambda: h.core.updates >= before + 5 and h.counter("messages_rejected_total") >= 2)
    assert h.replay.max_pending <= 3


def test_unanswered_requests_are_resent_after_the_timeout(harness) -> None:
    h = harness(request_timeout_s=0.3)
    h.replay.answer = False
    h.loop.start()
    h.drive(lambda: h.replay.requests >= 6)
    assert h.core.updates == 0


def test_max_updates_checkpoint_and_resume_continue_versions(harness, tmp_path: Path) -> None:
    h = harness(max_updates=12)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(h.loop.run()))
    thread.start()
    deadline = time.monotonic() + 20
    while thread.is_alive() and time.monotonic() < deadline:
        h.replay.pump()
        h.collect()
        time.sleep(0.002)
    thread.join(timeout=5)
    assert codes == [0]
    saved = load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig()))
    assert saved.updates == 12 and saved.weight_version == h.loop.version >= 3
    h2 = harness(resume=True, max_updates=0)
    assert h2.core.updates == 12
    h2.loop.start()
    h2.drive(lambda: len(h2.versions) >= 1)
    assert h2.versions[0] == saved.weight_version + 1
