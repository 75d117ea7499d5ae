"""The long run's table: every checkpoint of one or more long Mario trainings, flags and mean furthest x at both
evaluation epsilons, and the agent steps and minutes at which each first reached a flag rate.

A training trained in parts (`flywheel bench mario --opt workdir=DIR --opt resume=1`) is one file: the bench's
result (``mario.json`` of its last part, every part's checkpoints in it) or its state file
(``bench-mario-state.json``, also while checkpoints are still to be played: they are listed as not played). Every
run must have played the same evaluation seeds at the same epsilons. For each run and each rate in
``--thresholds`` (at the first epsilon; ``--also-thresholds`` at the second), the first checkpoint, in agent steps,
whose flag rate reached it, or that none has yet (with the last checkpoint played). Prints markdown and writes one
JSON document with every figure and the files it came from.

    python scripts/mario_long.py --run "seed 21=docs/benchmarks/results/long/seed21/part2-state.json" \
        --run "seed 22=docs/benchmarks/results/long/seed22/part3-state.json" \
        --out docs/benchmarks/results/long/table.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from flywheel.bench.parts.mario_report import checkpoint_label
from flywheel.bench.parts.records import flag, furthest_x
from flywheel.stats import summarize

STATE_FORMAT = "flywheel-bench-mario-state"


class LongError(Exception):
    """A file that cannot be tabled: one line for the user."""


def load_run(path: Path) -> dict[str, Any]:
    """A run's evaluation settings and checkpoints, from a bench result or a bench state file."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LongError(f"{path} cannot be read: {exc}") from None
    if not isinstance(raw, dict):
        raise LongError(f"{path} is neither a flywheel bench mario result nor its state file")
    if raw.get("format") == STATE_FORMAT:
        evaluation, checkpoints = raw.get("evaluation"), raw.get("checkpoints")
    elif raw.get("suite") == "mario":
        extra = raw.get("extra") or {}
        evaluation, checkpoints = extra.get("settings"), extra.get("checkpoints")
    else:
        raise LongError(f"{path} is neither a flywheel bench mario result nor its state file")
    if not isinstance(evaluation, dict) or not isinstance(checkpoints, list) or "seeds" not in evaluation:
        raise LongError(f"{path} names no evaluation seeds or checkpoints")
    return {"file": str(path), "seeds": evaluation["seeds"], "epsilon": evaluation.get("eval_epsilon"),
            "also_epsilon": evaluation.get("also_epsilon"), "checkpoints": checkpoints}


