"""Clips of the greedy policy: pieces put together (pure core), an actor's filmer sending a real CartPole episode
to a real gateway over ZeroMQ, served as /clip.mp4 and shown on the live page (headless Chromium)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import zmq
from gateway_helpers import FakeClock, gateway_env, http_get, start_gateway, wait_for
from test_gateway_live_page import Texts, chromium

from flywheel import proto
from flywheel.nets_numpy import NumpyQNetwork
from flywheel.services.actor.clips import ClipFilmer
from flywheel.services.gateway.clips import ClipAssembler, ClipRejected


def chunk(data: bytes, index: int, count: int, *, clip: int = 1, version: int = 7, total: int | None = None,
          instance: str = "actor-0") -> proto.ClipChunk:
    size = proto.CLIP_CHUNK_BYTES
    raw = np.frombuffer(data, dtype=np.uint8)[index * size:(index + 1) * size]
    return proto.ClipChunk(instance, clip, index, count, len(data) if total is None else total, version,
                           "CartPole-v1", 50.0, 20, 19.0, 19, -1.0, False, time.time(), raw)


def test_pieces_in_any_order_make_the_clip_and_bad_ones_are_refused() -> None:
    data = bytes(range(256)) * (proto.CLIP_CHUNK_BYTES * 5 // 512)  # two and a half pieces' worth: three pieces
    clips = ClipAssembler()
    assert clips.add(chunk(data, 2, 3)) is None and clips.add(chunk(data, 0, 3)) is None
    whole = clips.add(chunk(data, 1, 3))
    assert whole is not None and whole.data == data and clips.newest is whole and clips.received == 1
    assert whole.info()["bytes"] == len(data) and whole.info()["progress"] is None and whole.weight_version == 7
    clips.add(chunk(data, 0, 3, clip=2, version=8))
    with pytest.raises(ClipRejected, match="disagrees"):
        clips.add(chunk(data, 1, 3, clip=2, version=9))
    with pytest.raises(ClipRejected, match="larger than"):
        ClipAssembler(max_bytes=1000).add(chunk(data, 0, 3))
    with pytest.raises(proto.DecodeError):  # a piece that cannot hold its total is refused by the codec
        proto.decode(proto.encode(chunk(data, 0, 3, total=10**9)), proto.ClipChunk)


def test_the_newest_clip_is_of_the_newest_weights_then_the_last_sent() -> None:
    clips = ClipAssembler()
    newer = clips.add(chunk(b"x" * 10, 0, 1, clip=1, version=8))
    assert clips.add(chunk(b"x" * 10, 0, 1, clip=2, version=7)) is not None  # sent later, of older weights
    assert newer is not None and clips.newest is newer
    later = clips.add(chunk(b"x" * 10, 0, 1, clip=3, version=8))
    assert later is not None and clips.newest is later


def test_clips_in_flight_are_bounded_and_time_out() -> None:
    clock = FakeClock()
    clips = ClipAssembler(max_partial=2, timeout_s=10, clock=clock)
    data = b"x" * (proto.CLIP_CHUNK_BYTES + 1)
    for clip in (1, 2, 3):  # three unfinished clips: the oldest gives way
        clips.add(chunk(data, 0, 2, clip=clip))
        clock.t += 1
    assert clips.dropped == 1
    clock.t += 20  # the pieces stopped coming
    assert clips.add(chunk(data, 1, 2, clip=3)) is None and clips.dropped == 3 and clips.newest is None


def weights(version: int) -> proto.Weights:
    net = NumpyQNetwork((4,), 2, dueling=True, hidden=64, seed=3)
    return proto.Weights(version=version, network=net.name, tensors=net.state_dict())


class Acting:
    """What the filmer reads of an actor's WeightsReceiver: the message of the version acting now."""

    def __init__(self, msg: proto.Weights) -> None:
        self.acting = msg


@pytest.mark.system
def test_an_actor_films_cartpole_and_the_live_page_plays_it(tmp_path: Path) -> None:
    proc, url, telemetry = start_gateway(gateway_env(), tmp_path / "gw.log")
    ctx = zmq.Context()
    filmer = None
    try:
        def up() -> bool:
            try:
                return http_get(url + "/healthz", timeout=1)[0] == 200
            except OSError:
                return False

        wait_for(lambda: proc.poll() is None and up(), timeout=60, what="the gateway")
        status, body = http_get(url + "/clip.mp4")
        assert status == 404 and "no clip yet" in json.loads(body)["error"]
        assert json.loads(http_get(url + "/status")[1])["clip"] is None

        filmer = ClipFilmer(ctx, telemetry, "actor-0", "CartPole-v1", Acting(weights(12)),
                            lambda: NumpyQNetwork((4,), 2, dueling=True, hidden=64), interval_s=0.2,
                            max_steps=60).start()
        info = wait_for(lambda: json.loads(http_get(url + "/status")[1])["clip"], timeout=60, what="a clip")
        assert info["instance"] == "actor-0" and info["weight_version"] == 12 and info["env_id"] == "CartPole-v1"
        assert info["fps"] == 50 and 1 <= info["length"] <= 60 and info["frames"] == info["length"] + 1
        assert filmer.sent == 1 and filmer.failed == 0
        video = tmp_path / "clip.mp4"
        import urllib.request

        with urllib.request.urlopen(url + "/clip.mp4", timeout=10) as resp:
            assert resp.headers["Content-Type"] == "video/mp4" and resp.headers["X-Weight-Version"] == "12"
            video.write_bytes(resp.read())
        assert video.stat().st_size == info["bytes"]
        reader = imageio_ffmpeg.read_frames(str(video))
        meta = next(reader)
        frames = sum(1 for _ in reader)
        assert frames == info["frames"] and tuple(meta["size"]) == (600, 400)  # CartPole renders 600x400

        done = chromium(tmp_path, "--autoplay-policy=no-user-gesture-required", "--dump-dom", url + "/")
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
        page = Texts()
        page.feed(done.stdout.decode())
        assert "hidden" not in page.attrs["clip_panel"]
        assert page.attrs["clip"]["src"].startswith("clip.mp4?t=")
        assert "weights v12" in page.by_id["clip_info"] and "filmed by actor-0" in page.by_id["clip_info"]
        assert page.attrs["clip"].get("data-size") == "600x400", "Chromium did not decode the clip"
        metrics = http_get(url + "/metrics")[1]
        assert 'flywheel_gateway_clips_received_total{service="gateway",instance="gateway-test"} 1' in metrics
    finally:
        if filmer is not None:
            filmer.close()
        ctx.destroy(linger=0)
        proc.terminate()
        proc.wait(timeout=15)
