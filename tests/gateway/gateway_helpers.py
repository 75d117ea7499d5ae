"""Helpers for the gateway tests: a strict exposition-format check, a fake clock, telemetry, gateway processes."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel import proto
from flywheel.processes import launch
from flywheel.testing.polling import wait_until
from flywheel.testing.reported import GATEWAY_HTTP, GATEWAY_UP, reported
from flywheel.testing.run import clean_env

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

_SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*",?)*\})? '
    r"(-?[0-9.e+-]+|NaN|[+-]Inf)$"
)


def check_exposition(text: str) -> dict[str, str]:
    """Strict check of Prometheus text format 0.0.4; returns {family: type}."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    current = None
    for line in text[:-1].split("\n"):  # lines end at \n only (a label value may hold \r or U+2028)
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"family {name} declared twice"
            assert kind in ("counter", "gauge")
            types[name], current = kind, name
            continue
        assert _SAMPLE.match(line), f"bad sample line {line!r}"
        assert line.split("{")[0].split(" ")[0] == current, f"sample outside its family: {line!r}"
    return types


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def tel(service: str = "actor", instance: str = "a-0", seq: int = 1, counters: dict[str, float] | None = None,
        gauges: dict[str, float] | None = None, info: dict[str, str] | None = None) -> proto.Telemetry:
    return proto.Telemetry(service, instance, seq, time.time(), counters or {}, gauges or {}, info or {})


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    return wait_until(predicate, timeout, what, interval=0.02)


def gateway_env(http_port: int = 0, **extra: str) -> dict[str, str]:
    """Environment for a gateway subprocess on loopback: ports the kernel picks (HTTP too by default), the test
    token, fast sweeps."""
    return clean_env(**{
        "FLYWHEEL_GATEWAY_HTTP_HOST": "127.0.0.1", "FLYWHEEL_GATEWAY_HTTP_PORT": str(http_port),
        "FLYWHEEL_GATEWAY_TELEMETRY_ENDPOINT": "tcp://127.0.0.1:*",
        "FLYWHEEL_GATEWAY_CONTROL_ENDPOINT": "tcp://127.0.0.1:*",
        "FLYWHEEL_GATEWAY_LEASE_ENDPOINT": "tcp://127.0.0.1:*",
        "FLYWHEEL_GATEWAY_CONTROL_TOKEN": TOKEN, "FLYWHEEL_GATEWAY_INSTANCE": "gateway-test", **extra,
    })


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def start_gateway(env: dict[str, str], log: Path, pass_fds: tuple[int, ...] = ()
                  ) -> tuple[subprocess.Popen[bytes], str, str]:
    """A gateway process; (process, its HTTP URL, its telemetry endpoint) as its start lines report them."""
    proc = launch(["gateway"], env, log, pass_fds=pass_fds)
    (url,) = reported(log, GATEWAY_HTTP)
    telemetry, _control, _lease = reported(log, GATEWAY_UP)
    return proc, url, telemetry
