"""What the replay refuses at its door and what its client refuses before expanding: out-of-range actions, batches
above max_batch_size, shared memory for peers of other hosts, compact batches that would expand past the limits."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zmq
from pydantic import ValidationError
from replay_helpers import make_core, running_server, transitions, wait_for

from flywheel import proto
from flywheel.proto.messages import SampleRefused
from flywheel.services.replay import main as replay_main
from flywheel.services.replay.client import ReplayClient, ReplayClientError
from flywheel.services.replay.settings import EnvContract, ReplaySettings, env_contract
from flywheel.services.replay.shm import ShmSlots, peer_is_local
from flywheel.services.replay.storage import SchemaMismatch
from flywheel.transport import FaultCounter, make_socket

DEADLINE_MS = 10_000


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)  # also when a test failed with sockets open


def reply_to(sock: zmq.Socket) -> proto.Message:
    assert sock.poll(DEADLINE_MS), "no reply from the replay"
    return proto.decode(sock.recv_multipart(), expect=(proto.SampleBatch, SampleRefused))


# ----------------------------------------------------------------------------------- 1. actions out of range

def test_out_of_range_actions_are_refused_at_the_door_and_nothing_else_lost(
        ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(64, num_actions=4)
    push = ctx.socket(zmq.PUSH)
    with caplog.at_level(logging.WARNING), running_server(core) as rs:
        push.connect(rs.transitions)
        good = dataclasses.replace(transitions(0, 8), action=np.arange(8, dtype=np.int64) % 4)
        push.send_multipart(proto.encode(good))
        for bad_action in (4, 1 << 40, -1):  # one row too high, far too high, negative: each batch refused whole
            action = good.action.copy()
            action[3] = bad_action
            push.send_multipart(proto.encode(dataclasses.replace(good, seq=1, action=action)))
        push.send_multipart(proto.encode(dataclasses.replace(good, seq=2)))
        wait_for(lambda: rs.server.counters.transitions_rejected_total == 3 and core.size == 16, "the batches")
        assert rs.faults.counts["transitions:action"] == 3 and rs.server.running
        assert int(core.storage.small(np.arange(core.size))["action"].max()) == 3
        assert rs.faults.as_counters()['rejected_total{where="transitions",reason="action"}'] == 3.0
    lines = [r.getMessage() for r in caplog.records if "(action)" in r.getMessage()]
    assert len(lines) == 1 and "outside 0..3" in lines[0]  # one line per kind of fault


def test_the_action_count_and_observations_come_from_the_env_id_or_num_actions() -> None:
    # as the learner finds them (env_spec)
    assert env_contract(ReplaySettings(env_id="CartPole-v1")) == EnvContract(2, (4,), "float32")
    assert env_contract(ReplaySettings(num_actions=7)) == EnvContract(7)
    assert env_contract(ReplaySettings(env_id="CartPole-v1", num_actions=2)).num_actions == 2
    assert env_contract(ReplaySettings()) == EnvContract()
    with pytest.raises(ValueError, match="disagrees with env_id 'CartPole-v1', which has 2 actions"):
        env_contract(ReplaySettings(env_id="CartPole-v1", num_actions=3))
    with pytest.raises(ValueError, match="replay env_id 'NoSuchGame-v9'"):
        env_contract(ReplaySettings(env_id="NoSuchGame-v9"))
    with pytest.raises(ValidationError):
        ReplaySettings(num_actions=-1)


def test_the_first_peer_cannot_choose_what_the_replay_stores(ctx: zmq.Context) -> None:
    """Without the env's observations a rogue's first batch fixes the replay's schema and every real actor's
    batch is refused after it; with them, the rogue's batch is the one refused."""
    core = make_core(64)
    core.expect_obs((4,), "float32")
    push = ctx.socket(zmq.PUSH)
    with running_server(core) as rs:
        push.connect(rs.transitions)
        push.send_multipart(proto.encode(transitions(0, 8, obs_shape=(3,))))  # another width
        push.send_multipart(proto.encode(transitions(0, 8, dtype="uint8")))  # another dtype
        push.send_multipart(proto.encode(transitions(1, 8)))  # the real actor's batch
        wait_for(lambda: core.size == 8 and rs.server.counters.transitions_rejected_total == 2, "the batches")
        assert rs.faults.counts["transitions:shape"] == 2 and core.obs_schema == ((4,), np.dtype("float32"))
    with pytest.raises(SchemaMismatch, match="the env gives"):
        core.expect_obs((84, 84), "uint8")  # a restored checkpoint of another env is refused at start


