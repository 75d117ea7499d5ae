"""Rogue peers for the reliability tests: raw ZMTP and TCP clients, hand-made headers, bad messages; and CURVE keys
made by the CLI, put in force for a block."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from pipeline_helpers import clean_env

from flywheel import proto, security
from flywheel.security import CurveKeys


def cli_keys(folder: Path, client: str) -> Path:
    """Keys made in ``folder`` by ``flywheel keys generate`` in a child process (a key pair per role), with the
    client folder clients/``client`` for an actor on another host."""
    proc = subprocess.run([sys.executable, "-m", "flywheel", "keys", "generate", str(folder), "--client", client],
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return folder


@contextmanager
def curve(keys: CurveKeys | None) -> Iterator[None]:
    """This process's CURVE keys for the sockets made inside the block."""
    before = security.active()
    security.configure(keys)
    try:
        yield
    finally:
        security.configure(before)


def zmtp_hello(socket_type: bytes) -> bytes:
    """A ZMTP 3.0 greeting with the NULL mechanism and a READY command naming ``socket_type``."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    body = b"\x05READY" + b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    return greeting + b"\x04" + bytes([len(body)]) + body


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the other side closes the connection within ``timeout_s`` (reading and discarding what it sends)."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def claim_huge_frame(port: int, socket_type: bytes, claimed: int = 4 << 30, timeout_s: float = 5.0) -> bool:
    """Speak ZMTP, then announce one frame of ``claimed`` bytes and send a few; True when the service hangs up.

    A socket with a ZMQ_MAXMSGSIZE cap refuses on the announced size, before allocating anything; without one,
    libzmq allocates the claimed size (overcommitted) and waits for the rest.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(zmtp_hello(socket_type))
        sock.sendall(b"\x02" + claimed.to_bytes(8, "big") + b"x" * 4096)
        return closed_by_peer(sock, timeout_s)


def raw_garbage(port: int, rng: np.random.Generator, size: int = 4096) -> None:
    """Random bytes instead of a ZMTP greeting, then hang up.

    Without CURVE, libzmq reads such a peer as ZMTP/1.0 (no greeting) and passes its 'messages' on: the
    service's decoders must refuse them. A CURVE server cuts the peer at the handshake instead.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"\x01" + rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        time.sleep(0.05)


def header(kind: str, fields: dict[str, Any], arrays: list[list[Any]], version: int = proto.SCHEMA_VERSION) -> bytes:
    return msgpack.packb({"k": kind, "v": version, "f": fields, "a": arrays}, use_bin_type=True)


def transitions(rows: int, *, width: int = 4, seq: int = 0, dtype: str = "float32", actor: str = "probe",
                reward: float = 1.0) -> proto.TransitionBatch:
    obs = np.full((rows, width), seq % 100, dtype=dtype)
    return proto.TransitionBatch(
        actor=actor, weight_version=1, seq=seq, obs=obs, action=np.arange(rows, dtype=np.int64) % 2,
        reward=np.full(rows, reward, np.float32), discount=np.full(rows, 0.99, np.float32), next_obs=obs + 1,
        priority=np.ones(rows, np.float32))


def bad_transitions(rng: np.random.Generator) -> list[tuple[str, list[Any]]]:
    """(the reason the replay must count, frames) for every way a transitions message can be wrong."""
    good = [bytes(f) if isinstance(f, bytes) else np.asarray(f).tobytes() for f in proto.encode(transitions(8))]
    head = msgpack.unpackb(good[0], raw=False)
    huge = [list(a) for a in head["a"]]
    huge[0][2] = [1 << 22, 1 << 22]
    # batch sizes disagree (7 actions for 8 observations): encode would refuse, so the frames are built by hand
    mixed_frames = [header("transitions", head["f"], [[n, d, [7 if n == "action" else 8, *s[1:]]]
                                                      for n, d, s in head["a"]]), *good[1:]]
    mixed_frames[2] = np.zeros(7, np.int64).tobytes()
    return [
        ("malformed", [rng.integers(0, 256, 64, dtype=np.uint8).tobytes()]),
        ("malformed", [b"\x93\x01\x02"]),  # msgpack, but not the header map
        ("truncated", [good[0], *good[1:3]]),  # arrays announced but missing
        ("truncated", [good[0], good[1][:-4], *good[2:]]),  # an array frame cut short
        ("oversized", [header("transitions", head["f"], huge), *good[1:]]),  # 64 TiB announced, never read
        ("unknown_kind", [header("bogus", {}, [])]),
        ("wrong_kind", proto.encode(proto.Control(seq=1, command="pause"))),
        ("version", [header("transitions", head["f"], head["a"], version=99), *good[1:]]),
        ("dtype", proto.encode(transitions(8, dtype="float64"))),
        ("shape", mixed_frames),
        ("shape", proto.encode(transitions(8, width=5))),  # well-formed, but not what the replay stores
        ("values", proto.encode(transitions(8, reward=float("nan")))),
    ]
