"""One message cannot steer sampling: priorities above max_priority are stored as it and counted (core and sockets)."""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from replay_helpers import make_core, running_server, transitions, wait_for

from flywheel import proto
from flywheel.services.replay.core import ReplayCore
from flywheel.services.replay.settings import ReplaySettings

HUGE = float(np.finfo(np.float32).max)  # 3.4e38: the largest priority a float32 array carries
ROWS, TARGET, BATCH, DRAWS = 1000, 500, 256, 20


def ordinary(count: int, seed: int = 0) -> np.ndarray:
    """Priorities around 1, as TD errors of a learning network are."""
    return np.random.default_rng(seed).uniform(0.5, 1.5, count).astype(np.float32)


def share_of(core: ReplayCore, index: int) -> float:
    """The share of ``DRAWS`` batches of ``BATCH`` rows that is the row at ``index``."""
    hits = sum(int(np.count_nonzero(core.sample(BATCH, beta=0.4).index == index)) for _ in range(DRAWS))
    return hits / (BATCH * DRAWS)


def test_the_default_cap_bounds_one_row_to_a_few_percent_of_a_batch() -> None:
    settings = ReplaySettings()
    cap_share = (settings.max_priority ** settings.alpha) / (settings.max_priority ** settings.alpha + ROWS - 1)
    assert cap_share < 0.07  # 63x a row of priority 1 at alpha 0.6: 5.9% of a batch among 1,000 such rows


def test_one_huge_actor_priority_takes_at_most_a_tenth_of_a_batch_and_is_counted() -> None:
    core = make_core(ROWS)
    priority = ordinary(ROWS)
    priority[TARGET] = HUGE
    core.insert(transitions(0, ROWS, priority=priority))
    assert share_of(core, TARGET) <= 0.10
    assert core.priorities_clamped == 1
    # New rows without a priority get the largest stored one: no higher than the cap either.
    core.insert(transitions(ROWS, 1, seq=1))
    cap = (core.config.max_priority + core.config.priority_eps) ** core.config.alpha
    assert core.max_priority == pytest.approx(cap) and core.tree is not None
    assert core.tree.get(np.array([0]))[0] == pytest.approx(cap)  # slot 0 now holds the new row


def test_one_huge_learner_priority_takes_at_most_a_tenth_of_a_batch_and_is_counted() -> None:
    core = make_core(ROWS)
    core.insert(transitions(0, ROWS, priority=ordinary(ROWS)))
    update = proto.PriorityUpdate(index=np.array([TARGET], np.int64), priority=np.array([HUGE], np.float32))
    assert core.update_priorities(update.index, update.priority) == 1
    assert share_of(core, TARGET) <= 0.10
    assert core.priorities_clamped == 1
    assert core.max_priority <= (core.config.max_priority + core.config.priority_eps) ** core.config.alpha


def test_a_checkpoint_with_huge_priorities_is_held_to_the_cap() -> None:
    core = make_core(ROWS, max_priority=float("inf"))  # a replay of before the cap, or with a higher one
    priority = ordinary(ROWS)
    priority[TARGET] = HUGE
    core.insert(transitions(0, ROWS, priority=priority))
    restored = make_core(ROWS)
    restored.load_state_dict(core.state_dict())  # type: ignore[arg-type]
    assert share_of(restored, TARGET) <= 0.10
    assert restored.max_priority <= (restored.config.max_priority + 1e-6) ** restored.config.alpha


def test_the_replay_server_clamps_priorities_from_both_sockets() -> None:
    """Real PUSH and DEALER sockets: an actor's huge first priority and a learner's huge update both land capped."""
    core = make_core(ROWS, min_size_to_sample=ROWS)
    with running_server(core) as rs:
        ctx = rs.ctx
        push, learner = ctx.socket(zmq.PUSH), ctx.socket(zmq.DEALER)
        try:
            push.connect(rs.transitions)
            learner.connect(rs.sample)
            priority = ordinary(ROWS)
            priority[TARGET] = HUGE
            push.send_multipart(proto.encode(transitions(0, ROWS, priority=priority)))
            wait_for(lambda: rs.server.counters.transitions_received_total == ROWS, "insert")
            learner.send_multipart(proto.encode(proto.PriorityUpdate(
                index=np.array([TARGET + 1], np.int64), priority=np.array([HUGE], np.float32))))
            wait_for(lambda: rs.server.counters.priority_updates_total == 1, "priority update")
            hits = 0
            for request_id in range(DRAWS):
                learner.send_multipart(proto.encode(proto.SampleRequest(request_id, BATCH, 0.4)))
                assert learner.poll(10_000), "no reply from replay"
                reply = proto.decode(learner.recv_multipart(), proto.SampleBatch)
                hits += int(np.count_nonzero(np.isin(reply.index, [TARGET, TARGET + 1])))
            assert hits / (BATCH * DRAWS) <= 0.2  # two capped rows: at most a tenth of a batch each
            assert core.priorities_clamped == 2
        finally:
            push.close(0)
            learner.close(0)
