"""Files the repository generates (the Grafana ConfigMap, BENCHMARKS.md): written, or checked against the generator."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, *, check: bool, regenerate: str) -> int:
    """Write ``text`` to ``path`` (0), or with ``check`` say whether the committed file is exactly it (0, else 1 with
    one line naming the command ``regenerate`` that brings it back in step)."""
    if not check:
        path.write_text(text)
        return 0
    if path.is_file() and path.read_text() == text:
        return 0
    print(f"error: {path} is not what its generator builds: run {regenerate}", file=sys.stderr)
    return 1
