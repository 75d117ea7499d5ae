"""Draw Mario's evaluation flag rate against training minutes, one line per training run, from committed raw results.

Each file is one ``flywheel bench mario`` result (one training run; a run resumed in parts is its last part's
file, which holds every checkpoint). Every checkpoint's flag rate at the headline epsilon is drawn with its 95%
interval, at a second epsilon (``--opt also_epsilon``) dashed where the run measured one, and the random policy
of the first file as a grey line with its interval shaded. The runs must have played the same evaluation seeds.
Needs matplotlib (the ``bench`` extra). The README's and docs/benchmarks/mario.md's figure is::

    python scripts/plot_mario_flags.py --out docs/img/mario_flags.png
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "results"
# the default job's training runs on evaluation seeds 300000-300099 (docs/benchmarks/mario.md)
DEFAULT_RUNS = [RESULTS / f"mario_60min_lr25_seed{k}.json" for k in (1, 2, 3)] + [
    RESULTS / "mario_long_lr25_seed4_part2.json"]


class PlotError(Exception):
    """A result file that cannot be drawn: one line for the user."""


@dataclass
class Run:
    """One training run's checkpoints: minute, flag rate and its interval, and the same at the second epsilon."""

    name: str
    epsilon: float
    minutes: list[float] = field(default_factory=list)
    flags: list[tuple[float, float, float]] = field(default_factory=list)  # (rate, low, high)
    also_epsilon: float | None = None
    also_minutes: list[float] = field(default_factory=list)
    also_flags: list[float] = field(default_factory=list)


def _flag(summary: dict[str, Any]) -> tuple[float, float, float]:
    return float(summary["flag_rate"]), float(summary["flag_ci_low"]), float(summary["flag_ci_high"])


def load(path: Path) -> tuple[Run, tuple[float, float, float], list[int]]:
    """(the run, the random policy's flag rate and interval, the evaluation seeds) of one bench result."""
    try:
        result = json.loads(path.read_text())
        extra = result["extra"]
        settings = extra["settings"]
        checkpoints = [c for c in extra["checkpoints"] if c.get("summary") and c.get("steps_mark") is None]  # minutes
        random = _flag(extra["random"]["summary"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlotError(f"{path}: not a `flywheel bench mario` result ({type(exc).__name__}: {exc})") from None
    if not checkpoints:
        raise PlotError(f"{path}: no evaluated checkpoint")
    seed = result.get("options", {}).get("train_seed")
    run = Run(f"training seed {seed}" if seed is not None else path.stem, float(settings["eval_epsilon"]),
              also_epsilon=settings.get("also_epsilon"))
    for c in sorted(checkpoints, key=lambda c: float(c["minute"])):
        run.minutes.append(float(c["minute"]))
        run.flags.append(_flag(c["summary"]))
        if c.get("summary_also"):
            run.also_minutes.append(float(c["minute"]))
            run.also_flags.append(float(c["summary_also"]["flag_rate"]))
    return run, random, list(settings["seeds"])


def draw(paths: list[Path], out: Path) -> list[Run]:
    """Write the plot to ``out`` (PNG) and return the runs drawn."""
    loaded = [load(p) for p in paths]
    seeds = {(s[0], s[-1], len(s)) for _, _, s in loaded}
    if len(seeds) != 1:
        raise PlotError(f"the runs played different evaluation seeds ({sorted(seeds)}): not one comparison")
    (first, last, count), = seeds
    random = loaded[0][1]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("the plot needs matplotlib: pip install 'flywheel-rl[bench]'") from None
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    end = max(m for run, _, _ in loaded for m in run.minutes)
    ax.axhspan(100 * random[1], 100 * random[2], color="0.85", zorder=0)
    ax.plot([0, end], [100 * random[0]] * 2, color="0.45", lw=1.5,
            label=f"random policy ({100 * random[0]:.0f}%, 95% CI {100 * random[1]:.0f}-{100 * random[2]:.0f}%)")
    for i, (run, _, _) in enumerate(loaded):
        colour = f"C{i}"
        rates = [100 * f[0] for f in run.flags]
        errors = [[100 * (f[0] - f[1]) for f in run.flags], [100 * (f[2] - f[0]) for f in run.flags]]
        ax.errorbar(run.minutes, rates, yerr=errors, color=colour, marker="o", capsize=3, lw=1.8,
                    label=f"{run.name}, epsilon {run.epsilon:g}")
        if run.also_flags:
            ax.plot(run.also_minutes, [100 * f for f in run.also_flags], color=colour, ls="--", marker=".",
                    label=f"{run.name}, epsilon {run.also_epsilon:g}")
    ax.set_xlabel("minutes of training (the default job, 2 CPU cores)")
    ax.set_ylabel("episodes that reach the flag (%)")
    ax.set_title(f"Mario 1-1: flag rate on {count} evaluation seeds ({first}-{last}), 95% intervals", fontsize=10)
    ax.set_xlim(0, end + 5)
    ax.set_ylim(0, 100)
    ax.set_xticks(sorted({m for run, _, _ in loaded for m in run.minutes} | {0.0}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [run for run, _, _ in loaded]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path,
                        help="bench mario result files, one per training run (default: the default job's four)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "mario_flags.png", help="the PNG")
    args = parser.parse_args(argv)
    try:
        runs = draw(args.results or DEFAULT_RUNS, args.out)
    except PlotError as exc:
        print(f"plot_mario_flags: {exc}", file=sys.stderr)
        return 1
    for run in runs:
        flags = ", ".join(f"{m:g} min {100 * f[0]:.0f}%" for m, f in zip(run.minutes, run.flags, strict=True))
        print(f"{run.name}: {flags}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
