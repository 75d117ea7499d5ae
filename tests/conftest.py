"""Suite-wide setup: no preset unless a test names one, and the tiers (a fast-tier test that starts a process fails).

Every test starts without a preset: settings built in the test process take their fields' defaults unless the
test names a preset (tests/test_presets.py does); `flywheel run` passes its preset's values to its children.

Tiers (CONTRIBUTING.md): a test marked ``system`` starts processes (a service, `flywheel run`, a CLI, pip, Docker, a
browser, a network namespace) or needs a Debian package; one marked ``slow`` is a learning run, an install or an
emulator played for thousands of frames; every other test is in the fast tier (`make test-fast`), which a venv alone
runs in a few minutes.
So that the tiers stay true, a test with neither mark that starts a process (a subprocess, os.system, os.posix_spawn
or a multiprocessing process; a bare os.fork, as the replay's checkpoint child, is not counted) fails, naming what
it started, in its setup, call or teardown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

os.environ["FLYWHEEL_PRESET"] = "none"

TIER_MARKS = ("system", "slow")
# audit events (sys.addaudithook) that start another program
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn"})

_started: list[str] | None = None  # what the running fast-tier test phase started; None outside one


def _program(event: str, args: tuple[Any, ...]) -> str:
    """The program an audit event starts, for the failure message."""
    argv = args[0] if event == "os.system" else args[1] if len(args) > 1 else args
    if isinstance(argv, (list, tuple)) and argv:
        return " ".join(str(a) for a in argv[:4])
    return str(argv)[:200]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _started is not None and event in PROCESS_EVENTS:
        _started.append(f"{event}: {_program(event, args)}")


sys.addaudithook(_audit)  # cannot be removed: it records only while a fast-tier test phase runs
_process_start = BaseProcess.start


def _recorded_start(self: BaseProcess) -> None:
    if _started is not None:
        _started.append(f"multiprocessing: {self.name}")
    _process_start(self)


BaseProcess.start = _recorded_start  # type: ignore[method-assign]  # spawn and forkserver raise no audit event


def _guarded(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    """Run one phase of ``item``; when it is a fast-tier test that started a process, fail it."""
    global _started
    if any(item.get_closest_marker(mark) for mark in TIER_MARKS):
        return (yield)
    _started = started = []
    try:
        result = yield
    finally:
        _started = None
    if started:
        pytest.fail(f"a fast-tier test started a process in its {phase} ({'; '.join(started[:3])}): mark it "
                    "@pytest.mark.system (a learning run: @pytest.mark.slow), see CONTRIBUTING.md", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "teardown"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files with a ``slow`` test first, then those with a ``system`` one, then the rest, each file's tests in
    their own order: with xdist's one-file-per-worker scheduling the longest files start first, so the workers
    finish together instead of one running the compose test alone at the end."""
    rank: dict[str, int] = {}
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        tier = 0 if "slow" in marks else 1 if "system" in marks else 2
        rank[item.nodeid.split("::")[0]] = min(tier, rank.get(item.nodeid.split("::")[0], 2))
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: files and tests keep their order
