"""Waiting for a condition: the one poll loop of the tests, the harnesses and the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], timeout: float, what: str, *, interval: float = 0.5,
               error: type[Exception] = AssertionError, before: Callable[[], object] | None = None,
               detail: Callable[[], str] | None = None) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something truthy (not None), and return that.

    ``before`` runs ahead of every call (e.g. a check that the processes under test are alive, which raises).
    After ``timeout`` seconds, ``error`` is raised naming ``what``, followed by ``detail()`` (e.g. log tails).
    """
    deadline = time.monotonic() + timeout
    while True:
        if before is not None:
            before()
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise error(f"timed out after {timeout:.0f} s waiting for {what}{detail() if detail is not None else ''}")
