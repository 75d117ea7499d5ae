#!/usr/bin/env python3
"""Print the requirements the images install: pyproject.toml's dependencies plus the build backend.

Run inside docker/Dockerfile (standard library only) and by docker/make-wheelhouse.sh. Versions come from
docker/constraints.txt; setuptools is added because flywheel-rl itself is installed without build isolation.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirement_lines(root: Path = Path(".")) -> list[str]:
    with open(root / "pyproject.toml", "rb") as f:
        dependencies = list(tomllib.load(f)["project"]["dependencies"])
    return [*dependencies, "setuptools"]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    print("\n".join(requirement_lines(root)))
