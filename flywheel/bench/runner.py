"""Measurement helpers and result files shared by every benchmark suite (medians, ratios, JSON, Markdown)."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class BenchContext:
    """What a suite is asked to do: how often to repeat, how big, and where results go."""

    suite: str
    runs: int = 3
    warmup: int = 1
    quick: bool = False
    out_dir: Path = Path("bench-results")
    seed: int = 0
    options: dict[str, str] = field(default_factory=dict)
    load_at_start: tuple[float, float, float] = field(default_factory=lambda: _loadavg())

    @contextmanager
    def workdir(self, suite: str) -> Iterator[Path]:
        """The folder ``--opt workdir=DIR`` names (kept afterwards), else a temporary one removed at the end."""
        kept = self.option("workdir", "")
        if kept:
            yield Path(kept).resolve()
            return
        with tempfile.TemporaryDirectory(prefix=f"flywheel-bench-{suite}-") as tmp:
            yield Path(tmp).resolve()

    def option(self, name: str, default: str) -> str:
        """A suite-specific ``--opt NAME=VALUE`` value, or ``default``."""
        return self.options.get(name, default)

    def option_int(self, name: str, default: int) -> int:
        """An integer ``--opt``; a value that is not one is a BenchError naming the option."""
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise BenchError(f"--opt {name}={raw!r}: expected an integer") from None

    def option_float(self, name: str, default: float) -> float:
        """A numeric ``--opt``; a value that is not a finite number is a BenchError naming the option."""
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value):
            raise BenchError(f"--opt {name}={raw!r}: expected a number")
        return value

    def plot_path(self, name: str) -> Path:
        """Where a suite's PNG called ``name`` goes: ``<out>/<suite>_<name>.png`` (the folder is created)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self.out_dir / f"{self.suite}_{name}.png"

    def progress(self, message: str) -> None:
        """One progress line on stderr, so long suites show where they are."""
        print(f"[bench {self.suite} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    """A suite cannot run as asked (bad option, missing peer, a run that failed); the CLI prints it in one line."""


def _loadavg() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        return (float("nan"),) * 3


@dataclass
class Row:
    """One line of a result table: Flywheel's median against a peer's median in the same run."""

    case: str
    metric: str
    unit: str
    flywheel: float
    peer: float | None = None
    peer_name: str = ""
    higher_is_better: bool = True
    goal: str = ""
    flywheel_runs: list[float] = field(default_factory=list)
    peer_runs: list[float] = field(default_factory=list)
    met: bool | None = None  # whether ``goal`` was met, when the suite can tell

    @property
    def ratio(self) -> float | None:
        """Flywheel over peer for rates, peer over Flywheel for times: above 1 means Flywheel is better."""
        if self.peer is None or self.peer == 0 or self.flywheel == 0:
            return None
        if not (math.isfinite(self.peer) and math.isfinite(self.flywheel)):
            return None
        return self.flywheel / self.peer if self.higher_is_better else self.peer / self.flywheel


@dataclass
class SuiteResult:
    """Everything a suite measured, ready to be written as JSON and Markdown."""

    suite: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)  # more Markdown (e.g. a model's table), after the notes
    method: str = ""  # how the figures were taken, when not "median of --runs runs after --warmup warm-up"


def median(values: list[float]) -> float:
    """Median of a non-empty list."""
    if not values:
        raise ValueError("median of no measurements")
    return float(statistics.median(values))


def median_ci(values: list[float], *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap confidence interval of the median (fixed seed, so a rerun prints the same)."""
    if not values:
        raise ValueError("median_ci of no measurements")
    from flywheel.stats import bootstrap_ci

    return bootstrap_ci(values, "median", resamples=resamples, seed=seed)


def repeat(measure_once: Callable[[], float], runs: int, warmup: int = 0) -> list[float]:
    """Call ``measure_once`` ``warmup`` times (discarded), then ``runs`` times, and return the kept values."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    for _ in range(warmup):
        measure_once()
    return [float(measure_once()) for _ in range(runs)]


def rate(work: float, seconds: float) -> float:
    """Work per second, refusing a zero-length interval."""
    if seconds <= 0:
        raise ValueError("a measured interval must be positive")
    return work / seconds


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        # os.uname, not platform.platform(): that one runs `uname -p` in a child process
        "platform": "-".join((os.uname().sysname, os.uname().release, os.uname().machine)),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average": list(_loadavg()),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover - psutil is a dependency
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def markdown_table(result: SuiteResult) -> str:
    """The suite's rows as a Markdown table, ratios above 1 meaning Flywheel is ahead."""
    lines = [
        "| case | metric | Flywheel | peer | peer value | Flywheel ÷ peer | goal |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for row in result.rows:
        ratio = row.ratio
        ratio_text = "–" if ratio is None else f"{ratio:.2f}x"
        goal = row.goal or "–"
        if row.goal and row.met is not None:
            goal += " (met)" if row.met else " (not met)"
        lines.append(
            f"| {row.case} | {row.metric} ({row.unit}) | {_fmt(row.flywheel)} | {row.peer_name or '–'} | "
            f"{_fmt(row.peer)} | {ratio_text} | {goal} |"
        )
    return "\n".join(lines)


def render_markdown(result: SuiteResult, ctx: BenchContext, command: str, machine: dict[str, Any]) -> str:
    """A complete Markdown section: title, command, machine, table, notes and plots."""
    parts = [
        f"## {result.title}",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine.get('cpus')} CPUs ({machine.get('cpu_model')}), {machine.get('memory_gib')} GiB, "
        f"GPU: {machine.get('gpu') or 'none'}; torch {machine.get('torch')}; "
        f"{result.method or f'median of {ctx.runs} runs after {ctx.warmup} warm-up'}; load average (1 min) "
        f"{_fmt(ctx.load_at_start[0])} at the start, {_fmt(machine.get('load_average', [math.nan])[0])} at the end.",
        "",
        markdown_table(result),
    ]
    if result.notes:
        parts += ["", *[f"- {note}" for note in result.notes]]
    for section in result.sections:
        parts += ["", section.rstrip()]
    for plot in result.plots:
        parts += ["", f"![{Path(plot).stem}]({plot})"]
    return "\n".join(parts) + "\n"


def write_results(result: SuiteResult, ctx: BenchContext, command: str) -> tuple[Path, Path]:
    """Write ``<suite>.json`` and ``<suite>.md`` into ``ctx.out_dir`` and return their paths."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    payload = {
        "suite": result.suite,
        "title": result.title,
        "command": command,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "runs": ctx.runs,
        "warmup": ctx.warmup,
        "quick": ctx.quick,
        "options": ctx.options,
        "load_average_at_start": list(ctx.load_at_start),
        "rows": [asdict(row) | {"ratio": row.ratio} for row in result.rows],
        "notes": result.notes,
        "plots": result.plots,
        "sections": result.sections,
        "extra": result.extra,
    }
    json_path = ctx.out_dir / f"{result.suite}.json"
    md_path = ctx.out_dir / f"{result.suite}.md"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(result, ctx, command, machine))
    return json_path, md_path
