"""Optional dependencies by extra (pyproject.toml): the one-line error that names the extra a feature needs.

The packages of each extra are read from the installed distribution's metadata (its ``Requires-Dist`` lines), so
pyproject.toml is the one list of them.
"""

from __future__ import annotations

import re
from importlib import metadata

DISTRIBUTION = "flywheel-rl"


def extra_packages(extra: str) -> list[str] | None:
    """The names of the packages ``extra`` adds, as the installed distribution lists them; None where the
    distribution is not installed (a source tree on the path) and a ValueError for an extra it does not have."""
    try:
        meta = metadata.metadata(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    if extra not in (meta.get_all("Provides-Extra") or []):
        raise ValueError(f"unknown extra {extra!r}")
    names = []
    for requirement in meta.get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            names.append(re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0])
    return names


class MissingExtra(ImportError):
    """A feature whose optional dependencies are not installed; the message names the extra to install."""

    def __init__(self, extra: str, feature: str, cause: BaseException | None = None) -> None:
        packages = extra_packages(extra)
        listed = f" ({', '.join(packages)})" if packages else ""
        because = f" ({str(cause).splitlines()[0]})" if cause is not None and str(cause).strip() else ""
        super().__init__(f"{feature} needs the {extra} extra{listed}: pip install '{DISTRIBUTION}[{extra}]'{because}")
        self.extra = extra
