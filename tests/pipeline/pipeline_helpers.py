"""Helpers for whole-pipeline tests: free ports, service processes, gateway polling."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel.processes import launch


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


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


def wait_until(check: Callable[[], Any], timeout: float, what: str, logs: list[Path] = ()) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                      for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")


def metric_values(text: str, name: str) -> dict[str, float]:
    """{label-set: value} for every sample of one metric in Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out
