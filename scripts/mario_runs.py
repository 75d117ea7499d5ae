"""Several `flywheel bench mario` training runs, one checkpoint each, aggregated across runs as a paper would.

Each bench result file is one training run (its own day and machine allowed); every run's checkpoint at ``--minute``
(or at the agent-step mark ``--steps``, taken with ``--opt checkpoint_steps``) must have been evaluated on the same
seeds. Per run: agent steps, updates, their rates (the suite's scale model),
CPU model, load, the whole machine's busy cores while it trained (busy CPU seconds over wall seconds between the
first and last poll of its last part), the mean and median furthest x and the flag rate with their intervals. Per
side (``--side NAME FILE...``, repeatable: with and without a setting): the median and interquartile mean of the
run scores with a bootstrap over runs (rliable's stratified bootstrap for one task), and the pooled episodes with
a two-level bootstrap (flywheel.stats.across_runs). ``--paired`` (two sides, one run per training seed each) adds
B minus A per training seed and over the pairs, with a two-level paired bootstrap (flywheel.stats.paired_difference:
pairs, then the evaluation seeds both played). ``FILE#DEPLOY`` takes one deploy of a
``--opt deploy=run,compose`` result (its checkpoints and polls; its rates first to last poll of that deploy).
``--also`` scores the episodes each checkpoint also played at the bench's second epsilon (``--opt also_epsilon``).
Prints markdown and writes one JSON document with every figure and where it came from.

    python scripts/mario_runs.py --minute 60 --side "share 0" a.json b.json c.json \
        --side "share 0.25" d.json e.json f.json --out docs/benchmarks/results/mario_seeds_DATE.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from flywheel.bench.parts.records import flag, furthest_x
from flywheel.stats import across_runs, paired_difference, summarize


class RunsError(Exception):
    """A result file that cannot be aggregated: one line for the user."""


def _checkpoint(result: dict[str, Any], minute: float | None, name: str, deploy: str | None,
                steps: int | None = None, played: str = "episodes") -> dict[str, Any]:
    """The run's evaluated checkpoint at ``minute``, or at the agent-step mark ``steps``, or (neither) its last;
    evaluated: it has ``played`` (``episodes_also``: the episodes at the bench's second epsilon)."""
    found = [c for c in result.get("extra", {}).get("checkpoints", [])
             if c.get(played) and (deploy is None or c.get("deploy") == deploy)]
    if not found:
        what = "no evaluated checkpoint" + (f" of deploy {deploy!r}" if deploy else "")
        what += " at a second epsilon (--opt also_epsilon)" if played == "episodes_also" else ""
        raise RunsError(f"{name}: {what} (is it a `flywheel bench mario` result?)")
    if steps is not None:
        wanted, match = f"the {steps} agent steps mark", [c for c in found if c.get("steps_mark") == steps]
    elif minute is not None:
        wanted, match = f"{minute:g} min", [c for c in found if c.get("steps_mark") is None
                                            and abs(float(c["minute"]) - minute) < 1e-9]
    else:
        return found[-1]
    if match:
        return match[0]
    minutes = ", ".join(f"{c['minute']:g}" for c in found if c.get("steps_mark") is None)
    marks = ", ".join(f"{c['steps_mark']}" for c in found if c.get("steps_mark") is not None)
    have = " and ".join([f"{minutes} min"] * bool(minutes) + [f"the agent-step marks {marks}"] * bool(marks))
    raise RunsError(f"{name}: no checkpoint at {wanted} (it has {have})")


def _per_second(points: list[dict[str, Any]], key: str) -> float | None:
    """``key``'s growth per second from the first to the last poll (that has it) of the last part."""
    polled = [p for p in points if p.get(key) is not None and p.get("part", 0) == points[-1].get("part", 0)]
    if len(polled) < 2 or polled[-1]["t"] <= polled[0]["t"]:
        return None
    return (polled[-1][key] - polled[0][key]) / (polled[-1]["t"] - polled[0]["t"])


def one_run(spec: str, minute: float | None, steps: int | None = None, also: bool = False) -> dict[str, Any]:
    """One training run's row (``FILE`` or ``FILE#DEPLOY``): where it ran, how far it got, its checkpoint's scores
    (``also``: at the bench's second epsilon)."""
    file, _, deploy = spec.partition("#")
    path = Path(file)
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunsError(f"{path}: {exc}") from None
    played = "episodes_also" if also else "episodes"
    c = _checkpoint(result, minute, spec, deploy or None, steps, played)
    episodes = c[played]
    evaluation = result.get("extra", {}).get("settings", {})
    epsilon = evaluation.get("also_epsilon" if also else "eval_epsilon")
    xs = [furthest_x(e) for e in episodes]
    flags = [flag(e) for e in episodes]
    points = result["extra"].get("points", [])
    if deploy:
        points = [p for p in points if p.get("deploy") == deploy]
        model = {"env_steps_per_s": _per_second(points, "env_steps"), "updates_per_s": _per_second(points, "updates")}
    else:
        model = result["extra"].get("scale_model") or {}  # the suite's rates over the last part, start-up left out
    loads = [p["load"][0] for p in points if p.get("load")]
    busy = _per_second(points, "machine_cpu_s")
    return {"file": spec, "command": result.get("command"), "time": result.get("time"),
            "train_seed": result.get("options", {}).get("train_seed"),
            "cpu_model": result.get("machine", {}).get("cpu_model"), "minute": c["minute"],
            "steps_mark": c.get("steps_mark"), "epsilon": epsilon,
            "env_steps": c.get("env_steps"), "updates": c.get("checkpoint_updates"),
            "load_median": sorted(loads)[len(loads) // 2] if loads else None, "busy_cores": busy,
            "env_steps_per_s": model.get("env_steps_per_s"), "updates_per_s": model.get("updates_per_s"),
            "seeds": [e["seed"] for e in episodes], "x": xs, "flags": flags, "summary": summarize(xs, flags)}


def aggregate(sides: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per side: across_runs over its runs; every run of every side must have played the same seeds."""
    seeds = {tuple(r["seeds"]) for runs in sides.values() for r in runs}
    if len(seeds) != 1:
        raise RunsError("the runs' checkpoints were evaluated on different seeds: they cannot be compared")
    return {name: across_runs([r["x"] for r in runs], [r["flags"] for r in runs]) for name, runs in sides.items()}


def paired(sides: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The second side minus the first, pairing runs by training seed (each side one run per seed, the same seeds)."""
    if len(sides) != 2:
        raise RunsError("--paired compares two sides")
    (a_name, a_runs), (b_name, b_runs) = sides.items()
    by_seed = []
    for name, runs in sides.items():
        seeds = [r["train_seed"] for r in runs]
        if None in seeds or len(set(seeds)) != len(seeds):
            raise RunsError(f"--paired: side {name!r} needs one run per training seed (--opt train_seed), got {seeds}")
        by_seed.append({r["train_seed"]: r for r in runs})
    if set(by_seed[0]) != set(by_seed[1]):
        raise RunsError(f"--paired: the sides' training seeds differ ({sorted(by_seed[0])} and {sorted(by_seed[1])})")
    seeds = sorted(by_seed[0], key=int)
    a, b = [by_seed[0][s] for s in seeds], [by_seed[1][s] for s in seeds]
    out = paired_difference([r["x"] for r in a], [r["x"] for r in b], [r["flags"] for r in a],
                            [r["flags"] for r in b])
    return {"a": a_name, "b": b_name, "train_seeds": seeds, **out}


def paired_markdown(diff: dict[str, Any], sides: dict[str, list[dict[str, Any]]]) -> str:
    """Each training seed's two runs and their difference, then the difference over the pairs."""
    runs = {name: {r["train_seed"]: r["summary"] for r in rs} for name, rs in sides.items()}
    a, b = runs[diff["a"]], runs[diff["b"]]
    lines = [f"| training seed | {diff['a']}: flags | {diff['b']}: flags | difference | {diff['a']}: mean x | "
             f"{diff['b']}: mean x | difference |", "|---|---:|---:|---:|---:|---:|---:|"]
    for i, seed in enumerate(diff["train_seeds"]):
        lines.append(f"| {seed} | {a[seed]['flag_rate']:.0%} | {b[seed]['flag_rate']:.0%} | "
                     f"{diff['pair_flag_rate_differences'][i]:+.0%} | {a[seed]['mean']:,.0f} | "
                     f"{b[seed]['mean']:,.0f} | {diff['pair_mean_differences'][i]:+,.0f} |")
    fl, mx = diff["flag_rate_difference_ci"], diff["mean_difference_ci"]
    lines += ["", f"{diff['b']} minus {diff['a']} over {diff['pairs']} paired training seeds, {diff['episodes']} "
              f"evaluation episodes each: flag rate {diff['flag_rate_difference']:+.1%} (95% paired bootstrap "
              f"{fl[0]:+.1%} to {fl[1]:+.1%}; median pair {diff['median_flag_rate_difference']:+.1%}; ahead on "
              f"{diff['flag_rate_b_ahead']}, behind on {diff['flag_rate_b_behind']}), mean x "
              f"{diff['mean_difference']:+,.0f} ({mx[0]:+,.0f} to {mx[1]:+,.0f}; ahead on {diff['mean_b_ahead']}, "
              f"behind on {diff['mean_b_behind']}). With few pairs the interval is narrower than 95% "
              "(flywheel.stats.paired_difference)."]
    return "\n".join(lines)


def markdown(sides: dict[str, list[dict[str, Any]]], totals: dict[str, Any]) -> str:
    lines = ["| side | run | CPU | agent steps | updates | agent steps/s | updates/s | load (median) | busy cores | "
             "mean x (95% CI) | median x | flag rate (95% CI) |", "|---|---|---|" + "---:|" * 9]
    for name, runs in sides.items():
        for r in runs:
            s = r["summary"]
            busy = "-" if r["busy_cores"] is None else f"{r['busy_cores']:.2f}"
            rates = " | ".join("-" if r[k] is None else f"{r[k]:.1f}" for k in ("env_steps_per_s", "updates_per_s"))
            run = f"seed {r['train_seed']}" if r["train_seed"] is not None else Path(r["file"]).name
            lines.append(f"| {name} | {run} | {r['cpu_model']} | {r['env_steps'] or 0:,.0f} | "
                         f"{r['updates'] or 0:,} | {rates} | {r['load_median'] or 0:.2f} | {busy} | {s['mean']:,.0f} "
                         f"({s['ci_low']:,.0f}-{s['ci_high']:,.0f}) | {s['median']:,.0f} | {s['flag_rate']:.0%} "
                         f"({s['flag_ci_low']:.0%}-{s['flag_ci_high']:.0%}) |")
    lines += ["", "| side | runs | median of run means (order-statistics interval; its coverage) | IQM of run means "
              "(bootstrap over runs, nominal 95%) | median flag rate (order-statistics interval; its coverage) | "
              "pooled mean x (two-level bootstrap, nominal 95%) | pooled flag rate (two-level bootstrap, nominal "
              "95%) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, t in totals.items():
        def ci(key: str, pct: bool = False, t: dict[str, Any] = t) -> str:
            value, interval, order = t[key], t.get(f"{key}_ci"), t.get(f"{key}_order")
            shown = (lambda v: f"{v:.0%}") if pct else (lambda v: f"{v:,.0f}")
            if key.startswith("median_") and order is not None:
                return f"{shown(value)} ({shown(order['low'])}-{shown(order['high'])}; {order['coverage']:.1%})"
            return f"{shown(value)} ({'-'.join(map(shown, interval)) if interval else 'one run: no interval'})"

        lines.append(f"| {name} | {t['runs']} | {ci('median_mean')} | {ci('iqm_mean')} | "
                     f"{ci('median_flag_rate', True)} | {ci('pooled_mean')} | {ci('pooled_flag_rate', True)} |")
    lines += ["", "Medians: the k-th lowest to the k-th highest run and the exact chance that such an interval "
              "holds the median of all runs of the recipe (flywheel.stats.median_order_interval; the range below 6 "
              "runs). The bootstraps cover less than their nominal 95% with few runs."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", nargs="+", action="append", required=True, metavar=("NAME", "FILE"),
                        help="a side's name and its runs' `flywheel bench mario` result files, FILE#DEPLOY for "
                             "one deploy of a deploy=run,compose result (repeatable)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--minute", type=float, default=None, help="which checkpoint (default: each run's last)")
    which.add_argument("--steps", type=int, default=None, metavar="N",
                       help="the checkpoint at the agent-step mark N (--opt checkpoint_steps) instead of a minute")
    parser.add_argument("--paired", action="store_true",
                        help="two sides, one run per training seed each: B minus A per seed and over the pairs")
    parser.add_argument("--also", action="store_true",
                        help="score the episodes every checkpoint also played at the second epsilon (bench mario's "
                             "also_epsilon) instead of the headline's")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON document here")
    args = parser.parse_args(argv)
    try:
        if any(len(side) < 2 for side in args.side):
            raise RunsError("--side takes a name and at least one result file")
        sides = {side[0]: [one_run(f, args.minute, args.steps, args.also) for f in side[1:]] for side in args.side}
        epsilons = {r["epsilon"] for runs in sides.values() for r in runs if r["epsilon"] is not None}  # older: none
        if len(epsilons) > 1:
            raise RunsError(f"the runs were evaluated at different epsilons ({', '.join(map(str, epsilons))}): "
                            "they cannot be compared")
        totals = aggregate(sides)
        diff = paired(sides) if args.paired else None
    except RunsError as exc:
        print(f"mario_runs: {exc}", file=sys.stderr)
        return 2
    text = markdown(sides, totals) + ("" if diff is None else "\n\n" + paired_markdown(diff, sides))
    print(text)
    if args.out is not None:
        runs = {name: [{k: v for k, v in r.items() if k not in ("x", "flags", "seeds")} for r in rs]
                for name, rs in sides.items()}
        document = {"command": shlex.join(["python", *sys.argv]), "minute": args.minute, "steps": args.steps,
                    "epsilon": next(iter(epsilons), None),
                    "runs": runs, "aggregate": totals, "paired": diff, "markdown": text}
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
