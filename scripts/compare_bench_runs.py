"""Two code versions' runs of one `flywheel bench` suite on one machine, row by row: is the change within noise?

Each side (``--side NAME FILE...``, exactly two: the version before, then after) holds one or more result files of
the same suite, all taken on one machine (same CPU model and count: absolute figures are only comparable there),
best interleaved in time (before, after, after, before) so a drifting machine shows up as noise, not as a change.
For every (case, metric) row found in every file: each side's median Flywheel value, after ÷ before, and the noise,
the largest max ÷ min of one side's own runs (runs of the same code). A row is "within noise" when after ÷ before
lies inside [1 ÷ noise, noise], "changed" otherwise; with one run a side there is no noise estimate and no verdict.
Beside it, each side's median Flywheel ÷ peer of the same run (a bare loop, say), which a drifting machine moves less.
Prints markdown and writes one JSON document with every value and the files they came from.

    python scripts/compare_bench_runs.py --side before old1.json old2.json --side after new1.json new2.json \
        --out docs/benchmarks/results/quick_compare_DATE/actor.json
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any


class CompareError(Exception):
    """Result files that cannot be compared: one line for the user."""


def _load(path: Path) -> dict[str, Any]:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CompareError(f"{path}: {exc}") from None
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list) or "suite" not in result:
        raise CompareError(f"{path}: not a `flywheel bench` result (no suite and rows)")
    return result


def _machine(result: dict[str, Any]) -> tuple[Any, Any]:
    machine = result.get("machine") or {}
    return machine.get("cpu_model"), machine.get("cpus")


def _values(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["case"], r["metric"]): r for r in result["rows"]
            if isinstance(r.get("flywheel"), (int, float)) and math.isfinite(r["flywheel"])}  # not a NaN "no peer"


def _spread(values: list[float]) -> float | None:
    if len(values) < 2 or min(values) <= 0:
        return None
    return max(values) / min(values)


def compare(sides: list[tuple[str, list[Path]]]) -> dict[str, Any]:
    """Both sides' rows matched by case and metric, with each side's runs, medians, the ratio and the verdict."""
    if len(sides) != 2 or any(not files for _, files in sides):
        raise CompareError("give exactly two sides, each --side NAME FILE... with at least one file")
    loaded = [(name, [(str(p), _load(p)) for p in files]) for name, files in sides]
    everyone = [r for _, results in loaded for _, r in results]
    suites = {r["suite"] for r in everyone}
    machines = {_machine(r) for r in everyone}
    quick = {bool(r.get("quick")) for r in everyone}
    if len(suites) > 1 or len(quick) > 1:
        raise CompareError(f"every file must be one suite at one size: suites {sorted(suites)}, quick {sorted(quick)}")
    if len(machines) > 1:
        raise CompareError(f"every file must come from one machine (CPU model, count): {sorted(map(str, machines))}")
    tables = [[_values(r) for _, r in results] for _, results in loaded]
    keys = [k for k in tables[0][0] if all(k in t for side in tables for t in side)]
    rows = []
    for key in keys:
        runs = [[float(t[key]["flywheel"]) for t in side] for side in tables]
        before, after = (statistics.median(v) for v in runs)
        spreads = [s for s in (_spread(v) for v in runs) if s is not None]
        noise = max(spreads) if spreads else None
        positive = all(v > 0 for side in runs for v in side)
        change = after / before if positive else None
        if change is None:
            verdict = "no ratio (a value <= 0)"
        elif noise is None:
            verdict = "no noise estimate"
        elif 1 / noise <= change <= noise:
            verdict = "within noise"
        else:
            better = (change > 1) == bool(tables[0][0][key].get("higher_is_better", True))
            verdict = f"changed ({'better' if better else 'worse'})"
        peer_ratios = [[t[key]["ratio"] for t in side if isinstance(t[key].get("ratio"), (int, float))]
                       for side in tables]
        rows.append({"case": key[0], "metric": key[1], "unit": tables[0][0][key].get("unit", ""),
                     "runs": {name: v for (name, _), v in zip(loaded, runs, strict=True)},
                     "before": before, "after": after,
                     "over_peer": {name: v for (name, _), v in zip(loaded, peer_ratios, strict=True)},
                     "after_over_before": change, "noise": noise, "verdict": verdict})
    return {"suite": suites.pop(), "machine": everyone[0].get("machine"),
            "sides": [{"name": name, "files": [p for p, _ in results],
                       "commands": [r.get("command") for _, r in results], "times": [r.get("time") for _, r in results]}
                      for name, results in loaded],
            "rows": rows, "within_noise": sum(r["verdict"] == "within noise" for r in rows),
            "changed": sum(r["verdict"].startswith("changed") for r in rows)}


def _peer_cell(before: list[float], after: list[float]) -> str:
    if not before or not after:
        return "–"
    return f"{statistics.median(before):.3f} → {statistics.median(after):.3f}"


def markdown(doc: dict[str, Any]) -> str:
    """The comparison as one markdown table."""
    before, after = (s["name"] for s in doc["sides"])
    lines = [f"| case | metric | {before} (runs) | {after} (runs) | {after} ÷ {before} | noise | verdict "
             f"| ÷ same-run peer, {before} → {after} |", "|---|---|---|---|---:|---:|---|---|"]
    for r in doc["rows"]:
        cells = [", ".join(f"{v:,.4g}" for v in r["runs"][name]) for name in (before, after)]
        ratio = f"{r['after_over_before']:.3f}" if r["after_over_before"] is not None else "–"
        noise = f"{r['noise']:.3f}" if r["noise"] is not None else "–"
        lines.append(f"| {r['case']} | {r['metric']} ({r['unit']}) | {cells[0]} | {cells[1]} | {ratio} | {noise} "
                     f"| {r['verdict']} | {_peer_cell(r['over_peer'][before], r['over_peer'][after])} |")
    lines.append(f"\n{doc['within_noise']} of {len(doc['rows'])} rows within noise, {doc['changed']} changed.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", nargs="+", action="append", required=True, metavar=("NAME", "FILE"),
                        help="a side's name, then its result files (give two sides: before, then after)")
    parser.add_argument("--out", type=Path, help="write the comparison here as JSON")
    args = parser.parse_args(argv)
    try:
        if any(len(s) < 2 for s in args.side):
            raise CompareError("each --side needs a name and at least one result file")
        doc = compare([(s[0], [Path(f) for f in s[1:]]) for s in args.side])
    except CompareError as exc:
        print(f"compare_bench_runs: {exc}", file=sys.stderr)
        return 2
    doc["command"] = shlex.join(["python", "scripts/compare_bench_runs.py", *(argv or sys.argv[1:])])
    print(markdown(doc))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
