"""A paired Mario trial: arms (settings over the default job) x training seeds, each a `flywheel bench mario` run.

With one arm it is a series of runs of one recipe, e.g. the headline of the default job on the test seeds
(``--arm default= --eval test``): the same runs, records and resumption, and a report that aggregates the runs at
every checkpoint (scripts/mario_runs.py with one side) instead of pairing them.

Every arm runs every training seed, one run at a time; the arms' order alternates from seed to seed (A B, B A, ...)
so a machine that slows through the day weighs on every arm alike. Each run keeps its folder under ``--root``
(``ARM/seedS/out/mario.json`` when done): running the same command again, in a later session, skips what is done,
starts again a run that was cut off in its training and finishes one cut off in its evaluation (bench mario's
``resume=1`` with ``minutes=0``; the folder carried to a new machine with scripts/run_carry.py). Each run is
appended to ``ROOT/trial.jsonl`` with its start, end, the load average at both, the CPU model and the checkout's
commit. ``--report`` (also at the end) compares every arm with the
first, paired by training seed, at every checkpoint (minutes and agent-step marks) with scripts/mario_runs.py
``--paired``, into ``ROOT/report.md`` and ``ROOT/report-<checkpoint>-<arm>.json`` (with ``--also-epsilon E``, also
at that epsilon: ``ROOT/report-<checkpoint>-<arm>-epsE.json``). Run it from a clone of its own:
the bench imports parts of flywheel as it goes, so editing the checkout it runs from can change a run midway.

With ``--branch-from DIR`` (``{seed}`` in it standing for the training seed) every run is a branch of a kept
training (bench mario's ``branch_from``): the arms go on from the same hour of training, the pairing at its
tightest (e.g. a change meant for the hours after the first).

Decide on validation seeds (``--eval validation``: evaluation seeds 300000-300099) and report on the test seeds
(``--eval test``: 500000-500099), which no decision may have seen.

    python scripts/mario_trial.py --root /work/trials/ema --arm default= --arm ema=learner.acting_ema=0.001 \
        --seeds 1,2,3 --minutes 60 --checkpoint-at 30,60 --checkpoint-steps 250000,500000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flywheel.bench.parts.mario_state import MarioState
from flywheel.bench.runner import BenchError, _cpu_model

EVAL_SEED_BASES = {"validation": 300_000, "test": 500_000}
RESULT = "mario.json"
DEFAULT = "the default"


def arms_of(specs: list[str]) -> dict[str, str]:
    """``NAME=SETTINGS`` (settings as bench mario's ``set=`` option takes them: ``a.b=1;c.d=2``; empty: the default;
    an item ``env=ID`` is the arm's env id, bench mario's ``env=``)."""
    arms: dict[str, str] = {}
    for spec in specs:
        name, sep, sets = spec.partition("=")
        if not sep or not name or not name.replace("-", "").replace("_", "").isalnum() or name in arms:
            raise SystemExit(f"mario_trial: --arm takes NAME=SETTINGS with a new name of letters, digits, - and _; "
                             f"got {spec!r}")
        split_arm(name, sets)
        arms[name] = sets
    if not arms:
        raise SystemExit("mario_trial: name at least one --arm (with two or more, the first is the one the rest are "
                         "compared to)")
    return arms


def split_arm(name: str, sets: str) -> tuple[str | None, str]:
    """An arm's env id (its one ``env=`` item, if any) and the rest of its settings, as bench mario's ``set=``."""
    items = [item for item in sets.split(";") if item]
    envs = [item.removeprefix("env=") for item in items if item.startswith("env=")]
    if len(envs) > 1:
        raise SystemExit(f"mario_trial: arm {name!r} names more than one env= id: {sets!r}")
    return (envs[0] if envs else None), ";".join(item for item in items if not item.startswith("env="))


def plan(arms: dict[str, str], seeds: list[int]) -> list[tuple[str, int]]:
    """(arm, seed) in the order they run: every arm for one seed, the arms' order reversed on every other seed."""
    names = list(arms)
    return [(arm, seed) for i, seed in enumerate(seeds) for arm in (names if i % 2 == 0 else names[::-1])]


def trained(folder: Path) -> bool:
    """Whether the run in ``folder`` finished its training (its bench state holds a part): a run cut off after that,
    in its evaluation, is finished, not started again."""
    try:
        return bool(MarioState.load(folder / "work").parts)
    except BenchError:
        return False