def _summary(episodes: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if not episodes:
        return None
    return summarize([furthest_x(r) for r in episodes], [flag(r) for r in episodes])


def rows_of(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per checkpoint, in agent steps: its label, minute, steps and summaries at both epsilons."""
    rows = []
    for c in sorted(run["checkpoints"], key=lambda c: (c.get("env_steps") or 0.0, c["minute"])):
        rows.append({"checkpoint": checkpoint_label(c), "minute": c["minute"], "env_steps": c.get("env_steps"),
                     "updates": c.get("checkpoint_updates"), "part": c.get("part"),
                     "summary": _summary(c.get("episodes")), "summary_also": _summary(c.get("episodes_also"))})
    return rows


def first_reached(rows: list[dict[str, Any]], rate: float, key: str) -> dict[str, Any]:
    """The first row (in agent steps) whose flag rate under ``key`` is at least ``rate``, or the last one played."""
    played = [r for r in rows if r[key] is not None]
    for r in played:
        if r[key]["flag_rate"] >= rate - 1e-12:
            return {"rate": rate, "reached": True, "checkpoint": r["checkpoint"], "minute": r["minute"],
                    "env_steps": r["env_steps"], "flag_rate": r[key]["flag_rate"]}
    if not played:
        return {"rate": rate, "reached": False, "last_played": None, "minute": None, "env_steps": None}
    last = played[-1]
    return {"rate": rate, "reached": False, "last_played": last["checkpoint"], "minute": last["minute"],
            "env_steps": last["env_steps"]}


def _flag_cell(s: dict[str, Any] | None) -> str:
    return "not played" if s is None else f"{s['flag_rate']:.0%} ({s['flag_ci_low']:.0%}-{s['flag_ci_high']:.0%})"


def _x_cell(s: dict[str, Any] | None) -> str:
    return "" if s is None else f"{s['mean']:,.0f}"


def _reached_cell(r: dict[str, Any]) -> str:
    label = r["checkpoint"] if r["reached"] else r["last_played"]
    if label is None:
        return "nothing played yet"
    where = label if label == f"{r['minute']:g} min" else f"{label}, {r['minute']:g} min"
    if r["reached"]:
        return f"{r['env_steps']:,.0f} agent steps ({where}: {r['flag_rate']:.0%})"
    return f"not by {r['env_steps']:,.0f} agent steps ({where})"


def markdown(runs: dict[str, dict[str, Any]], eps: float, also: float | None) -> str:
    lines = []
    for name, run in runs.items():
        head = f"| {name}: checkpoint | minute | agent steps | flags, eps {eps:g} (95% CI) | mean x, eps {eps:g} |"
        rule = "|---|---:|---:|---:|---:|"
        if also is not None:
            head += f" flags, eps {also:g} (95% CI) | mean x, eps {also:g} |"
            rule += "---:|---:|"
        lines += [head, rule]
        for r in run["rows"]:
            cells = [r["checkpoint"], f"{r['minute']:g}", f"{r['env_steps'] or 0:,.0f}", _flag_cell(r["summary"]),
                     _x_cell(r["summary"])]
            if also is not None:
                cells += [_flag_cell(r["summary_also"]), _x_cell(r["summary_also"])]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for label, reached in run["reached"]:
            lines.append(f"- {name}, {label}: {_reached_cell(reached)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _rates(raw: str, option: str) -> list[float]:
    try:
        rates = [float(r) for r in raw.split(",") if r.strip()]
    except ValueError:
        rates = [-1.0]
    if any(not 0.0 < r <= 1.0 for r in rates):
        raise LongError(f"{option} {raw!r}: flag rates in (0, 1], separated by commas (e.g. 0.5,0.8)")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=FILE",
                        help="a long training: its name and its bench result or state file")
    parser.add_argument("--thresholds", default="0.5,0.8", help="flag rates at the first epsilon (default 0.5,0.8)")
    parser.add_argument("--also-thresholds", default="0.9,0.95",
                        help="flag rates at the second epsilon, if the runs played one (default 0.9,0.95)")
    parser.add_argument("--out", type=Path, help="write the JSON document here")
    args = parser.parse_args(argv)
    try:
        rates, also_rates = _rates(args.thresholds, "--thresholds"), _rates(args.also_thresholds, "--also-thresholds")
        runs: dict[str, dict[str, Any]] = {}
        for spec in args.run:
            name, sep, file = spec.partition("=")
            if not sep or not name or not file or name in runs:
                raise LongError(f"--run takes NAME=FILE with a new name, got {spec!r}")
            runs[name] = load_run(Path(file))
        first = next(iter(runs.values()))
        for name, run in runs.items():
            if (run["seeds"], run["epsilon"], run["also_epsilon"]) != (first["seeds"], first["epsilon"],
                                                                        first["also_epsilon"]):
                raise LongError(f"{name} ({run['file']}) played other evaluation seeds or epsilons than "
                                f"{first['file']}: tables compare like with like")
    except LongError as exc:
        print(f"mario_long: {exc}", file=sys.stderr)
        return 2
    eps, also = first["epsilon"], first["also_epsilon"]
    for run in runs.values():
        run["rows"] = rows_of(run)
        run["reached"] = [(f"{rate:.0%} flags at eps {eps:g}", first_reached(run["rows"], rate, "summary"))
                          for rate in rates]
        if also is not None:
            run["reached"] += [(f"{rate:.0%} flags at eps {also:g}", first_reached(run["rows"], rate, "summary_also"))
                               for rate in also_rates]
    text = markdown(runs, eps, also)
    seeds = first["seeds"]
    given = argv if argv is not None else sys.argv[1:]
    document = {"command": shlex.join(["python", "scripts/mario_long.py", *given]),
                "evaluation": {"seeds": [seeds[0], seeds[-1]], "episodes": len(seeds), "epsilon": eps,
                               "also_epsilon": also},
                "runs": {name: {"file": run["file"], "rows": run["rows"],
                                "reached": [{"what": label, **r} for label, r in run["reached"]]}
                         for name, run in runs.items()},
                "markdown": text}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
