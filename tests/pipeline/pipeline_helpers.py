"""Helpers for whole-pipeline tests: service processes, the endpoints they report, gateway polling."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flywheel.processes import launch
from flywheel.testing import polling
from flywheel.testing.run import clean_env as clean_env  # the tests' one clean environment, imported from here
from flywheel.testing.run import tail


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.unlink(missing_ok=True)
    return launch(args, env, log)


def get_json(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def wait_until(check: Callable[[], Any], timeout: float, what: str, logs: Sequence[Path] = ()) -> Any:
    """``flywheel.testing.polling.wait_until``, twice a second; a timeout shows the tails of ``logs``."""
    return polling.wait_until(check, timeout, what, detail=lambda: "\n" + "\n".join(
        f"--- {p.name}\n{tail(p, 15)}" for p in logs if p.exists()))


def metric_values(text: str, name: str) -> dict[str, float]:
    """{label-set: value} for every sample of one metric in Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out
