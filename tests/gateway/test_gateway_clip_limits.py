"""Clip pieces a peer can send cannot make the gateway hold more than its caps: a clip's piece count must be
ceil(total / CLIP_CHUNK_BYTES), every piece the length the actor sends, no index twice, and every clip in flight
together holds at most clip_buffer_bytes (the oldest other clip in flight gives way). Every refusal is counted."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
import zmq
from conftest import gateway_settings
from fastapi.testclient import TestClient
from gateway_helpers import check_exposition, wait_for

from flywheel import proto
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.services.gateway.clips import ClipAssembler, ClipRejected
from flywheel.services.gateway.settings import GatewaySettings

SIZE = proto.CLIP_CHUNK_BYTES
MIB = 1 << 20


def piece(index: int, count: int, total: int, *, clip: int = 1, nbytes: int | None = None,
          instance: str = "actor-0", version: int = 7) -> proto.ClipChunk:
    n = min(SIZE, total - index * SIZE) if nbytes is None else nbytes
    return proto.ClipChunk(instance, clip, index, count, total, version, "CartPole-v1", 50.0, 20, 19.0, 19, -1.0, False,
                           time.time(), np.full(n, index % 251, np.uint8))


def held(clips: ClipAssembler) -> int:
    """Bytes the clips in flight really hold (counted here, not trusted from the assembler)."""
    return sum(len(b) for p in clips._partial.values() for b in p.pieces.values())


def refused(clips: ClipAssembler, chunk: proto.ClipChunk) -> str:
    with pytest.raises(ClipRejected) as info:
        clips.add(chunk)
    return info.value.fault


def test_a_piece_count_that_does_not_fit_the_total_is_refused() -> None:
    clips = ClipAssembler()
    total = 3 * SIZE - 5  # the actor sends 3 pieces
    assert refused(clips, piece(0, 2000, total)) == "clip_count"  # the codec lets 2,000 pieces claim it
    assert refused(clips, piece(0, 4, total)) == "clip_count"
    assert not clips._partial and clips.held == 0
    for i in (2, 0):
        assert clips.add(piece(i, 3, total)) is None
    assert clips.add(piece(1, 3, total)) is not None and clips.held == 0


def test_duplicates_and_pieces_of_the_wrong_length_are_refused_and_never_pass_the_total() -> None:
    clips = ClipAssembler()
    total = 3 * SIZE - 5
    assert clips.add(piece(0, 3, total)) is None
    assert refused(clips, piece(0, 3, total)) == "clip_duplicate"
    assert refused(clips, piece(1, 3, total, nbytes=100)) == "clip_piece"  # a middle piece is a whole chunk
    assert refused(clips, piece(2, 3, total, nbytes=SIZE)) == "clip_piece"  # the last one is what is left
    assert refused(clips, piece(2, 3, total, nbytes=SIZE - 6)) == "clip_piece"
    assert held(clips) == clips.held == SIZE <= total
    assert clips.add(piece(2, 3, total)) is None
    whole = clips.add(piece(1, 3, total))
    assert whole is not None and len(whole.data) == total and clips.held == 0


def test_clips_in_flight_never_hold_more_than_the_buffer() -> None:
    clip_bytes = MIB  # 22 pieces
    count = -(-clip_bytes // SIZE)
    clips = ClipAssembler(max_bytes=MIB, max_partial=16, max_buffer_bytes=2 * MIB + SIZE)
    most = 0
    for index in range(count - 1):  # eight clips, all but their last pieces, interleaved
        for clip in range(8):
            clips.add(piece(index, count, clip_bytes, clip=clip))
            assert held(clips) == clips.held <= clips.max_buffer_bytes
            most = max(most, clips.held)
    assert most > 2 * MIB - SIZE and clips.dropped >= 6  # the buffer filled, the oldest clips gave way
    for index in range(count):  # a clip sent whole, as the actor sends one, still comes through
        whole = clips.add(piece(index, count, clip_bytes, clip=99))
        assert held(clips) == clips.held <= clips.max_buffer_bytes
    assert whole is not None and len(whole.data) == clip_bytes and clips.newest is whole


def test_the_buffer_setting_must_hold_a_whole_clip() -> None:
    assert GatewaySettings().clip_buffer_bytes == 64 * MIB
    with pytest.raises(ValueError, match="clip_buffer_bytes"):
        GatewaySettings(clip_buffer_bytes=MIB)
    with pytest.raises(ValueError, match="must hold one clip"):
        ClipAssembler(max_bytes=16 * MIB, max_buffer_bytes=MIB)


def test_a_flood_of_pieces_over_zeromq_stays_within_the_caps(zctx, caplog) -> None:
    """The flood of issue 26 (4 clips of far more pieces than their total needs) and clips of the right shape that
    never finish, over a real socket into a real gateway: the bytes held never pass clip_buffer_bytes."""
    caplog.set_level(logging.WARNING)
    settings = gateway_settings(clip_buffer_bytes=16 * MIB)
    service = GatewayService(settings)
    most: list[int] = [0]
    add = service.clips.add

    def watched(chunk: proto.ClipChunk) -> Any:
        try:
            return add(chunk)
        finally:
            most[0] = max(most[0], service.clips.held, held(service.clips))

    service.clips.add = watched  # type: ignore[method-assign]
    with TestClient(create_app(settings, service)) as client:
        push = zctx.socket(zmq.PUSH)
        push.connect(service.endpoints["telemetry"])
        total = 16 * MIB
        count = -(-total // SIZE)  # 1,366
        sent: Counter[str] = Counter()

        def send(chunk: proto.ClipChunk, kind: str) -> None:
            push.send_multipart(proto.encode(chunk))
            sent[kind] += 1

        for clip in range(4):  # 400 full pieces each of clips claiming more pieces than a 16 MiB clip needs
            for index in range(400):
                send(piece(index, count + 58, total, clip=clip, nbytes=SIZE), "clip_count")
        for clip in range(10, 13):  # three real-shaped 16 MiB clips, all but their last pieces: 48 MiB
            for index in range(count - 1):
                send(piece(index, count, total, clip=clip), "ok")
            send(piece(0, count, total, clip=clip), "clip_duplicate")
        wait_for(lambda: service.faults.total == sent["clip_count"] + sent["clip_duplicate"], timeout=60,
                 what="every refusal counted")
        faults = service.faults.counts
        assert faults["telemetry:clip_count"] == 1600 and faults["telemetry:clip_duplicate"] == 3
        assert most[0] <= 16 * MIB and service.clips.held == held(service.clips) <= 16 * MIB
        assert service.clips.dropped == 2 and service.clips.received == 0  # the newest clip in flight is kept
        text = client.get("/metrics").text
        check_exposition(text)
        assert 'socket="telemetry",fault="clip_count"} 1600' in text
        assert f'flywheel_gateway_clip_buffer_bytes{{service="gateway",instance="gw-test"}} {service.clips.held}' \
            in text
        assert client.get("/status").status_code == 200
        push.close(0)
    lines = [r.getMessage() for r in caplog.records]
    for kind in ("(clip_count)", "(clip_duplicate)", "pushed out"):
        assert sum(kind in line for line in lines) == 1, (kind, lines)
