"""Super Mario Bros 1-1: a timed ``flywheel run``, its checkpoints evaluated afterwards against a random policy.

The suite starts ``flywheel run`` with the default pixel preset (plus any ``set`` overrides) for ``minutes`` and
evaluates nothing while it trains, so evaluation takes no CPU from training. It reads the gateway every ``poll_s``
seconds (agent steps, updates, each actor's rolling distance and flag rate, CPU seconds; the load average too) and,
at each of the ``checkpoint_at`` minutes, asks the learner for a checkpoint through the gateway's
``POST /control/checkpoint`` and copies it to ``ckpt-<M>min/``. After training, every checkpoint and a uniformly
random policy play the same ``eval_episodes`` seeds at epsilon ``eval_epsilon`` in ``eval_workers`` processes
(flywheel.evaluation, with its stall rule), and each is summarised by the mean furthest x_pos with a 95% bootstrap CI.
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, _cpu_model
from flywheel.bench.suites._plots import pyplot, save_figure
from flywheel.bench.suites._scale import ScaleModel, scale_table
from flywheel.envs import env_spec
from flywheel.run import DEFAULT_ENV, default_actors
from flywheel.testing.run import FlywheelRun, Snapshot

DESCRIPTION = "Mario 1-1: checkpoints of a timed flywheel run, evaluated on fixed seeds vs a random policy"
OPTIONS = {
    "minutes": "length of the flywheel run (default 60; --quick 2)",
    "env": f"environment id, options after '?' allowed (default {DEFAULT_ENV}, as flywheel run)",
    "actors": "actor processes (default: as flywheel run, one per core but one for pixels)",
    "set": "extra flywheel run --set overrides, ';'-separated, e.g. learner.lr=0.0002;actor.gamma=0.9 "
           "(actor.eval_envs=0 is always added unless given: no greedy env during training)",
    "checkpoint_at": "minutes at which a checkpoint is taken, comma-separated (default 15,30,45,60; --quick 1,2)",
    "eval_episodes": "evaluation episodes per checkpoint and for the random policy (default 50; --quick 4)",
    "eval_epsilon": "exploration during evaluation (default 0.05)",
    "eval_workers": "evaluation processes (default 2)",
    "stall_steps": "an evaluation episode ends after this many steps without a new max x_pos (default 250)",
    "seed_base": "evaluation seeds are seed_base .. seed_base + eval_episodes - 1 (default 100000)",
    "poll_s": "seconds between reads of the gateway (default 15; --quick 5)",
    "workdir": "folder for the run and its ckpt-<M>min/ copies, kept afterwards (default: a temporary folder)",
}
FRAME_SKIP = 4  # emulator frames per agent step in Flywheel's Mario preprocessing
GOAL_X, STRETCH_X, GOAL_EPISODES, GOAL_MINUTES = 1300.0, 1600.0, 50, 60.0
FLAG_X = 3160  # x_pos of the flag pole in 1-1
# uvipen/Super-mario-bros-A3C as reported: (agent steps, x_pos, label)
A3C_ANCHORS = ((0.58e6, 1670.0, "A3C: greedy x_pos ~1,670"), (1.01e6, FLAG_X, "A3C: first flag"),
               (1.63e6, FLAG_X, "A3C: flag every episode"))
REPO_IMG = Path(__file__).resolve().parents[3] / "docs" / "img"


def _minutes_list(raw: str, minutes: float) -> list[float]:
    try:
        marks = sorted({float(m) for m in raw.split(",") if m.strip()})
    except ValueError:
        raise BenchError(f"--opt checkpoint_at={raw!r}: expected minutes separated by commas") from None
    if not marks or marks[0] <= 0 or marks[-1] > minutes:
        raise BenchError(f"--opt checkpoint_at={raw!r}: each must be in (0, minutes={minutes:g}]")
    return marks


def _point(run: FlywheelRun, snap: Snapshot) -> dict[str, Any]:
    actors = sorted(snap.gauges.get("actor", []), key=lambda g: str(g.get("instance")))
    learner = (snap.gauges.get("learner") or [{}])[0]
    return {
        "t": snap.t - run.started, "env_steps": snap.total("actor", "env_steps_total"),
        "episodes": snap.total("actor", "episodes_total"), "updates": snap.total("learner", "updates_total"),
        "samples": snap.total("learner", "samples_total"),
        "transitions": snap.total("replay", "transitions_received_total"),
        "distance": {str(g.get("instance")): g.get("mario_distance_mean") for g in actors},
        "distance_max_by_actor": {str(g.get("instance")): g.get("mario_distance_max") for g in actors},
        "distance_max": max((g.get("mario_distance_max") or 0.0 for g in actors), default=0.0),
        "flag_rate": {str(g.get("instance")): g.get("mario_flag_rate") for g in actors},
        "epsilon": {str(g.get("instance")): g.get("epsilon") for g in actors},
        "replay_size": sum(g.get("size_transitions", 0.0) for g in snap.gauges.get("replay", [])),
        "loss": learner.get("loss"), "cpu": dict(snap.cpu), "load": list(os.getloadavg()),
    }


def _request_checkpoint(run: FlywheelRun, token: str) -> None:
    req = urllib.request.Request(f"{run.url}/control/checkpoint?target=learner", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {token}", "X-Flywheel-Operator": "bench-mario"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            if resp.status != 202:
                raise BenchError(f"POST /control/checkpoint answered {resp.status}")
    except urllib.error.HTTPError as exc:
        raise BenchError(f"POST /control/checkpoint answered {exc.code}: {exc.read()[:200]!r}") from None


def open_run(workdir: Path, env_id: str, actors: int, sets: list[str]) -> tuple[FlywheelRun, str]:
    """A `flywheel run` (not started yet) in workdir/run whose gateway takes control with the returned token (a
    0600 file in workdir): the runs the mario and atari suites train and checkpoint."""
    workdir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(24)
    token_file = workdir / "control-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    run = FlywheelRun(env_id, workdir / "run", actors=actors, progress_interval=30.0,
                      sets=[*sets, f"gateway.control_token_file={token_file}"], args=["--no-video"])
    return run, token


def _take_checkpoint(run: FlywheelRun, token: str, minute: float, workdir: Path) -> dict[str, Any]:
    """Ask the learner for a checkpoint now, wait for the newer file, copy it to workdir/ckpt-<M>min/."""
    source = run.workdir / "checkpoints" / "learner" / "learner.safetensors"
    before = source.stat().st_mtime_ns if source.exists() else -1
    asked = time.monotonic()
    _request_checkpoint(run, token)
    run.wait_for(lambda: source.exists() and source.stat().st_mtime_ns > before, 180.0, "the learner's checkpoint")
    snap = run.snapshot()
    dest = workdir / f"ckpt-{minute:g}min"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, dest / source.name)
    for extra in (source.parent / "weights-versions.json", run.workdir / "checkpoints" / "run.json"):
        if extra.exists():
            shutil.copy2(extra, dest / extra.name)
    from flywheel.policy import Policy

    policy = Policy.load(dest)
    point = _point(run, snap) if snap is not None else {}
    return {"minute": minute, "dir": str(dest), "t": time.monotonic() - run.started, "asked_t": asked - run.started,
            "env_steps": point.get("env_steps"), "updates": point.get("updates"),
            "replay_size": point.get("replay_size"), "checkpoint_updates": policy.updates,
            "weight_version": policy.weight_version}


def _train(ctx: BenchContext, run: FlywheelRun, token: str, workdir: Path, minutes: float, marks: list[float],
           poll_s: float, points: list[dict[str, Any]], checkpoints: list[dict[str, Any]]) -> None:
    end = run.started + 60 * minutes
    pending = list(marks)
    next_poll = run.started + poll_s
    while pending or time.monotonic() < end:
        run.check_alive()
        due = run.started + 60 * pending[0] if pending else end
        time.sleep(max(0.0, min(next_poll, due) - time.monotonic()))
        now = time.monotonic()
        if now >= next_poll:
            next_poll = now + poll_s
            snap = run.snapshot()
            if snap is not None:
                points.append(_point(run, snap))
                p = points[-1]
                dist = ", ".join(f"{k} {v:.0f}" for k, v in p["distance"].items() if v is not None) or "-"
                ctx.progress(f"{p['t'] / 60:5.1f} min: {p['env_steps']:,.0f} agent steps, {p['updates']:,.0f} "
                             f"updates, distance (rolling) {dist}, load {p['load'][0]:.2f}")
        if pending and now >= due:
            minute = pending.pop(0)
            checkpoints.append(_take_checkpoint(run, token, minute, workdir))
            c = checkpoints[-1]
            ctx.progress(f"checkpoint at {minute:g} min: {c['env_steps'] or 0:,.0f} agent steps, "
                         f"{c['checkpoint_updates']:,} updates -> {c['dir']}")


def _evaluate(ctx: BenchContext, env_id: str, name: str, checkpoint: str | None, seeds: list[int], epsilon: float,
              workers: int, stall_steps: int) -> list[dict[str, Any]]:
    from flywheel.evaluation import evaluate

    done: list[int] = []

    def report(r: dict[str, Any]) -> None:
        done.append(1)
        ctx.progress(f"{name}: episode {len(done)}/{len(seeds)} (seed {r['seed']}): x_pos {r['x_pos_max']}, "
                     f"{r['length']} steps, {r['end']}")

    return evaluate(env_id, seeds, checkpoint=checkpoint, epsilon=epsilon, workers=workers,
                    stall_steps=stall_steps, progress=report)


def run(ctx: BenchContext) -> SuiteResult:
    env_id = ctx.option("env", DEFAULT_ENV)
    minutes = ctx.option_float("minutes", 2.0 if ctx.quick else 60.0)
    actors = ctx.option_int("actors", default_actors(env_spec(env_id).obs_dtype))
    sets = [s.strip() for s in ctx.option("set", "").split(";") if s.strip()]
    if not any(s.startswith("actor.eval_envs=") for s in sets):
        sets.insert(0, "actor.eval_envs=0")  # no greedy env in actor 0 either: evaluation takes no training CPU
    marks = _minutes_list(ctx.option("checkpoint_at", "1,2" if ctx.quick else "15,30,45,60"), minutes)
    episodes = ctx.option_int("eval_episodes", 4 if ctx.quick else 50)
    epsilon = ctx.option_float("eval_epsilon", 0.05)
    workers = ctx.option_int("eval_workers", 2)
    stall_steps = ctx.option_int("stall_steps", 250)
    seed_base = ctx.option_int("seed_base", 100_000)
    poll_s = ctx.option_float("poll_s", 5.0 if ctx.quick else 15.0)
    if episodes < 1 or workers < 1 or stall_steps < 0 or actors < 1:
        raise BenchError("eval_episodes, eval_workers and actors must be >= 1, stall_steps >= 0")
    seeds = list(range(seed_base, seed_base + episodes))
    kept = ctx.option("workdir", "")
    tmp = None if kept else tempfile.TemporaryDirectory(prefix="flywheel-bench-mario-")
    workdir = Path(kept or tmp.name).resolve()  # type: ignore[union-attr]
    try:
        run_, token = open_run(workdir, env_id, actors, sets)
        loads: dict[str, Any] = {"start": list(os.getloadavg())}
        points: list[dict[str, Any]] = []
        checkpoints: list[dict[str, Any]] = []
        ctx.progress(f"flywheel run --env {env_id} --actors {actors} {' '.join('--set ' + s for s in sets)} for "
                     f"{minutes:g} min, checkpoints at {', '.join(f'{m:g}' for m in marks)} min (log {run_.log})")
        with run_:
            _train(ctx, run_, token, workdir, minutes, marks, poll_s, points, checkpoints)
            loads["end_of_training"] = list(os.getloadavg())
        ctx.progress(f"evaluating {len(checkpoints)} checkpoints and the random policy on seeds {seeds[0]}.."
                     f"{seeds[-1]} (epsilon {epsilon:g}, {workers} workers, stall rule {stall_steps} steps)")
        random_records = _evaluate(ctx, env_id, "random policy", None, seeds, epsilon, workers, stall_steps)
        for c in checkpoints:
            c["episodes"] = _evaluate(ctx, env_id, f"checkpoint {c['minute']:g} min", c["dir"], seeds, epsilon,
                                      workers, stall_steps)
        loads["end"] = list(os.getloadavg())
        settings = {"env_id": env_id, "minutes": minutes, "actors": actors, "sets": sets, "checkpoint_at": marks,
                    "eval_episodes": episodes, "eval_epsilon": epsilon, "eval_workers": workers,
                    "stall_steps": stall_steps, "seeds": seeds, "workdir": str(workdir) if kept else None}
        result = summarize(settings, points, checkpoints, random_records, loads)
        try:  # after an hour of training the numbers matter more than the picture: no plot is a note
            if checkpoints:
                result.plots.append(_plot(ctx, env_id, points, checkpoints, result.extra["random"]["summary"]))
                if not ctx.quick and REPO_IMG.is_dir():  # --quick plots stay out of the docs
                    shutil.copy2(ctx.out_dir / result.plots[-1], REPO_IMG / "mario_distance.png")
        except BenchError as exc:
            result.notes.append(f"No plot: {exc}")
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def _x(records: list[dict[str, Any]]) -> list[float]:
    return [float(r["x_pos_max"] or 0) for r in records]


def summarize(settings: dict[str, Any], points: list[dict[str, Any]], checkpoints: list[dict[str, Any]],
              random_records: list[dict[str, Any]], loads: dict[str, Any]) -> SuiteResult:
    """Rows, notes and the raw record from what the run and the evaluations produced; no plotting."""
    from flywheel.evaluation import summarize as stats

    env_id, eps, seeds = settings["env_id"], settings["eval_epsilon"], settings["seeds"]
    result = SuiteResult(suite="mario", title=f"{env_id}: checkpoints of {settings['minutes']:g} minutes of "
                                              "flywheel run vs a random policy")
    result.method = (f"one run; each checkpoint and the random policy play the same {len(seeds)} seeds "
                     f"(mean furthest x_pos, 95% bootstrap CI of the mean)")
    rnd = stats(_x(random_records), [r["flag"] for r in random_records])
    for c in checkpoints:
        c["summary"] = stats(_x(c["episodes"]), [r["flag"] for r in c["episodes"]])
        s = c["summary"]
        result.rows.append(Row(
            case=f"checkpoint at {c['minute']:g} min ({c['env_steps'] or 0:,.0f} agent steps)",
            metric=f"mean max x_pos, eps {eps:g} (median {s['median']:.0f}, 95% CI {s['ci_low']:.0f}-"
                   f"{s['ci_high']:.0f}, flags {s['flag_rate']:.0%})",
            unit="x_pos", flywheel=s["mean"], peer=rnd["mean"], peer_name="random policy (mean)",
            flywheel_runs=_x(c["episodes"]), peer_runs=_x(random_records)))
    flagged = any((v or 0) > 0 for p in points for v in p.get("flag_rate", {}).values())
    if checkpoints:
        last = checkpoints[-1]
        s = last["summary"]
        result.rows.append(Row(
            case=f"goal: checkpoint at {last['minute']:g} min", metric=f"mean max x_pos over {s['n']} episodes",
            unit="x_pos", flywheel=s["mean"], peer=rnd["mean"], peer_name="random policy (mean)",
            goal=f">= {GOAL_X:,.0f} at {GOAL_MINUTES:g} min over >= {GOAL_EPISODES} episodes, CI low > random mean",
            met=bool(last["minute"] >= GOAL_MINUTES and s["n"] >= GOAL_EPISODES and s["mean"] >= GOAL_X
                     and s["ci_low"] > rnd["mean"])))
        result.rows.append(Row(
            case=f"stretch: checkpoint at {last['minute']:g} min", metric="mean max x_pos; a flag in training",
            unit="x_pos", flywheel=s["mean"], peer=rnd["mean"], peer_name="random policy (mean)",
            goal=f">= {STRETCH_X:,.0f} and a flag during training ({'yes' if flagged else 'no'})",
            met=bool(s["mean"] >= STRETCH_X and flagged)))
    bare = sum(r["length"] for r in random_records) / max(sum(r["seconds"] for r in random_records), 1e-9)
    model = ScaleModel.from_points(points, actors=settings["actors"], frame_skip=FRAME_SKIP, bare_env_steps_per_s=bare)
    if model is not None:
        result.rows += model.rows(env_id)
        result.sections += scale_table(model, targets=((10e6, 8), (50e6, 12), (200e6, 24)))
        result.extra["scale_model"] = model.as_dict()
    one_min = [v["load"][0] for v in points] + [v[0] for v in loads.values()]
    result.notes += [
        f"`flywheel run --env {env_id} --actors {settings['actors']}` with the pixel preset"
        + "".join(f" `--set {s}`" for s in settings["sets"]) + f", {settings['minutes']:g} min from process start; "
        "nothing was evaluated while it trained (actor.eval_envs=0 also turns off actor-0's greedy env); "
        "checkpoints via POST /control/checkpoint (learner only).",
        f"Evaluation after training: seeds {seeds[0]}..{seeds[-1]} for every checkpoint and the random policy, "
        f"epsilon {eps:g}, {settings['eval_workers']} worker processes. Stall rule: an episode also ends after "
        f"{settings['stall_steps']} agent steps without a new max x_pos (a stuck Mario otherwise walks ~2,400 steps "
        "until the clock kills it), for every policy alike.",
        f"Random policy: mean {rnd['mean']:.0f} (95% CI {rnd['ci_low']:.0f}-{rnd['ci_high']:.0f}), median "
        f"{rnd['median']:.0f}, flags {rnd['flag_rate']:.0%}; {bare:.0f} agent steps/s per evaluation process.",
        f"Load average (1 min) during the run: min {min(one_min):.2f}, median {statistics.median(one_min):.2f}, "
        f"max {max(one_min):.2f}; CPU {_cpu_model()}.",
        f"Any actor's rolling flag rate above 0 at any poll: {'yes' if flagged else 'no'}.",
    ]
    if points:
        p = points[-1]
        result.notes.append(f"Last poll: {p['env_steps']:,.0f} agent steps ({FRAME_SKIP * p['env_steps']:,.0f} "
                            f"frames), {p['updates']:,.0f} updates, replay {p['replay_size']:,.0f} transitions.")
    result.extra.update({"settings": settings, "points": points, "checkpoints": checkpoints, "loads": loads,
                         "random": {"summary": rnd, "episodes": random_records}, "cpu_model": _cpu_model(),
                         "flag_in_training": flagged, "a3c_anchors": [list(a) for a in A3C_ANCHORS]})
    return result


def _plot(ctx: BenchContext, env_id: str, points: list[dict[str, Any]], checkpoints: list[dict[str, Any]],
          rnd: dict[str, Any]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for name in sorted({k for p in points for k in p["distance"]}):
        xy = [(p["env_steps"], p["distance"][name]) for p in points
              if p["distance"].get(name) is not None and p["env_steps"] > 0]
        if xy:
            ax.plot(*zip(*xy, strict=True), linewidth=1, alpha=0.7, label=f"{name}: training episodes, rolling mean")
    xs = [max(float(c["env_steps"] or 1), 1.0) for c in checkpoints]
    ys = [c["summary"]["mean"] for c in checkpoints]
    err = [[m - c["summary"]["ci_low"] for m, c in zip(ys, checkpoints, strict=True)],
           [c["summary"]["ci_high"] - m for m, c in zip(ys, checkpoints, strict=True)]]
    ax.errorbar(xs, ys, yerr=err, fmt="o-", color="black", capsize=4, zorder=4,
                label=f"checkpoints: mean max x_pos, 95% CI ({checkpoints[0]['summary']['n']} seeds, eps 0.05)")
    for x, y, c in zip(xs, ys, checkpoints, strict=True):
        ax.annotate(f"{c['minute']:g} min", (x, y), textcoords="offset points", xytext=(5, 8), fontsize=8)
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
