"""What ``flywheel bench mario`` reports: rows, the policy table (plain beside the stall rule), notes and the plot."""

from __future__ import annotations

import statistics
from typing import Any

from flywheel.bench.parts.plots import pyplot, save_figure
from flywheel.bench.parts.records import flag, furthest_x, stall_rule
from flywheel.bench.parts.scale import ScaleModel, scale_table
from flywheel.bench.runner import BenchContext, Row, SuiteResult, _cpu_model
from flywheel.envs import split_env_id
from flywheel.envs.mario import MarioConfig

# Issue 24's goals for one training run (its headline goal is the median of >= 3 runs: scripts/mario_runs.py):
# (minute of the checkpoint, least flag rate, least mean furthest x or None, the goal's name, whose runs it judges)
GOALS = ((60.0, 0.25, 2400.0, "goal", "this run; issue 24 judges the median of >= 3 runs"),
         (60.0, 0.50, None, "moonshot", "this run; issue 24 asks it of every run"),
         (180.0, 0.80, None, "long run", "this run"))
GOAL_EPISODES = 100
FLAG_X = 3160  # x_pos of the flag pole in 1-1
# uvipen/Super-mario-bros-A3C as reported: (agent steps, x_pos, label)
A3C_ANCHORS = ((0.58e6, 1670.0, "A3C: greedy x_pos ~1,670"), (1.01e6, FLAG_X, "A3C: first flag"),
               (1.63e6, FLAG_X, "A3C: flag every episode"))


def checkpoint_label(c: dict[str, Any]) -> str:
    """A checkpoint's name in tables: its minute ("15 min") or, taken at an agent-step mark, the mark ("250k steps")."""
    n = c.get("steps_mark")
    if n is None:
        return f"{c['minute']:g} min"
    return (f"{n / 1e6:g}M" if n >= 1_000_000 and n % 10_000 == 0 else f"{n // 1000}k" if n % 1000 == 0
            else f"{n:,}") + " steps"


def _x(records: list[dict[str, Any]]) -> list[float]:
    return [furthest_x(r) for r in records]


def _flags(records: list[dict[str, Any]]) -> list[bool]:
    return [flag(r) for r in records]


def _stall_rule(records: list[dict[str, Any]]) -> tuple[list[float], list[bool]]:
    """What the 250-step stall rule keeps of each episode (flywheel.evaluation records it beside the plain one)."""
    kept = [stall_rule(r) for r in records]
    return [x for x, _ in kept], [got for _, got in kept]


def _describe(s: dict[str, Any]) -> str:
    return (f"median {s['median']:.0f} ({s['median_ci_low']:.0f}-{s['median_ci_high']:.0f}), 95% CI "
            f"{s['ci_low']:.0f}-{s['ci_high']:.0f}, flags {s['flag_rate']:.0%} ({s['flag_ci_low']:.0%}-"
            f"{s['flag_ci_high']:.0%})")


def _mean_cell(s: dict[str, Any]) -> str:
    return f"{s['mean']:,.0f} ({s['ci_low']:,.0f}-{s['ci_high']:,.0f})"


def _median_cell(s: dict[str, Any]) -> str:
    return f"{s['median']:,.0f} ({s['median_ci_low']:,.0f}-{s['median_ci_high']:,.0f})"


def _flag_cell(s: dict[str, Any]) -> str:
    return f"{s['flag_rate']:.0%} ({s['flag_ci_low']:.0%}-{s['flag_ci_high']:.0%})"


