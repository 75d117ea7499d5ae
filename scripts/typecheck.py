"""Type-check every module of the package with mypy: ``python scripts/typecheck.py`` (run by ``make lint``).

The wheel maps ``proto/`` and ``services/`` into the ``flywheel`` package (pyproject's package-dir), which mypy
cannot follow through an editable install; so this builds that layout from symlinks under build/typecheck
and checks all of it there (flywheel/, proto/ and services/), with the settings in pyproject's [tool.mypy]:
strict for the codec and each service's pure core, the rest with checked bodies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"
MAPPED = {"proto": ROOT / "proto", "services": ROOT / "services"}


def build_tree() -> Path:
    """build/typecheck/flywheel: links to every entry of flywheel/, plus proto/ and services/ as subpackages."""
    package = TREE / "flywheel"
    shutil.rmtree(TREE, ignore_errors=True)
    package.mkdir(parents=True)
    for entry in (ROOT / "flywheel").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, target in MAPPED.items():
        (package / name).symlink_to(target)
    return package


def main() -> int:
    package = build_tree()
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), package.name]
    return subprocess.call(command, cwd=TREE, env={**os.environ, "MYPYPATH": str(TREE)})


if __name__ == "__main__":
    raise SystemExit(main())
