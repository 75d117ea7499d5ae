"""Figures for bench results: matplotlib on the Agg backend, saved beside the results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flywheel.bench.runner import BenchError


def save_figure(fig: Any, path: Path) -> str:
    """Write a matplotlib figure as PNG and return the file name (results and their plots share a folder)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; a BenchError naming the ``bench`` extra when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("plots need matplotlib: pip install 'flywheel-rl[bench]'") from None
    return plt
