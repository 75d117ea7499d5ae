"""``python -m flywheel.services.gateway``: the same as ``flywheel gateway`` (flags and FLYWHEEL_GATEWAY_* vars)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from flywheel.cli import main as flywheel_main

    return flywheel_main(["gateway", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
