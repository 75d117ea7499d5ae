"""Starting Flywheel services as child processes: one launcher, and children that die with their parent."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """In a child: ask Linux for ``signum`` (SIGTERM) when the parent dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signum))
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def launch(args: list[str], env: Mapping[str, str], log: Path, *, new_session: bool = False,
           tie_to_parent: bool = True, cwd: Path | None = None, pass_fds: tuple[int, ...] = ()
           ) -> subprocess.Popen[bytes]:
    """``python -m flywheel ARGS`` with stdout and stderr appended to ``log``, stdin closed.

    ``tie_to_parent`` makes the child get SIGTERM when this process dies however it dies, so a killed
    launcher leaves no orphans; ``new_session`` keeps a terminal's Ctrl-C from reaching the child directly;
    ``pass_fds`` are file descriptors the child inherits (a listening socket, say).
    """
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "flywheel", *args], env=dict(env), stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                start_new_session=new_session, pass_fds=pass_fds,
                                preexec_fn=die_with_parent if tie_to_parent else None)


def stop_children(conns: Sequence[Connection], procs: Sequence[BaseProcess], stop: bytes, *,
                  grace_s: float = 5.0) -> None:
    """Send each live child ``stop`` on its pipe, wait ``grace_s`` for each, then SIGTERM and reap what still runs."""
    for conn, proc in zip(conns, procs, strict=True):
        if proc.is_alive():
            try:
                conn.send_bytes(stop)
            except OSError:  # its end is already closed
                pass
    for proc in procs:
        proc.join(grace_s)
        if proc.is_alive():
            proc.terminate()
            proc.join(grace_s)