def bench_command(args: argparse.Namespace, arm: str, sets: str, seed: int, folder: Path,
                  finish: bool = False) -> list[str]:
    """The `flywheel bench mario` command of one run (``finish``: the one that plays what its cut-off evaluation
    left, training nothing: bench mario's resume=1 with minutes=0)."""
    opts = {"minutes": "0" if finish else f"{args.minutes:g}", "eval_episodes": str(args.episodes),
            "seed_base": str(EVAL_SEED_BASES[args.eval]), "actors": str(args.actors), "train_seed": str(seed),
            "workdir": str(folder / "work")}
    if finish:
        opts["resume"] = "1"
    else:
        opts["checkpoint_at"] = args.checkpoint_at
        if args.checkpoint_steps:
            opts["checkpoint_steps"] = args.checkpoint_steps
    if args.also_epsilon:
        opts["also_epsilon"] = args.also_epsilon
    if args.no_kept_best:
        opts["eval_best"] = "0"
    env, settings = split_arm(arm, sets)
    if env:
        opts["env"] = env
    if settings:
        opts["set"] = settings
    if args.branch_from and not finish:
        opts["branch_from"] = args.branch_from.replace("{seed}", str(seed))
    command = [*shlex.split(args.flywheel), "bench", "mario"]
    for key, value in opts.items():
        command += ["--opt", f"{key}={value}"]
    return [*command, "--out", str(folder / "out")]


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _code_version() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes): what the runs' code was."""
    done = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always", "--dirty"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def run_all(args: argparse.Namespace, arms: dict[str, str], seeds: list[int]) -> int:
    """Run what is not done yet, in ``plan`` order; the number of runs that failed."""
    failed = 0
    worked_on: set[int] = set()  # training seeds this call has made runs of
    todo = plan(arms, seeds)
    for k, (arm, seed) in enumerate(todo, 1):
        folder = args.root / arm / f"seed{seed}"
        if (folder / "out" / RESULT).is_file():
            print(f"mario_trial: [{k}/{len(todo)}] {arm} seed {seed}: done already ({folder / 'out' / RESULT})")
            continue
        if args.max_seeds and seed not in worked_on and len(worked_on) >= args.max_seeds:
            print(f"mario_trial: stopping after the runs of {len(worked_on)} training seed(s) (--max-seeds); the "
                  f"same command goes on from {arm} seed {seed}")
            break
        worked_on.add(seed)
        finish = trained(folder)
        command = bench_command(args, arm, arms[arm], seed, folder, finish)
        if args.dry_run:
            print(f"mario_trial: [{k}/{len(todo)}] {arm} seed {seed}: would run {shlex.join(command)}")
            continue
        if finish:
            print(f"mario_trial: {arm} seed {seed} trained and was cut off in its evaluation: finishing it")
        elif folder.exists():
            print(f"mario_trial: {arm} seed {seed} was cut off before its result: starting it again")
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        record: dict[str, Any] = {"arm": arm, "seed": seed, "command": shlex.join(command), "cpu_model": _cpu_model(),
                                  "code": _code_version(),
                                  "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_at_start": _load()}
        if record["load_at_start"][0] > args.quiet_load:
            print(f"mario_trial: the machine is not quiet (load {record['load_at_start'][0]}): this run's speed and "
                  "its place in the comparison are recorded in trial.jsonl")
        print(f"mario_trial: [{k}/{len(todo)}] {arm} seed {seed}: {shlex.join(command)} (log {folder / 'bench.log'})",
              flush=True)
        with (folder / "bench.log").open("a" if finish else "w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        record.update(end=time.strftime("%Y-%m-%dT%H:%M:%S%z"), load_at_end=_load(), exit_code=code)
        with (args.root / "trial.jsonl").open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if code != 0 or not (folder / "out" / RESULT).is_file():
            failed += 1
            print(f"mario_trial: {arm} seed {seed} failed (exit code {code}); see {folder / 'bench.log'}")
    return failed


def checkpoints_of(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(label, mario_runs.py selector) for every checkpoint the runs take."""
    out = [(f"{m}min", ["--minute", m]) for m in args.checkpoint_at.split(",") if m]
    out += [(f"{s}steps", ["--steps", s]) for s in (args.checkpoint_steps or "").split(",") if s]
    return out


def report(args: argparse.Namespace, arms: dict[str, str], seeds: list[int]) -> int:
    """Every arm against the first, paired by seed, at every checkpoint, over the seeds every arm has a result of
    (a trial that spans sessions is reported as it goes, the seeds still to run named); one arm: its runs aggregated
    at every checkpoint; 1 when no seed has a result of every arm."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mario_runs

    def result(arm: str, seed: int) -> Path:
        return args.root / arm / f"seed{seed}" / "out" / RESULT

    done = [s for s in seeds if all(result(arm, s).is_file() for arm in arms)]
    pending = [s for s in seeds if s not in done]
    if not done:
        print(f"mario_trial: no report yet: no training seed has a result of every arm "
              f"({result(next(iter(arms)), seeds[0])} ...)")
        return 1
    first, *others = arms
    sections = [f"# {'Paired Mario trial' if others else 'Mario runs'} in {args.root}", "",
                f"Arms (over the default job): {', '.join(f'{a} ({arms[a] or DEFAULT})' for a in arms)}; "
                f"training seeds {', '.join(map(str, done))}"
                + (f" (still to run: {', '.join(map(str, pending))})" if pending else "")
                + f"; evaluation on the {args.eval} seeds ({EVAL_SEED_BASES[args.eval]}+, {args.episodes} episodes). "
                f"Runs: {args.root / 'trial.jsonl'}."]
    epsilons = [("", [], "")] + [(f"-eps{args.also_epsilon}", ["--also"], f", epsilon {args.also_epsilon}")] * bool(
        args.also_epsilon)  # the headline's epsilon, then the second one every checkpoint also played
    def reached(arm: str, seed: int, selector: list[str]) -> bool:
        """Whether the run took (and played) this checkpoint: a slow machine may end before an agent-step mark."""
        minute, steps = (float(selector[1]), None) if selector[0] == "--minute" else (None, int(selector[1]))
        try:
            mario_runs.one_run(str(result(arm, seed)), minute, steps)
        except mario_runs.RunsError:
            return False
        return True

    for label, selector in checkpoints_of(args):
        have = [s for s in done if all(reached(arm, s, selector) for arm in arms)]
        lacking = [str(s) for s in done if s not in have]
        missing = (f" (training seed{'s' * (len(lacking) > 1)} {', '.join(lacking)}: no checkpoint here, the "
                   "training ended before it)") if lacking else ""
        if not have:
            sections += ["", f"## {label}", "", f"No run has this checkpoint{missing}."]
            continue
        for suffix, also, title in epsilons:
            for arm in others or [first]:
                out = args.root / f"report-{label}-{arm}{suffix}.json"
                sides = ["--side", arm, *(str(result(arm, s)) for s in have)]
                if others:
                    sides = ["--paired", "--side", first, *(str(result(first, s)) for s in have), *sides]
                with contextlib.redirect_stdout(io.StringIO()):
                    code = mario_runs.main([*selector, *also, *sides, "--out", str(out)])
                if code != 0:
                    return code
                heading = f"{arm} against {first}" if others else f"{arm}, {len(have)} run{'s' * (len(have) != 1)},"
                sections += ["", f"## {heading} at {label}{title}{missing}", "",
                             json.loads(out.read_text())["markdown"]]
    (args.root / "report.md").write_text("\n".join(sections) + "\n")
    print("\n".join(sections))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="the trial's folder (kept across sessions)")
    parser.add_argument("--arm", action="append", required=True, metavar="NAME=SETTINGS",
                        help="an arm: its name and bench mario's set= value (empty: the default job; an item env=ID: "
                             "the arm's env id); the first arm is the one the others are compared to (one arm: its "
                             "runs are aggregated, not paired)")
    parser.add_argument("--seeds", required=True, help="training seeds, e.g. 1,2,3")
    parser.add_argument("--eval", choices=sorted(EVAL_SEED_BASES), default="validation")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--checkpoint-at", default="30,60", help="checkpoint minutes")
    parser.add_argument("--checkpoint-steps", default="", help="checkpoint agent-step marks, e.g. 250000,500000")
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes per checkpoint")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--also-epsilon", default="", help="a second evaluation epsilon, e.g. 0.001")
    parser.add_argument("--no-kept-best", action="store_true", help="evaluate each checkpoint's newest weights "
                        "only, not also the learner's kept best (bench mario's eval_best=0: up to half the evaluation "
                        "time)")
    parser.add_argument("--branch-from", default="", metavar="DIR", help="every run starts where the training kept "
                        "in DIR ended ({seed} in DIR: the run's training seed), e.g. /work/bases/seed{seed}/work: the "
                        "arms go on from the same state (bench mario's branch_from; --checkpoint-at counts from DIR's "
                        "start)")
    parser.add_argument("--max-seeds", type=int, default=0, help="make the runs still to make of at most this many "
                        "training seeds, then stop (1: one seed's arms, a session's worth; 0: every run)")
    parser.add_argument("--quiet-load", type=float, default=1.0, help="a 1-minute load above this at a run's start "
                        "is reported as a machine that is not quiet")
    parser.add_argument("--flywheel", default=f"{shlex.quote(sys.executable)} -m flywheel",
                        help="how to call flywheel")
    parser.add_argument("--dry-run", action="store_true", help="print the runs still to make, run nothing")
    parser.add_argument("--report", action="store_true", help="only compare the runs made so far")
    args = parser.parse_args(argv)
    if args.max_seeds < 0:
        raise SystemExit(f"mario_trial: --max-seeds takes a count >= 0 (0: no limit), got {args.max_seeds}")
    arms = arms_of(args.arm)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        raise SystemExit(f"mario_trial: --seeds takes whole numbers separated by commas, got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit("mario_trial: --seeds needs at least one seed, each once")
    if args.branch_from and "{seed}" not in args.branch_from and len(seeds) > 1:
        raise SystemExit("mario_trial: --branch-from names one folder per training seed: put {seed} in it "
                         f"(got {args.branch_from!r})")
    args.root.mkdir(parents=True, exist_ok=True)
    if not args.report:
        failed = run_all(args, arms, seeds)
        if args.dry_run:
            return 0
        if failed:
            return 1
    return report(args, arms, seeds)


if __name__ == "__main__":
    sys.exit(main())
