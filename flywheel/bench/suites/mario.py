"""Super Mario Bros 1-1: a timed ``flywheel run`` (or the compose stack), its checkpoints evaluated afterwards
against a random policy.

The suite starts ``flywheel run`` with the env id's preset (the mario preset for Mario; plus any ``set`` overrides)
for ``minutes`` and evaluates nothing of its own while it trains (the learner's evaluations for its kept best run, as
in any flywheel run of the preset). It reads the gateway every ``poll_s`` seconds (agent steps, updates, each actor's
rolling distance and flag rate, CPU seconds; the load average too) and, at each of the ``checkpoint_at`` minutes, asks
the learner for a checkpoint through the gateway's ``POST /control/checkpoint`` and copies it to ``ckpt-<M>min/``,
with the learner's kept best of that moment (best.safetensors, what ``flywheel play`` and ``flywheel export`` take) in
``ckpt-<M>min/kept-best/``; the same at each ``checkpoint_steps`` mark (agent steps; ``ckpt-<N>steps/``), at the first
poll that reads it reached. ``deploy=compose`` trains the shipped docker-compose.yml instead (``docker compose up
--scale actor=<actors>``, built and run on a private Docker engine; flywheel.testing.compose), and
``deploy=run,compose`` trains both, one after the other, for the same minutes. After training, every checkpoint and a
uniformly random policy play the same ``eval_episodes`` seeds at epsilon ``eval_epsilon`` in ``eval_workers``
processes (flywheel.evaluation: level start, 0..``noop_max`` no-ops, no stall rule unless ``stall_steps`` is set; the
stall rule's figure is reported beside), each summarised by the mean and median furthest x_pos with 95% bootstrap CIs
and the flag rate with its Wilson interval; each kept best plays the same seeds too (unless ``eval_best=0``), reported
beside its checkpoint's newest weights (the headline and the goals judge the newest).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from flywheel import presets
from flywheel.bench.parts.mario_checkpoint import Training, progress_point, take_checkpoint
from flywheel.bench.parts.mario_report import checkpoint_label, plot, summarize
from flywheel.bench.parts.mario_state import RUN_FOLDER, MarioState, parse_minutes, parse_steps, steps_wait
from flywheel.bench.parts.records import furthest_x
from flywheel.bench.runner import BenchContext, BenchError, SuiteResult
from flywheel.launch.run import default_actors
from flywheel.presets import DEFAULT_ENV
from flywheel.testing.compose import ComposeStack
from flywheel.testing.run import FlywheelRun, Snapshot

DESCRIPTION = ("Mario 1-1: checkpoints of a timed flywheel run (or docker compose), evaluated on fixed seeds vs a "
               "random policy")
OPTIONS = {
    "minutes": "length of the flywheel run (default 60; --quick 2)",
    "env": f"environment id, options after '?' allowed (default {DEFAULT_ENV}, as flywheel run)",
    "actors": "actor processes (default: as flywheel run, one per core less the preset's run.spare_cores)",
    "set": "extra flywheel run --set overrides, ';'-separated, e.g. learner.lr=0.0002;actor.gamma=0.9 "
           "(actor.eval_envs=0 is always added unless given: no greedy env during training)",
    "train_seed": "a training run's seed: the learner's network initialisation and the replay's sampling "
                  "(learner.seed, replay.seed; actors stay unseeded, as in scripts/measure_cartpole_target.py); "
                  "deploy=compose passes it as FLYWHEEL_LEARNER_SEED and FLYWHEEL_REPLAY_SEED; default none",
    "checkpoint_at": "minutes at which a checkpoint is taken, comma-separated, counted from the first part's start "
                     "(default: every 15 minutes of this part and its end; --quick every minute)",
    "checkpoint_steps": "agent steps at which a checkpoint is also taken, comma-separated whole numbers in increasing "
                        "order (e.g. 250000,500000), counted from the first part's start; a mark an earlier part "
                        "took is not taken again (default: none)",
    "deploy": "what trains: run (flywheel run, default), compose (docker compose up --scale actor=<actors> of the "
              "shipped compose file on a private Docker engine) or run,compose (both, one after the other)",
    "eval_episodes": "evaluation episodes per checkpoint and for the random policy (default 100; --quick 4)",
    "eval_epsilon": "exploration during evaluation (default 0.05)",
    "also_epsilon": "a second exploration rate every checkpoint also plays the same seeds at, reported in a table "
                    "beside the headline (e.g. 0.001; default: none)",
    "eval_workers": "evaluation processes (default 2)",
    "eval_best": "1 (default): also play each checkpoint's kept best; 0: the newest weights only (the kept bests of "
                 "this part's checkpoints are copied all the same, marked unplayed, and no later part plays them)",
    "noop_max": "each evaluation episode starts with 0..noop_max NOOP actions (default 30)",
    "stall_steps": "an evaluation episode ends after this many steps without a new max x_pos (default 0: never; "
                   "the 250-step rule's figure is reported beside either way)",
    "seed_base": "evaluation seeds are seed_base .. seed_base + eval_episodes - 1 (default 100000)",
    "poll_s": "seconds between reads of the gateway (default 15; --quick 5)",
    "workdir": "folder for the run and its ckpt-<M>min/ copies, kept afterwards (default: a temporary folder)",
    "resume": "1: continue the training kept in --opt workdir=DIR (flywheel run --resume) for `minutes` more; "
              "checkpoint_at counts from the first part's start; earlier parts' checkpoints and evaluations, kept "
              "in DIR/bench-mario-state.json, are reported with the new ones (the same recipe and evaluation only); "
              "with minutes=0 nothing trains: the kept checkpoints not played yet (an evaluation cut off) are "
              "played and the whole run reported",
    "branch_from": "DIR: a new training that starts where the one kept in DIR (an earlier --opt workdir) ended: its "
                   "run folder copied into this --opt workdir (new) and continued with flywheel run --resume and "
                   "this run's sets (e.g. two arms of a trial from the same hour of training); checkpoint_at and "
                   "checkpoint_steps count from DIR's first part's start, DIR's checkpoints stay its own",
    "docs_plot": "1: copy the plot to docs/img/mario_distance.png, the figure docs/benchmarks/mario.md shows "
                 "(default 0: the plot stays in --out)",
}
REPO_IMG = Path(__file__).resolve().parents[3] / "docs" / "img"


def open_run(workdir: Path, env_id: str, actors: int, sets: list[str],
             resume: bool = False) -> tuple[FlywheelRun, str]:
    """A `flywheel run` (not started yet) in workdir/run whose gateway takes control with the returned token (a
    0600 file in workdir): the runs the mario and atari suites train and checkpoint."""
    workdir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(24)
    token_file = workdir / "control-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    run = FlywheelRun(env_id, workdir / RUN_FOLDER, actors=actors, progress_interval=30.0,
                      sets=[*sets, f"gateway.control_token_file={token_file}"],
                      args=["--no-video", *(["--resume"] if resume else [])])
    return run, token


def train_and_poll(ctx: BenchContext, run: Training, minutes: float, poll_s: float, points: list[dict[str, Any]],
                   point: Callable[[Snapshot], dict[str, Any]], describe: Callable[[dict[str, Any]], str],
                   marks: Sequence[float] = (), at_mark: Callable[[float], None] | None = None,
                   steps: Sequence[float] = (), at_steps: Callable[[float, float], None] | None = None) -> None:
    """Let ``run`` train for ``minutes``, reading the gateway every ``poll_s`` seconds into ``points`` (one
    progress line each, ``describe`` saying what the suite watches) and calling ``at_mark`` at each minute mark;
    ``at_steps(mark, polled)`` at the first poll whose agent steps reach each of ``steps`` (this run's steps; polls
    come sooner as the next nears, one mark per poll)."""
    end = run.started + 60 * minutes
    pending = list(marks)
    steps_pending = list(steps)
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
                points.append(point(snap))
                p = points[-1]
                ctx.progress(f"{p['t'] / 60:5.1f} min: {p['env_steps']:,.0f} agent steps, {p['updates']:,.0f} "
                             f"updates, {describe(p)}, load {p['load'][0]:.2f}")
                if steps_pending and p["env_steps"] >= steps_pending[0]:
                    reached = steps_pending.pop(0)
                    if at_steps is not None:
                        at_steps(reached, p["env_steps"])
                    next_poll = time.monotonic()  # the next mark may be passed too: read again now
                elif steps_pending:
                    next_poll = now + steps_wait(points, steps_pending[0], poll_s)
        if pending and now >= due:
            minute = pending.pop(0)
            if at_mark is not None:
                at_mark(minute)


def _train(ctx: BenchContext, run: Training, token: str, workdir: Path, minutes: float, marks: list[float],
           poll_s: float, points: list[dict[str, Any]], checkpoints: list[dict[str, Any]],
           offset: float = 0.0, steps: Sequence[int] = (), steps_offset: float = 0.0) -> None:
    def take(minute: float, mark: int | None = None, polled: float = 0.0) -> None:  # minute, mark: from the start
        checkpoints.append(take_checkpoint(run, token, minute, workdir, mark, polled))
        c = checkpoints[-1]
        at = f"{minute:g} min" if mark is None else \
            f"the {mark:,} agent steps mark ({minute:g} min; the poll read {polled + steps_offset:,.0f})"
        ctx.progress(f"checkpoint at {at}: {(c['env_steps'] or 0) + steps_offset:,.0f} agent steps, "
                     f"{c['checkpoint_updates']:,} updates -> {c['dir']}")

    def at_steps(mark: float, polled: float) -> None:  # mark and polled: this part's agent steps
        take(round(offset + (time.monotonic() - run.started) / 60, 2), round(mark + steps_offset), polled)

    def distance(p: dict[str, Any]) -> str:
        return "distance (rolling) " + (", ".join(f"{k} {v:.0f}" for k, v in p["distance"].items()
                                                  if v is not None) or "-")

    train_and_poll(ctx, run, minutes, poll_s, points, lambda snap: progress_point(run, snap), distance,
                   [m - offset for m in marks], lambda minute: take(offset + minute),
                   [m - steps_offset for m in steps], at_steps)


def _evaluate(ctx: BenchContext, env_id: str, name: str, checkpoint: str | None, seeds: list[int], epsilon: float,
              workers: int, stall_steps: int, noop_max: int) -> list[dict[str, Any]]:
    from flywheel.evaluation import evaluate

    done: list[int] = []

    def report(r: dict[str, Any]) -> None:
        done.append(1)
        ctx.progress(f"{name}: episode {len(done)}/{len(seeds)} (seed {r['seed']}): x {furthest_x(r):.0f}, "
                     f"{r['length']} steps, {r['end']}")

    return evaluate(env_id, seeds, checkpoint=checkpoint, epsilon=epsilon, workers=workers,
                    stall_steps=stall_steps, noop_max=noop_max, progress=report)


DEPLOYS = ("run", "compose")


def _deploys(raw: str) -> list[str]:
    chosen = [d.strip() for d in raw.split(",") if d.strip()]
    if not chosen or any(d not in DEPLOYS for d in chosen) or len(set(chosen)) != len(chosen):
        raise BenchError(f"--opt deploy={raw!r}: expected run, compose or run,compose")
    return chosen


def _seed_sets(train_seed: int | None) -> list[str]:
    """What ``--opt train_seed`` sets: the learner's and the replay's seeds (compose: their FLYWHEEL_*_SEED)."""
    return [] if train_seed is None else [f"learner.seed={train_seed}", f"replay.seed={train_seed}"]


def _open(deploy: str, stack: ExitStack, workdir: Path, env_id: str, actors: int,
          sets: list[str], resume: bool = False, train_seed: int | None = None) -> tuple[Training, str]:
    """The training for ``deploy`` (not started yet) and the control token its gateway takes."""
    if deploy == "run":
        return open_run(workdir, env_id, actors, sets, resume)
    shipped = {"actor.eval_envs=0", *_seed_sets(train_seed)}  # the compose actors' default; the seed's variables
    if [s for s in sets if s not in shipped]:
        raise BenchError(f"deploy=compose trains the compose file as shipped: no --opt set ({'; '.join(sets)})")
    from flywheel.testing.dockerhost import EngineUnavailable, docker_engine
    from flywheel.testing.ports import free_port

    token = secrets.token_hex(24)
    try:
        engine = stack.enter_context(docker_engine())
        compose = ComposeStack(engine, workdir, env_id=env_id, actors=actors, port=free_port(), token=token,
                               project="flywheel-bench-mario", seed=train_seed)
        compose.build()
    except EngineUnavailable as exc:
        raise BenchError(f"deploy=compose: {exc}") from None
    return compose, token


def run(ctx: BenchContext) -> SuiteResult:
    env_id = ctx.option("env", DEFAULT_ENV)
    minutes = ctx.option_float("minutes", 2.0 if ctx.quick else 60.0)
    preset = presets.name_for_env(env_id)  # the run's own choice: flywheel run picks it from the env id too
    actors = ctx.option_int("actors", default_actors(presets.load(preset)))
    deploys = _deploys(ctx.option("deploy", "run"))
    sets = [s.strip() for s in ctx.option("set", "").split(";") if s.strip()]
    if not any(s.startswith("actor.eval_envs=") for s in sets):
        sets.insert(0, "actor.eval_envs=0")  # no greedy env in actor 0 either: evaluation takes no training CPU
    train_seed = ctx.option_int("train_seed", 0) if ctx.option("train_seed", "") else None
    if train_seed is not None and train_seed < 0:
        raise BenchError(f"--opt train_seed={train_seed}: a seed is a whole number >= 0")
    sets += _seed_sets(train_seed)
    resume = bool(ctx.option_int("resume", 0))
    if resume and (not ctx.option("workdir", "") or deploys != ["run"]):
        raise BenchError("--opt resume=1 continues a flywheel run kept with --opt workdir=DIR (deploy=run): "
                         "name the same workdir")
    branch_from = ctx.option("branch_from", "")
    if branch_from and (resume or not ctx.option("workdir", "") or deploys != ["run"]):
        raise BenchError("--opt branch_from=DIR starts a new training, kept in a new --opt workdir, from DIR's end "
                         "with flywheel run (deploy=run; not with resume=1: a branch once made goes on with resume=1 "
                         "and its own workdir)")
    episodes = ctx.option_int("eval_episodes", 4 if ctx.quick else 100)
    epsilon = ctx.option_float("eval_epsilon", 0.05)
    also = ctx.option_float("also_epsilon", -1.0)
    workers = ctx.option_int("eval_workers", 2)
    eval_best = ctx.option_int("eval_best", 1)
    noop_max = ctx.option_int("noop_max", 30)
    stall_steps = ctx.option_int("stall_steps", 0)
    seed_base = ctx.option_int("seed_base", 100_000)
    step_marks = parse_steps(ctx.option("checkpoint_steps", "")) if ctx.option("checkpoint_steps", "") else []
    poll_s = ctx.option_float("poll_s", 5.0 if ctx.quick else 15.0)
    if episodes < 1 or workers < 1 or stall_steps < 0 or actors < 1 or noop_max < 0 or eval_best not in (0, 1):
        raise BenchError("eval_episodes, eval_workers and actors must be >= 1, stall_steps and noop_max >= 0, "
                         "eval_best 0 or 1")
    for name, value in (("eval_epsilon", epsilon), ("also_epsilon", None if also == -1.0 else also)):
        if value is not None and not 0.0 <= value <= 1.0:
            raise BenchError(f"--opt {name}={value:g}: an exploration rate is in [0, 1]")
    evaluate_only = resume and minutes == 0
    if minutes < 0 or (minutes == 0 and not resume):
        raise BenchError(f"--opt minutes={minutes:g}: a training needs minutes > 0 (minutes=0 only with resume=1: "
                         "finish the evaluation of a kept training)")
    if evaluate_only and (ctx.option("checkpoint_at", "") or step_marks):
        raise BenchError("--opt resume=1 with minutes=0 trains nothing, so it takes no checkpoint_at or "
                         "checkpoint_steps: it plays the checkpoints the kept training holds")
    seeds = list(range(seed_base, seed_base + episodes))
    recipe = {"env_id": env_id, "preset": preset, "actors": actors, "deploys": deploys, "sets": sets}
    evaluation = {"seeds": seeds, "eval_epsilon": epsilon, "also_epsilon": also if also >= 0 else None,
                  "noop_max": noop_max, "stall_steps": stall_steps}
    with ctx.workdir("mario") as workdir:
        state = MarioState(recipe, evaluation)
        if resume:
            state = MarioState.load(workdir)
            state.check_same(recipe, evaluation)
        elif branch_from:
            state = MarioState.branch(Path(branch_from), workdir, recipe, evaluation)
        offset = state.trained_minutes
        step = 1.0 if ctx.quick else 15.0  # a checkpoint every `step` minutes of the part, and at its end
        default_marks = sorted({offset + step * k for k in range(1, int(minutes // step) + 1)} | {offset + minutes})
        if evaluate_only:  # the minutes and agent-step marks the kept training took its checkpoints at
            marks = sorted({c["minute"] for c in state.checkpoints if c.get("steps_mark") is None})
            step_marks = sorted({c["steps_mark"] for c in state.checkpoints if c.get("steps_mark") is not None})
            ctx.progress(f"nothing trains (minutes=0): the training kept in {workdir} ran {offset:g} min; its "
                         "checkpoints not played yet are played now")
        else:
            marks = parse_minutes(ctx.option("checkpoint_at", ",".join(f"{m:g}" for m in default_marks)), minutes,
                                  offset)
        to_take = {deploy: state.steps_to_take(step_marks, deploy) for deploy in deploys}
        since = f" in {branch_from}, branched from there" if branch_from else ""
        if branch_from:  # the marks are good: now the copy
            state.copy_branch(workdir)
        steps_offset = state.env_steps
        loads: dict[str, Any] = {"start": list(os.getloadavg())}
        for deploy in [] if evaluate_only else deploys:
            where = workdir / deploy if len(deploys) > 1 else workdir
            points: list[dict[str, Any]] = []
            found: list[dict[str, Any]] = []
            with ExitStack() as stack:
                training, token = _open(deploy, stack, where, env_id, actors, sets, resume or bool(branch_from),
                                        train_seed)
                what = (f"flywheel run --env {env_id} --actors {actors} {' '.join('--set ' + s for s in sets)}"
                        + (" --resume" if resume or branch_from else "") if deploy == "run" else
                        f"docker compose up --scale actor={actors} (env {env_id}"
                        f"{'' if train_seed is None else f', learner and replay seed {train_seed}'})")
                also_at = f" and {', '.join(f'{m:,}' for m in to_take[deploy])} agent steps" if to_take[deploy] else ""
                ctx.progress(f"{what} for {minutes:g} min{f' (after {offset:g} min before{since})' if offset else ''}, "
                             f"checkpoints at {', '.join(f'{m:g}' for m in marks)} min{also_at} (log {training.log})")
                loads[f"{deploy}_start"] = list(os.getloadavg())
                stack.enter_context(training)
                _train(ctx, training, token, where, minutes, marks, poll_s, points, found, offset, to_take[deploy],
                       steps_offset)
                loads[f"{deploy}_end_of_training"] = list(os.getloadavg())
            state.add_part(minutes, [{**p, "deploy": deploy} for p in points],
                           [{**c, "deploy": deploy} for c in found], loads, advance=deploy == deploys[-1])
            state.save(workdir)
        loads["end_of_training"] = list(os.getloadavg())
        if not eval_best:  # marked before any evaluation: one stopped midway leaves them marked (run_carry reads it)
            for c in [c for c in state.checkpoints if c.get("best") and not {"episodes", "unplayed"} & set(c["best"])]:
                c["best"]["unplayed"] = "eval_best=0"
            state.save(workdir)
        pending = [c for c in state.checkpoints if "episodes" not in c]
        ctx.progress(f"evaluating {len(pending)} checkpoints{' and the random policy' if state.random is None else ''}"
                     f" on seeds {seeds[0]}..{seeds[-1]} (epsilon {epsilon:g}, 0..{noop_max} no-ops, {workers} "
                     f"workers, stall rule {stall_steps or 'off'})")
        args = (seeds, epsilon, workers, stall_steps, noop_max)
        if state.random is None:
            state.random = _evaluate(ctx, env_id, "random policy", None, *args)
            state.save(workdir)
        for c in pending:
            name = f"{c['deploy']} checkpoint {checkpoint_label(c)}"
            c["episodes"] = _evaluate(ctx, env_id, name, c["dir"], *args)
            if also >= 0:  # the random policy ignores epsilon: its episodes above stand for both rates
                c["episodes_also"] = _evaluate(ctx, env_id, f"{name}, epsilon {also:g}", c["dir"], seeds, also,
                                               *args[2:])
            state.save(workdir)
        for c in [c for c in state.checkpoints if c.get("best") and not {"episodes", "unplayed"} & set(c["best"])]:
            c["best"]["episodes"] = _evaluate(ctx, env_id, f"{c['deploy']} kept best at {checkpoint_label(c)}",
                                              c["best"]["file"], *args)
            state.save(workdir)
        loads["end"] = list(os.getloadavg())
        settings = {**recipe, **evaluation, "minutes": state.trained_minutes, "checkpoint_at": marks,
                    "checkpoint_steps": step_marks,
                    "eval_episodes": episodes, "eval_workers": workers, "eval_best": bool(eval_best),
                    "parts": state.training_parts, "branched_from": state.branched_from,
                    "workdir": str(workdir) if ctx.option("workdir", "") else None}
        result = summarize(settings, state.points, state.checkpoints, state.random, loads)
        try:  # after an hour of training the numbers matter more than the picture: no plot is a note
            if state.checkpoints:
                result.plots.append(plot(ctx, env_id, state.points, state.checkpoints,
                                         result.extra["random"]["summary"]))
                if ctx.option_int("docs_plot", 0) and REPO_IMG.is_dir():  # only the run the docs cite
                    shutil.copy2(ctx.out_dir / result.plots[-1], REPO_IMG / "mario_distance.png")
        except BenchError as exc:
            result.notes.append(f"No plot: {exc}")
        return result