def _policy_table(rnd: dict[str, Any], checkpoints: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """Markdown: each policy's plain figures beside what the stall rule (which can only lower them) makes of them."""
    lines = [f"Every policy on the same {len(settings['seeds'])} seeds (epsilon {settings['eval_epsilon']:g}, "
             f"0..{settings.get('noop_max', 0)} no-ops). Plain: an episode ends at death, flag, the level clock or "
             "the env's step cap. Stall rule: the same episodes cut where 250 agent steps passed without a new "
             "furthest x, for every policy alike.", "",
             "| policy | agent steps | mean x (95% CI) | median x (95% CI) | flag rate (95% CI) | mean x, stall rule "
             "| flag rate, stall rule |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, steps, s, t in [("random", None, rnd["summary"], rnd["stall_rule"])] + [
            (f"{c.get('deploy', 'run')} {checkpoint_label(c)}", c["env_steps"], c["summary"], c["stall_rule"])
            for c in checkpoints]:
        lines.append(f"| {name} | {'-' if steps is None else f'{steps:,.0f}'} | {_mean_cell(s)} | {_median_cell(s)} | "
                     f"{_flag_cell(s)} | {t['mean']:,.0f} | {t['flag_rate']:.0%} |")
    return "\n".join(lines)


def _also_table(rnd: dict[str, Any], checkpoints: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """Markdown: each checkpoint on the same seeds at the second exploration rate, beside the headline rate's."""
    eps, also = settings["eval_epsilon"], settings["also_epsilon"]
    lines = [f"The same {len(settings['seeds'])} seeds at epsilon {also:g} (the random policy ignores epsilon: its "
             f"figures are the headline's), beside the headline's epsilon {eps:g}; episodes end as the headline's do.",
             "",
             f"| policy | mean x, eps {also:g} (95% CI) | median x, eps {also:g} (95% CI) | flag rate, eps {also:g} "
             f"(95% CI) | mean x, eps {eps:g} | flag rate, eps {eps:g} |", "|---|---:|---:|---:|---:|---:|"]
    for name, s, h in [("random", rnd, rnd)] + [(f"{c.get('deploy', 'run')} {checkpoint_label(c)}", c["summary_also"],
                                                  c["summary"]) for c in checkpoints]:
        lines.append(f"| {name} | {_mean_cell(s)} | {_median_cell(s)} | {_flag_cell(s)} | {h['mean']:,.0f} | "
                     f"{h['flag_rate']:.0%} |")
    return "\n".join(lines)


def _kept_best_table(checkpoints: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """Markdown: each checkpoint's kept best (what flywheel play and export take) beside its newest weights."""
    lines = [f"The learner's kept best at each checkpoint (best.safetensors: what `flywheel play`, `Policy.load` and "
             f"`flywheel export` take by default), on the same {len(settings['seeds'])} seeds and rule as the "
             "headline, beside the checkpoint's newest weights; `scored` is the kept best's own evaluation in "
             "training (mean return, its episodes, epsilon and no-ops).", "",
             "| checkpoint | newest weights: version, mean x, flag rate | kept best: version, scored | kept best: mean "
             "x (95% CI) | median x | flag rate (95% CI) |", "|---|---:|---:|---:|---:|---:|"]
    for c in checkpoints:
        b, s, n = c["best"], c["best"]["summary"], c["summary"]
        sc = b.get("scored") or {}
        scored = (f"{sc['mean_return']:.1f} over {sc.get('episodes')}, eps {sc.get('epsilon') or 0:g}, "
                  f"0..{sc.get('noop_max') or 0}" if sc.get("mean_return") is not None else "-")
        lines.append(f"| {c.get('deploy', 'run')} {checkpoint_label(c)} | v{c.get('weight_version')}, "
                     f"{n['mean']:,.0f}, {n['flag_rate']:.0%} | v{b['weight_version']}, {scored} | {_mean_cell(s)} | "
                     f"{s['median']:,.0f} | {_flag_cell(s)} |")
    return "\n".join(lines)


def _compose_row(checkpoints: list[dict[str, Any]], rnd: dict[str, Any]) -> Row | None:
    """Compose's last checkpoint against random and against flywheel run's checkpoint nearest in agent steps."""
    composed = [c for c in checkpoints if c.get("deploy") == "compose"]
    local = [c for c in checkpoints if c.get("deploy", "run") == "run"]
    if not composed or not local:
        return None
    c = composed[-1]
    steps = float(c["env_steps"] or 0)
    r = min(local, key=lambda x: (abs(float(x["env_steps"] or 0) - steps), -x["minute"]))
    s, q = c["summary"], r["summary"]
    return Row(
        case=f"compose at {checkpoint_label(c)} ({steps:,.0f} agent steps) vs flywheel run at {checkpoint_label(r)} "
             f"({float(r['env_steps'] or 0):,.0f} agent steps, the nearest)",
        metric=f"mean max x_pos (compose 95% CI {s['ci_low']:.0f}-{s['ci_high']:.0f}; flywheel run 95% CI "
               f"{q['ci_low']:.0f}-{q['ci_high']:.0f}; random 95% CI {rnd['ci_low']:.0f}-{rnd['ci_high']:.0f})",
        unit="x_pos", flywheel=s["mean"], peer=q["mean"], peer_name="flywheel run (mean)",
        flywheel_runs=_x(c["episodes"]), peer_runs=_x(r["episodes"]),
        goal="compose's CI above random's, its mean within flywheel run's CI at about the same agent steps",
        met=bool(s["ci_low"] > rnd["ci_high"] and q["ci_low"] <= s["mean"] <= q["ci_high"]))


def _goal_rows(checkpoints: list[dict[str, Any]], rnd: dict[str, Any]) -> list[Row]:
    """Issue 24's goals for this one training run, each judged at its own checkpoint minute when the run has it."""
    rows = []
    for minute, flags, least_x, name, judged in GOALS:
        at = [c for c in checkpoints if c["minute"] == minute and c.get("steps_mark") is None]
        if not at:
            continue
        s = at[-1]["summary"]
        wanted = f">= {flags:.0%} flags" + (f" and mean x >= {least_x:,.0f}" if least_x else "")
        rows.append(Row(
            case=f"{name}: checkpoint at {minute:g} min", metric=f"flag rate over {s['n']} episodes (mean x "
            f"{s['mean']:,.0f}, 95% CI {s['ci_low']:,.0f}-{s['ci_high']:,.0f})", unit="%",
            flywheel=100.0 * s["flag_rate"], peer=100.0 * rnd["flag_rate"], peer_name="random policy",
            goal=f"{wanted} over >= {GOAL_EPISODES} episodes, CI low > random mean ({judged})",
            met=bool(s["n"] >= GOAL_EPISODES and s["flag_rate"] >= flags and s["ci_low"] > rnd["mean"]
                     and (least_x is None or s["mean"] >= least_x))))
    return rows


def _steps_note(checkpoints: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """How far past its agent-step mark each step checkpoint was taken, and the marks this part did not reach."""
    taken = [c for c in checkpoints if c.get("steps_mark") is not None]
    over = "; ".join(
        f"{c.get('deploy', 'run')} {checkpoint_label(c)} {(c['env_steps'] or 0) - c['steps_mark']:+,.0f} "
        f"({((c['env_steps'] or 0) - c['steps_mark']) / c['steps_mark']:+.1%}; the poll that reached it "
        f"{(c.get('polled_env_steps') or 0) - c['steps_mark']:+,.0f})" for c in taken)
    missed = [f"{d} {checkpoint_label({'steps_mark': m})}" for d in settings.get("deploys", ["run"])
              for m in settings.get("checkpoint_steps") or []
              if not any(c["steps_mark"] == m and c.get("deploy", "run") == d for c in taken)]
    return ("Checkpoints at agent-step marks: each asked for at the first poll that read the actors' agent steps at "
            "or past the mark (the polls come sooner as a mark nears, at least a second apart), its agent steps "
            "read once the checkpoint was written; past the mark by: " + (over or "none taken")
            + (f". Not reached in the training: {', '.join(missed)}." if missed else "."))


def summarize(settings: dict[str, Any], points: list[dict[str, Any]], checkpoints: list[dict[str, Any]],
              random_records: list[dict[str, Any]], loads: dict[str, Any]) -> SuiteResult:
    """Rows, notes and the raw record from what the run and the evaluations produced; no plotting."""
    from flywheel.stats import summarize as stats

    env_id, eps, seeds = settings["env_id"], settings["eval_epsilon"], settings["seeds"]
    deploys = settings.get("deploys", ["run"])
    trained = " and ".join({"run": "flywheel run", "compose": "docker compose"}[d] for d in deploys)
    result = SuiteResult(suite="mario", title=f"{env_id}: checkpoints of {settings['minutes']:g} minutes of "
                                              f"{trained} vs a random policy")
    result.method = (f"one run{'s' if len(deploys) > 1 else ''}; each checkpoint and the random policy play the same "
                     f"{len(seeds)} seeds (mean furthest x_pos, 95% bootstrap CI of the mean)")
    rnd = stats(_x(random_records), _flags(random_records))
    random_entry = {"summary": rnd, "stall_rule": stats(*_stall_rule(random_records))}
    for c in checkpoints:
        c["summary"] = stats(_x(c["episodes"]), _flags(c["episodes"]))
        c["stall_rule"] = stats(*_stall_rule(c["episodes"]))
        if c.get("episodes_also") is not None:
            c["summary_also"] = stats(_x(c["episodes_also"]), _flags(c["episodes_also"]))
        s = c["summary"]
        prefix = f"{c.get('deploy', 'run')}: " if len(deploys) > 1 else ""
        result.rows.append(Row(
            case=f"{prefix}checkpoint at {checkpoint_label(c)} ({c['env_steps'] or 0:,.0f} agent steps"
                 + ("" if c.get("steps_mark") is None else
                    f", {(c['env_steps'] or 0) - c['steps_mark']:+,.0f} over the mark; {c['minute']:g} min") + ")",
            metric=f"mean max x_pos, eps {eps:g} ({_describe(s)})",
            unit="x_pos", flywheel=s["mean"], peer=rnd["mean"], peer_name="random policy (mean)",
            flywheel_runs=_x(c["episodes"]), peer_runs=_x(random_records)))
    kept = [c for c in checkpoints if c.get("best", {}).get("episodes")]
    for c in kept:
        b = c["best"]
        b["summary"] = stats(_x(b["episodes"]), _flags(b["episodes"]))
        b["stall_rule"] = stats(*_stall_rule(b["episodes"]))
        result.rows.append(Row(
            case=f"{c.get('deploy', 'run')}: kept best at {checkpoint_label(c)} (weight version {b['weight_version']}; "
                 f"the newest {c.get('weight_version')})",
            metric=f"mean max x_pos, eps {eps:g} ({_describe(b['summary'])})", unit="x_pos",
            flywheel=b["summary"]["mean"], peer=c["summary"]["mean"],
            peer_name="the checkpoint's newest weights (mean)",
            flywheel_runs=_x(b["episodes"]), peer_runs=_x(c["episodes"])))
    flagged = any((v or 0) > 0 for p in points for v in p.get("flag_rate", {}).values())
    local = [c for c in checkpoints if c.get("deploy", "run") == deploys[0]]
    result.rows += _goal_rows(local, rnd)
    if (row := _compose_row(checkpoints, rnd)) is not None:
        result.rows.append(row)
    if checkpoints:
        result.sections.append(_policy_table(random_entry, checkpoints, settings))
        if settings.get("also_epsilon") is not None:
            result.sections.append(_also_table(rnd, checkpoints, settings))
    if kept:
        result.sections.append(_kept_best_table(kept, settings))
    points_run = [p for p in points if p.get("deploy", "run") == "run"]
    last_part = max((p.get("part", 0) for p in points_run), default=0)
    points_run = [p for p in points_run if p.get("part", 0) == last_part]  # CPU counters restart in every part
    bare = sum(r["length"] for r in random_records) / max(sum(r["seconds"] for r in random_records), 1e-9)
    frame_skip = frames_per_step(env_id)
    model = ScaleModel.from_points(points_run, actors=settings["actors"], frame_skip=frame_skip,
                                   bare_env_steps_per_s=bare)
    if model is not None:
        result.rows += model.rows(env_id)
        result.sections += scale_table(model, targets=((10e6, 8), (50e6, 12), (200e6, 24)))
        result.extra["scale_model"] = model.as_dict()
    one_min = [v["load"][0] for v in points] + [v[0] for v in loads.values()]
    stall = settings["stall_steps"]
    if "run" in deploys:
        result.notes.append(
            f"`flywheel run --env {env_id} --actors {settings['actors']}` with the "
            f"{settings.get('preset', 'pixel')} preset"
            + "".join(f" `--set {s}`" for s in settings["sets"]) + f", {settings['minutes']:g} min from process "
            "start; the bench evaluated nothing while it trained (actor.eval_envs=0 also turns off actor-0's "
            "greedy env; the learner's own evaluations for its kept best ran as in any run of the preset); "
            "checkpoints via POST /control/checkpoint (learner only), each with the kept best of that moment.")
    if settings.get("parts", 1) > 1:
        result.notes.append(
            f"Trained in {settings['parts']} parts, each continuing the last with `flywheel run --resume` "
            "(`--opt resume=1`): minutes and agent steps count from the first part's start, without the time "
            "between parts; the rates and per-process CPU are the last part's.")
    if (branch := settings.get("branched_from")) is not None:
        result.notes.append(
            f"Branched from the training kept in {branch['dir']} at {branch['trained_minutes']:g} min "
            f"({branch['env_steps']:,.0f} agent steps; its sets: {'; '.join(branch['sets']) or 'none'}): a copy of its "
            "run folder went on with `flywheel run --resume` and this run's sets (`--opt branch_from`); minutes and "
            "agent steps count from that training's start, and only this branch's checkpoints are reported.")
    if "compose" in deploys:
        result.notes.append(
            f"`docker compose up --scale actor={settings['actors']}` of the shipped docker-compose.yml (its default "
            f"job; each service reads the preset itself), images built from this checkout on a private Docker "
            f"engine, {settings['minutes']:g} min from `up`; checkpoints via POST /control/checkpoint, copied out "
            "of the learner's volume (its kept best left out). Compose's services report no per-process CPU; "
            "`machine_cpu_s` in the raw points is the whole machine's busy CPU for both.")
    if any(c.get("steps_mark") is not None for c in checkpoints) or settings.get("checkpoint_steps"):
        result.notes.append(_steps_note(checkpoints, settings))
    result.notes += [
        f"Evaluation after training: seeds {seeds[0]}..{seeds[-1]} for every checkpoint and the random policy, "
        f"from the level start with 0..{settings.get('noop_max', 0)} NOOPs, then epsilon {eps:g}; "
        f"{settings['eval_workers']} worker processes. "
        + (f"Stall rule in the headline: an episode also ends after {stall} agent steps without a new max x_pos, "
           "for every policy alike." if stall else
           "No stall rule in the headline (an episode ends at death, flag, the level clock or the env's step "
           "cap); the 250-step stall rule's figures, from the same episodes, are in the table beside."),
        f"Random policy: mean {rnd['mean']:.0f}, {_describe(rnd)}; {bare:.0f} agent steps/s per evaluation "
        "process.",
        f"Load average (1 min) during the run: min {min(one_min):.2f}, median {statistics.median(one_min):.2f}, "
        f"max {max(one_min):.2f}; CPU {_cpu_model()}.",
        f"Any actor's rolling flag rate above 0 at any poll: {'yes' if flagged else 'no'}.",
    ]
    if points:
        p = points[-1]
        result.notes.append(f"Last poll: {p['env_steps']:,.0f} agent steps ({frame_skip * p['env_steps']:,.0f} "
                            f"frames), {p['updates']:,.0f} updates, replay {p['replay_size']:,.0f} transitions.")
    result.extra.update({"settings": settings, "points": points, "checkpoints": checkpoints, "loads": loads,
                         "random": {**random_entry, "episodes": random_records}, "cpu_model": _cpu_model(),
                         "flag_in_training": flagged, "a3c_anchors": [list(a) for a in A3C_ANCHORS]})
    return result


def frames_per_step(env_id: str) -> int:
    """Emulator frames per agent step of a Mario env id: its ``frame_skip`` option, or the default's."""
    return int(split_env_id(env_id)[1].get("frame_skip", MarioConfig.frame_skip))


def plot(ctx: BenchContext, env_id: str, points: list[dict[str, Any]], checkpoints: list[dict[str, Any]],
          rnd: dict[str, Any]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for deploy in dict.fromkeys(p.get("deploy", "run") for p in points):
        mine = [p for p in points if p.get("deploy", "run") == deploy]
        for name in sorted({k for p in mine for k in p["distance"]}):
            xy = [(p["env_steps"], p["distance"][name]) for p in mine
                  if p["distance"].get(name) is not None and p["env_steps"] > 0]
            if xy:
                ax.plot(*zip(*xy, strict=True), linewidth=1, alpha=0.6,
                        label=f"{deploy} {name[:16]}: training episodes, rolling mean")
    for deploy, color in zip(dict.fromkeys(c.get("deploy", "run") for c in checkpoints), ("black", "tab:blue"),
                             strict=False):
        mine = [c for c in checkpoints if c.get("deploy", "run") == deploy]
        xs = [max(float(c["env_steps"] or 1), 1.0) for c in mine]
        ys = [c["summary"]["mean"] for c in mine]
        err = [[m - c["summary"]["ci_low"] for m, c in zip(ys, mine, strict=True)],
               [c["summary"]["ci_high"] - m for m, c in zip(ys, mine, strict=True)]]
        ax.errorbar(xs, ys, yerr=err, fmt="o-", color=color, capsize=4, zorder=4,
                    label=f"{deploy} checkpoints: mean max x_pos, 95% CI ({mine[0]['summary']['n']} seeds)")
        for x, y, c in zip(xs, ys, mine, strict=True):
            ax.annotate(checkpoint_label(c), (x, y), textcoords="offset points", xytext=(5, 8), fontsize=8)
    ax.axhspan(rnd["ci_low"], rnd["ci_high"], color="grey", alpha=0.25, label="random policy: 95% CI of the mean")
    ax.axhline(rnd["mean"], color="grey", linestyle="--", linewidth=1, label=f"random policy: mean {rnd['mean']:.0f}")
    ax.axhline(FLAG_X, color="green", linestyle=":", linewidth=1, label=f"flag (x_pos ~{FLAG_X:,})")
    for (steps, x, label), marker in zip(A3C_ANCHORS, ("s", "^", "*"), strict=True):
        ax.scatter([steps], [x], marker=marker, s=70, color="tab:red", zorder=5, label=label + f" ({steps / 1e6:g}M)")
    ax.set_xscale("log")
    ax.set_xlabel("agent steps (4 emulator frames each), log scale")
    ax.set_ylabel("furthest x_pos in an episode")
    ax.set_ylim(0, FLAG_X + 300)
    ax.set_title(f"{env_id}: Flywheel checkpoints vs a random policy and the public A3C anchor")
    ax.legend(loc="upper left", fontsize=7)
    return save_figure(fig, ctx.plot_path("distance"))
