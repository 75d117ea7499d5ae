"""Type-check the codec, the service cores and the telemetry declarations with mypy (``make lint``).

The wheel maps ``proto/`` and ``services/`` into the ``flywheel`` package (pyproject's package-dir), which mypy
cannot follow through an editable install; so this builds that layout from symlinks under build/typecheck
and checks it there, with the settings in pyproject's [tool.mypy].
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


# The typed telemetry declarations and the modules that count with them (an unknown counter is a type error there).
TELEMETRY = ("metrics_spec.py", "transport.py", "services/replay/transport.py", "services/replay/client.py",
             "services/actor/loop.py", "services/actor/report.py", "services/gateway/metrics.py",
             "services/learner/loop.py", "services/learner/transport.py", "services/learner/main.py",
             "services/learner/best.py", "services/learner/metrics.py")


def targets(package: Path) -> list[str]:
    """The checked files: the codec, each service's pure core, and the telemetry declarations and their users."""
    files = sorted((package / "proto").glob("*.py")) + sorted((package / "services").glob("*/core.py"))
    files += [package / name for name in TELEMETRY]
    return [str(f.relative_to(TREE)) for f in files]


def main() -> int:
    package = build_tree()
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *targets(package)]
    return subprocess.call(command, cwd=TREE, env={**os.environ, "MYPYPATH": str(TREE)})


if __name__ == "__main__":
    raise SystemExit(main())
