"""What a service started on port 0 says it bound: its start line read back from its log.

Every server logs the endpoints it bound (``flywheel.transport.bind`` returns them): a test or benchmark binds
``tcp://127.0.0.1:0``, lets the kernel pick, and reads the real ports here, so no port is guessed in advance.
"""

from __future__ import annotations

import re
from pathlib import Path

from flywheel.testing.polling import wait_until

TCP = r"tcp://[\d.]+:\d+"
# services/replay/main.py: "replay NAME: capacity N, ..., transitions on A[,B], sampling on C[,D][, shared memory on]"
REPLAY_TCP = rf"transitions on \S*?({TCP})\S*, sampling on \S*?({TCP})"
# services/learner/startup.py log_start: "... samples from S, weights on W, telemetry to T, ..."
LEARNER_WEIGHTS = r"weights on (\S+),"
# services/gateway/transport.py and main.py: "gateway up: telemetry T, control C, lease L; ..." and "HTTP on URL"
GATEWAY_UP = r"gateway up: telemetry (\S+), control (\S+), lease (\S+);"
GATEWAY_HTTP = r"HTTP on (http://\S+)"


def reported(log: Path, pattern: str, timeout: float = 60, *, error: type[Exception] = AssertionError,
             ) -> tuple[str, ...]:
    """The groups of ``pattern`` in ``log``'s first matching text, waited for up to ``timeout`` seconds."""
    def found() -> tuple[str, ...] | None:
        try:
            match = re.search(pattern, log.read_text(errors="replace"))
        except OSError:
            return None
        return None if match is None else match.groups()

    def last_lines() -> str:
        try:
            return "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""

    return wait_until(found, timeout, f"{log.name} to report /{pattern}/", interval=0.1, error=error,
                      detail=last_lines)
