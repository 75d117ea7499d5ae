#!/usr/bin/env python3
"""Print the requirements the images install: pyproject.toml's dependencies, the extras of IMAGE_EXTRAS and the
build backend.

Run inside docker/Dockerfile (standard library only) and by docker/make-wheelhouse.sh. Versions come from
docker/constraints.txt; setuptools is added because flywheel-rl itself is installed without build isolation.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

IMAGE_EXTRAS = ("mario", "atari", "video")  # every env family the images run, and video for clips


def requirement_lines(root: Path = Path(".")) -> list[str]:
    with open(root / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    lines = list(project["dependencies"])
    for extra in IMAGE_EXTRAS:
        lines += [line for line in project["optional-dependencies"][extra] if line not in lines]
    return [*lines, "setuptools"]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    print("\n".join(requirement_lines(root)))
