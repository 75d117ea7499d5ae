"""The acting loop over real sockets: rows out, control commands (good, bad, unknown, garbage), telemetry, stops."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import zmq
from test_actor_core import make_core

from flywheel import proto
from flywheel.services.actor.core import ActorCore
from flywheel.services.actor.exploration import Exploration, apex_epsilons
from flywheel.services.actor.loop import ActorLoop
from flywheel.services.actor.transport import LeaseClient, TransitionSender, WeightsReceiver
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, queued_frames

DEADLINE_S = 15.0


@dataclass
class Rig:
    loop: ActorLoop
    core: ActorCore
    faults: FaultCounter
    control: zmq.Socket  # PUB: what the gateway would send
    rows: zmq.Socket  # PULL: what replay would receive
    reports: zmq.Socket  # PULL: what the gateway would collect
    seq: int = 0

    def command(self, name: str, **args: Any) -> list[bytes]:
        self.seq += 1
        return proto.encode(proto.Control(seq=self.seq, command=name, target="actor", args=args))

    def drive(self, until: Callable[[], bool], resend: Sequence[list[bytes]] = ()) -> None:
        """Turn the loop until ``until``; ``resend`` is published every turn (PUB/SUB join race; dropped by seq)."""
        deadline = time.monotonic() + DEADLINE_S
        while not until():
            assert time.monotonic() < deadline, "condition not reached in time"
            for frames in resend:
                self.control.send_multipart(frames)
            self.loop.step()

    def received_rows(self) -> int:
        return sum(len(proto.decode(frames, proto.TransitionBatch)) for frames in queued_frames(self.rows))

    def last_report(self) -> proto.Telemetry | None:
        last = None
        for frames in queued_frames(self.reports):
            last = proto.decode(frames, proto.Telemetry)
        return last


@pytest.fixture
def rig() -> Iterator[Rig]:
    ctx = zmq.Context()
    socks = {name: ctx.socket(kind) for name, kind in (("control", zmq.PUB), ("rows", zmq.PULL),
                                                       ("reports", zmq.PULL), ("weights", zmq.PUB),
                                                       ("lease", zmq.ROUTER))}
    for name, sock in socks.items():
        sock.bind(f"inproc://{name}")
    core = make_core(num_envs=2)
    faults = FaultCounter("actor")
    loop = ActorLoop(
        core, faults=faults, exploration=Exploration(None, 0.4, 7.0), info={"env_id": "CartPole-v1"},
        sender=TransitionSender(ctx, "inproc://rows", "actor-t", hwm=1000, on_full="block", batch_rows=8),
        weights=WeightsReceiver(ctx, "inproc://weights", core.policy, faults),
        lease=LeaseClient(ctx, "inproc://lease", "actor-t", faults),  # never answered: actor 0 of 1
        control=ControlSubscriber(ctx, "inproc://control", "actor", "actor-t", faults),
        telemetry=TelemetryReporter(ctx, "inproc://reports", "actor", "actor-t", interval_s=0.02))
    loop.set_epsilon()
    try:
        yield Rig(loop, core, faults, socks["control"], socks["rows"], socks["reports"])
    finally:
        loop.close()
        for sock in socks.values():
            sock.close(0)
        ctx.term()
        core.close()


def test_acts_obeys_control_and_refuses_bad_commands_without_stopping(rig: Rig) -> None:
    loop, core = rig.loop, rig.core
    np.testing.assert_allclose(core.epsilons, apex_epsilons(0, 1, 2))  # no lease: the whole schedule alone
    rig.drive(lambda: core.env_steps >= 40)
    bad = rig.command("set_exploration", epsilon=2.0)
    unknown = rig.command("launch")
    good = rig.command("set_exploration", epsilon=0.05)
    rig.drive(lambda: bool(core.epsilons[0] == 0.05), resend=[bad, unknown, good])
    np.testing.assert_array_equal(core.epsilons, [0.05, 0.05])
    assert rig.faults.counts["control:bad_args"] == 1 and rig.faults.counts["control:unknown_command"] == 1
    assert loop.control.rejected == 2 and loop.running
    rig.control.send_multipart([b"\x93garbage"])  # not even a message: counted as malformed
    rig.drive(lambda: rig.faults.counts["control:malformed"] == 1)

    pause = rig.command("pause")
    rig.drive(lambda: loop.paused, resend=[pause])
    frozen = core.env_steps
    reports: list[proto.Telemetry] = []

    def paused_report() -> bool:
        report = rig.last_report()
        if report is not None and report.gauges["paused"] == 1.0:
            reports.append(report)
        return bool(reports)

    rig.drive(paused_report)
    assert core.env_steps == frozen
    counters, gauges = reports[0].counters, reports[0].gauges
    assert counters['rejected_total{where="control",reason="bad_args"}'] == 1  # the one label, in telemetry
    assert counters['rejected_total{where="control",reason="unknown_command"}'] == 1
    assert gauges["epsilon_max"] == 0.05 and reports[0].info["env_id"] == "CartPole-v1"
    # the time split, under its telemetry names; no clips filmed, so no clip counters
    assert counters["env_seconds_total"] > 0 and counters["inference_seconds_total"] > 0
    assert counters["bookkeeping_seconds_total"] > 0 and counters["env_steps_total"] == frozen
    assert "clips_sent_total" not in counters and counters["telemetry_dropped_total"] >= 0

    resume, schedule = rig.command("resume"), rig.command("set_exploration", base=0.5)
    rig.drive(lambda: not loop.paused and core.env_steps >= frozen + 40, resend=[resume, schedule])
    np.testing.assert_allclose(core.epsilons, apex_epsilons(0, 1, 2, base=0.5))  # back to the schedule
    rig.drive(lambda: rig.received_rows() > 0)


def test_run_stops_at_max_env_steps_and_close_flushes(rig: Rig) -> None:
    rig.loop.max_env_steps = 30
    assert rig.loop.run() == 0
    assert 30 <= rig.core.env_steps < 30 + 2 * 2
    sender = rig.loop.sender
    sent, buffered = sender.sent, sender.buffered
    deadline = time.monotonic() + DEADLINE_S
    got = 0
    while got < sent and time.monotonic() < deadline:
        got += rig.received_rows()
    assert got == sent > 0  # 8 rows a message: what was sent arrived; the rest waits in the buffer
    rig.loop.close()
    assert sender.sent == sent + buffered and not sender.buffer and sender.dropped == 0
    rig.loop.close()  # twice is harmless


def test_run_returns_1_when_an_environment_fails(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[Any]:
        raise RuntimeError("env worker 1 died")

    monkeypatch.setattr(rig.core, "step", broken)
    assert rig.loop.run() == 1


def test_stop_ends_the_run_after_the_turn(rig: Rig) -> None:
    turns = 0
    original = rig.loop.step

    def counted() -> None:
        nonlocal turns
        turns += 1
        original()
        if turns == 3:
            rig.loop.stop()

    rig.loop.step = counted  # type: ignore[method-assign]
    assert rig.loop.run() == 0 and turns == 3



def test_wait_for_weights_holds_the_first_step_until_the_learners_weights_load(rig: Rig) -> None:
    """flywheel run's actors (actor.first_weights_wait_s): no row before the learner's first weights, which load."""
    from flywheel.nets import build_q_network, weights_message

    first = weights_message(build_q_network((4,), 2, dueling=True, hidden=32), 1, rig.core.policy.name)
    ctx = rig.control.context
    learner = ctx.socket(zmq.PUB)
    learner.bind("inproc://first-weights")
    rig.loop.weights.close()  # the rig's receiver, replaced by one that hears this test's publisher
    rig.loop.weights = WeightsReceiver(ctx, "inproc://first-weights", rig.core.policy, rig.faults)
    try:
        began = time.monotonic()
        assert not rig.loop.wait_for_weights(0.3)  # nobody publishes: the wait ends at its bound and says so
        assert time.monotonic() - began >= 0.3 and rig.core.env_steps == 0 and rig.received_rows() == 0
        deadline = time.monotonic() + DEADLINE_S
        while not rig.loop.wait_for_weights(0.1):  # PUB/SUB join: publish until the actor's SUB hears it
            assert time.monotonic() < deadline, "the weights never loaded"
            learner.send_multipart(proto.encode(first))
        assert rig.loop.weights.version == 1 and rig.core.env_steps == 0 and rig.received_rows() == 0
        loaded = rig.core.policy.state_dict()
        assert all(np.array_equal(loaded[k], first.tensors[k]) for k in first.tensors)
    finally:
        learner.close(0)
