"""Fixed free TCP ports, for the few places where binding port 0 cannot serve, drawn from below the ephemeral range.

Everything else binds port 0 and reads back what the kernel picked (``flywheel.testing.reported``, ``flywheel run
--base-port 0 --http-port 0``). What still needs a port known in advance: a cluster whose services are killed and
restarted on TCP and must come back on the same port (``flywheel.testing.cluster``, as a Kubernetes Service keeps
one), and programs that do not report the port they bound (Prometheus, Docker's published ports; the Reverb
peer could, but its venv is not installed where this was changed, so it was left alone).

A port found free by binding port 0 comes from the ephemeral range, so the kernel may hand it to any
outgoing connection (an actor dialling the replay, say) before the service that was meant to bind it
starts. Ports below ``ip_local_port_range`` are never handed out that way, so a block checked free here
stays free unless another process asks for it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000
_handed_out: set[int] = set()  # this process's earlier answers, not yet bound by whoever asked


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default when it cannot be read)."""
    try:
        low, high = (int(part) for part in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(count: int = 1, host: str = "127.0.0.1") -> int:
    """First of ``count`` consecutive free TCP ports on ``host``, all below the ephemeral range."""
    low, high = ephemeral_range()
    top = low - count if low - count > _LOWEST + 1_000 else 65_535 - count
    bottom = _LOWEST if top == low - count else high + 1
    for _ in range(500):
        base = random.randint(bottom, top)
        block = range(base, base + count)
        if len(_handed_out) > 5_000:
            _handed_out.clear()
        if not _handed_out.intersection(block) and all(_bindable(port, host) for port in block):
            _handed_out.update(block)
            return base
    raise RuntimeError(f"no block of {count} free TCP ports on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """One free TCP port on ``host``, below the ephemeral range."""
    return free_port_block(1, host)