def test_the_replay_says_at_start_whether_actions_are_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert replay_main.main(ReplaySettings(env_id="NoSuchGame-v9")) == 2  # a clear error, before anything binds
    assert any("NoSuchGame-v9" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    monkeypatch.setattr(replay_main.ReplayServer, "run", lambda self: None)  # start, then stop at once
    monkeypatch.setattr(replay_main, "install_stop_signals", lambda stop: None)
    ends = {name: f"ipc://{tmp_path}/{name}" for name in ("transitions", "sample", "telemetry", "control")}
    for extra, wanted in (({}, "actions of stored transitions are unchecked"), ({"num_actions": 6}, "0..5"),
                          ({"env_id": "CartPole-v1"}, "actions 0..1, observations float32(4,)")):
        caplog.clear()
        settings = ReplaySettings(transitions_bind=ends["transitions"], sample_bind=ends["sample"],
                                  telemetry_endpoint=ends["telemetry"], control_endpoint=ends["control"], shm=False,
                                  **extra)
        with caplog.at_level(logging.INFO, logger="flywheel.replay"):
            assert replay_main.main(settings) == 0
        assert len([r for r in caplog.records if wanted in r.getMessage()]) == 1


# ------------------------------------------------------------------------------------------ 2. batch size

def test_requests_above_max_batch_size_get_a_refusal_and_the_rest_are_served(ctx: zmq.Context) -> None:
    core = make_core(128)
    core.insert(transitions(0, 100))
    learner = ctx.socket(zmq.DEALER)
    with running_server(core, max_batch_size=64) as rs:
        learner.connect(rs.sample)
        learner.send_multipart(proto.encode(proto.SampleRequest(1, 65)))
        learner.send_multipart(proto.encode(proto.SampleRequest(2, 64)))
        refused, served = reply_to(learner), reply_to(learner)
        assert isinstance(refused, SampleRefused) and refused.request_id == 1
        assert refused.reason == "batch_size" and refused.limit == 64 and "65 rows" in refused.detail
        assert isinstance(served, proto.SampleBatch) and served.request_id == 2 and served.obs.shape == (64, 4)
        assert rs.faults.counts["sample:batch_size"] == 1 and not rs.server.pending and rs.server.running


def test_a_client_asking_for_too_many_rows_stops_with_a_clear_error() -> None:
    core = make_core(128)
    core.insert(transitions(0, 100))
    faults = FaultCounter("learner")
    with running_server(core, max_batch_size=32) as rs, ReplayClient(rs.sample, 33, faults=faults) as client:
        with pytest.raises(ReplayClientError, match="refuses sample requests of 33 rows .*max_batch_size is 32"):
            client.poll(timeout_ms=DEADLINE_MS)  # not a wait of request_timeout_s: the refusal came back
        assert faults.counts["sample:batch_size"] >= 1


def test_max_batch_size_setting() -> None:
    assert ReplaySettings().max_batch_size == 8192  # above the learner's 512 and its ~4096-row vector requests
    for bad in (0, 65537):
        with pytest.raises(ValidationError, match="max_batch_size"):
            ReplaySettings(max_batch_size=bad)


# ------------------------------------------------------------------------------- 3. shared memory: local only

def other_address() -> str:
    """An address of this host that is not loopback (a peer connecting from it looks like another host's)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        address = probe.getsockname()[0]
    except OSError:
        address = "127.0.0.1"
    finally:
        probe.close()
    if address.startswith("127."):
        pytest.skip("this host has no non-loopback IPv4 address")
    return address


def test_shared_memory_is_offered_to_loopback_and_ipc_peers_only(ctx: zmq.Context, tmp_path: Path) -> None:
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    core = make_core(64)
    core.insert(transitions(0, 64))
    ask = proto.SampleRequest(1, 8, shm=True, slots=2)
    with running_server(core, shm=ShmSlots(directory=shm_dir)) as rs:
        remote = ctx.socket(zmq.DEALER)  # from this host's non-loopback address: as another host would
        remote.connect(f"tcp://{other_address()}:0;{rs.sample.removeprefix('tcp://')}")
        for request_id in (1, 2, 3):
            remote.send_multipart(proto.encode(dataclasses.replace(ask, request_id=request_id)))
            reply = reply_to(remote)
            assert isinstance(reply, proto.SampleBatch) and reply.obs.shape == (8, 4)  # served, over the socket
            assert reply.shm == {"refused": "peer"}
        assert rs.faults.counts["sample:shm_peer"] == 3 and rs.server.shm.clients == {}
        assert list(shm_dir.iterdir()) == []  # no /dev/shm file was made for it
        local = ctx.socket(zmq.DEALER)
        local.connect(rs.sample)
        local.send_multipart(proto.encode(ask))
        assert "segment" in reply_to(local).shm and len(list(shm_dir.iterdir())) == 1
    with running_server(core, sample_bind=f"ipc://{tmp_path}/sample.ipc", shm=ShmSlots(directory=shm_dir)) as rs:
        ipc = ctx.socket(zmq.DEALER)
        ipc.connect(rs.sample)
        ipc.send_multipart(proto.encode(ask))
        assert "segment" in reply_to(ipc).shm and rs.faults.counts["sample:shm_peer"] == 0


def test_a_remote_client_stays_on_tcp_or_stops_when_it_insists_on_shared_memory(tmp_path: Path) -> None:
    core = make_core(64)
    core.insert(transitions(0, 64))
    with running_server(core, shm=ShmSlots(directory=tmp_path)) as rs:
        endpoint = f"tcp://{other_address()}:0;{rs.sample.removeprefix('tcp://')}"
        with ReplayClient(endpoint, 8, inflight=2) as client:
            for _ in range(4):
                batch = client.poll(timeout_ms=DEADLINE_MS)
                assert batch is not None and batch.obs.shape == (8, 4)
                client.release(batch)
            assert client.shm_refused and client.path == "tcp" and client.counters.tcp_batches_total == 4
        assert rs.faults.counts["sample:shm_peer"] <= 2  # only the requests sent before the first answer
        with ReplayClient(endpoint, 8, inflight=1, transport="shm") as client:
            with pytest.raises(ReplayClientError, match="refuses shared memory to this peer"):
                client.poll(timeout_ms=DEADLINE_MS)
        assert rs.server.shm.clients == {} and list(tmp_path.iterdir()) == []


def test_which_peer_addresses_count_as_local() -> None:
    class Frame:
        def __init__(self, address: str) -> None:
            self.address = address

        def get(self, name: str) -> str:
            assert name == "Peer-Address"
            return self.address

    for address in ("127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1", "localhost:1000:1000:42"):
        assert peer_is_local(Frame(address)), address
    for address in ("192.0.2.7", "10.0.0.1", "::ffff:10.0.0.1", "fd00::2", "", "garbage"):
        assert not peer_is_local(Frame(address)), address
    assert not peer_is_local(b"identity")  # no metadata: not offered


# ----------------------------------------------------------------------- 4. compact batches: bounded expansion

class Unchecked(proto.SampleBatch):
    """Encodes without validating: what a broken or hostile replay could send."""

    def validate(self) -> None:
        pass


def compact(rows: int, refs: int, frame: tuple[int, int], *, packed: bool) -> proto.SampleBatch:
    """A compact reply of ``rows`` rows of ``refs`` stacked frames each, all from two flat frames."""
    fields = dict(
        request_id=1, replay_size=100, obs=np.empty((rows, 0), np.uint8), action=np.zeros(rows, np.int64),
        reward=np.zeros(rows, np.float32), discount=np.ones(rows, np.float32), next_obs=np.empty((rows, 0), np.uint8),
        index=np.arange(rows, dtype=np.int64), weight=np.ones(rows, np.float32),
        obs_idx=np.zeros((rows, refs), np.int64), next_idx=np.ones((rows, refs), np.int64))
    flat = np.zeros(frame, np.uint8)
    if not packed:
        return Unchecked(**fields, frames=np.stack([flat, flat + 1]))
    scratch = np.empty(proto.packing.pack_bound(flat.size), np.uint8)
    block = scratch[:proto.packing.pack_frame(flat, scratch)]  # 16 MiB of zeros: a 64 KiB block
    return Unchecked(**fields, packing={"codec": "lz4", "shape": f"{frame[0]},{frame[1]}"},
                     packed=np.concatenate([block, block]), packed_sizes=np.full(2, block.size, np.int64))


def test_a_compact_batch_that_would_expand_past_the_limit_fails_validation() -> None:
    huge = compact(64, 64, (4096, 4096), packed=True)  # ~200 KB on the wire, 128 GiB of stacks
    with pytest.raises(proto.OversizedMessage, match="expands to"):
        proto.SampleBatch.validate(huge)
    assert huge.expanded_bytes() == 2 * 64 * 64 * (4096 * 4096) + 2 * 4096 * 4096
    with pytest.raises(proto.OversizedMessage, match="expands to"):
        proto.SampleBatch.validate(compact(1024, 64, (1024, 1024), packed=False))
    proto.SampleBatch.validate(compact(4, 4, (84, 84), packed=True))  # a Mario-sized batch is fine


@contextmanager
def answering_router() -> Iterator[tuple[zmq.Socket, zmq.Context, str]]:
    """A bare ROUTER on a loopback port (``serve_until`` answers for it)."""
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    try:
        yield router, ctx, f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    finally:
        ctx.destroy(linger=0)


Reply = Callable[[proto.SampleRequest], proto.SampleBatch]


def serve_until(router: zmq.Socket, client: ReplayClient, replies: list[Reply], batches: int,
                ) -> list[proto.SampleBatch]:
    """Answer the n-th request with ``replies[n]`` (then the last again) until the client hands out ``batches``."""
    got: list[proto.SampleBatch] = []
    answered, deadline = 0, time.monotonic() + 20
    while len(got) < batches and time.monotonic() < deadline:
        client.top_up()
        while router.poll(10):
            frames = router.recv_multipart()
            request = proto.decode(frames[1:], expect=proto.SampleRequest)
            reply = replies[min(answered, len(replies) - 1)](request)
            router.send_multipart([frames[0], *proto.encode(dataclasses.replace(reply, request_id=request.request_id))])
            answered += 1
        if client.sock.poll(10) and (batch := client.receive()) is not None:
            got.append(batch)
            client.release(batch, refill=False)
    return got


def good(request: proto.SampleRequest) -> proto.SampleBatch:
    return compact(request.batch_size, 4, (8, 8), packed=True)


def test_the_client_refuses_replies_that_do_not_fit_before_expanding_and_goes_on() -> None:
    faults = FaultCounter("learner")
    limits = proto.Limits(max_total_bytes=1 << 20, max_array_bytes=1 << 20)
    replies = [
        lambda r: compact(64, 64, (4096, 4096), packed=True),  # 128 GiB of stacks: the proto bound
        lambda r: compact(r.batch_size + 1, 4, (8, 8), packed=True),  # more rows than asked for
        lambda r: compact(r.batch_size, 4, (16, 16), packed=False),  # frames of another shape
        lambda r: compact(r.batch_size, 4, (256, 256), packed=True),  # fits the proto bound, not this client's
        good,
    ]
    with answering_router() as (router, ctx, endpoint):
        with ReplayClient(endpoint, 4, inflight=1, ctx=ctx, faults=faults, limits=limits,
                          obs_shape=(4, 8, 8)) as client:
            got = serve_until(router, client, replies, 2)
            assert len(got) == 2 and got[0].obs.shape == (4, 4, 8, 8)  # the client went on asking
            assert client.counters.bad_replies == 4
    assert faults.counts["sample:oversized"] == 2 and faults.counts["sample:shape"] == 2


def test_running_out_of_memory_while_expanding_is_a_refused_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    expand = proto.SampleBatch.expand_frames
    calls = []

    def short_of_memory(self: proto.SampleBatch, scratch: np.ndarray | None = None) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("Unable to allocate 128. GiB")
        expand(self, scratch)

    monkeypatch.setattr(proto.SampleBatch, "expand_frames", short_of_memory)
    faults = FaultCounter("learner")
    with answering_router() as (router, ctx, endpoint), ReplayClient(endpoint, 4, inflight=1, ctx=ctx,
                                                                      faults=faults) as client:
        got = serve_until(router, client, [good], 1)
        assert len(got) == 1 and client.counters.bad_replies == 1 and client.outstanding <= 1
    assert faults.counts["sample:oversized"] == 1


# ------------------------------------------------------------------------- finite but absurd values

def test_finite_but_absurd_rewards_and_observations_are_refused() -> None:
    """A reward or float observation of 1e30 is finite, so it passed the NaN check; sampled, it overflowed the
    loss of every batch it landed in and the learner skipped every update from then on (found by the fuzz)."""
    from flywheel.services.replay.core import InsertRejected

    core = make_core(64)
    ok = transitions(0, 4)
    core.insert(dataclasses.replace(ok, reward=np.full(4, -1e6, np.float32)))  # at the bound: stored
    for bad in (dataclasses.replace(ok, reward=np.array([0, 1e30, 0, 0], np.float32)),
                dataclasses.replace(ok, obs=np.full_like(ok.obs, 3e38)),
                dataclasses.replace(ok, next_obs=np.full_like(ok.next_obs, -1e7))):
        with pytest.raises(InsertRejected, match="max_abs_value"):
            core.insert(bad)
    assert core.size == 4
    with pytest.raises(ValidationError):
        ReplaySettings(max_abs_value=0)
