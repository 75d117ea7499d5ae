"""Shared-memory segments are bounded in count and bytes: clients beyond the bound are answered over the socket."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zmq
from replay_helpers import make_core, running_server, transitions, wait_for

from flywheel import proto
from flywheel.services.replay.settings import ReplaySettings
from flywheel.services.replay.shm import ShmFull, ShmSlots

CLIENTS = 25  # the probe: 25 loopback identities, each asking for shared memory


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("flywheel-replay-*"))


def test_the_defaults_leave_room_for_one_learner_and_a_spare() -> None:
    settings = ReplaySettings()
    assert 2 <= settings.shm_max_clients <= 8 and settings.shm_max_mb <= 8192


def test_twenty_five_loopback_identities_get_at_most_max_clients_segments(tmp_path: Path) -> None:
    shm = ShmSlots(directory=tmp_path, max_clients=4)
    core = make_core(64)
    with running_server(core, shm=shm) as rs:
        push = rs.ctx.socket(zmq.PUSH)
        push.connect(rs.transitions)
        push.send_multipart(proto.encode(transitions(0, 32)))
        wait_for(lambda: core.size == 32, "insert")
        dealers = []
        try:
            for n in range(CLIENTS):
                dealer = rs.ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.IDENTITY, f"client-{n}".encode())
                dealer.connect(rs.sample)
                dealers.append(dealer)
                dealer.send_multipart(proto.encode(proto.SampleRequest(n, 8, shm=True, slots=16)))
            offered = 0
            for dealer in dealers:
                assert dealer.poll(10_000), "no reply from replay"
                reply = proto.decode(dealer.recv_multipart(), proto.SampleBatch)
                assert reply.obs.shape == (8, 4)  # every client is served: over the socket when not offered memory
                offered += bool(reply.shm.get("segment"))
            assert offered == 4 and len(shm.clients) == 4 and len(segments(tmp_path)) == 4
            assert rs.faults.counts["sample:shm_full"] == CLIENTS - 4
            # A client that goes back to the socket frees its segment: the next one asking gets one.
            holder = next(d for d in dealers if d.getsockopt(zmq.IDENTITY) in shm.clients)
            holder.send_multipart(proto.encode(proto.SampleRequest(100, 8)))
            assert holder.poll(10_000)
            holder.recv_multipart()
            waiting = next(d for d in dealers if d.getsockopt(zmq.IDENTITY) not in shm.clients and d is not holder)
            waiting.send_multipart(proto.encode(proto.SampleRequest(101, 8, shm=True)))
            assert waiting.poll(10_000)
            assert proto.decode(waiting.recv_multipart(), proto.SampleBatch).shm.get("segment")
            assert len(segments(tmp_path)) == 4
        finally:
            for sock in (push, *dealers):
                sock.close(0)
    assert segments(tmp_path) == []  # closing the replay removes what it made


def test_a_segment_that_would_pass_max_bytes_is_not_made(tmp_path: Path) -> None:
    shm = ShmSlots(directory=tmp_path, max_clients=8, max_bytes=1 << 20)
    small = shm.segment_for(b"learner", 8, (4, 84, 84), np.dtype(np.uint8), 2)  # 2 slots of 8 Mario stacks: 0.9 MB
    assert small is not None
    with pytest.raises(ShmFull, match="SHM_MAX_MB"):
        shm.segment_for(b"greedy", 8192, (4, 84, 84), np.dtype(np.uint8), 16)  # 7.4 GB asked for
    with pytest.raises(ShmFull):
        shm.segment_for(b"second", 8, (4, 84, 84), np.dtype(np.uint8), 2)  # would pass 1 MiB in all
    assert list(shm.clients) == [b"learner"] and segments(tmp_path) == [tmp_path / small.name]
    # The client holding one may still grow it within the bound (its old segment no longer counts).
    grown = shm.segment_for(b"learner", 9, (4, 84, 84), np.dtype(np.uint8), 2)
    assert grown is not None and grown.name != small.name and segments(tmp_path) == [tmp_path / grown.name]
    shm.close()
