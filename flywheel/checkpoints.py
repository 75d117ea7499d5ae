"""Helpers shared by the services' checkpoint writers: whether the process that left a temp file still runs."""

from __future__ import annotations

import os


def process_running(pid: int) -> bool:
    """True while ``pid`` exists (also when it belongs to another user); a writer's leftovers wait until then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
