"""`flywheel bench mario --opt resume=1`: a training in two parts, the second a real `flywheel run --resume` of the
first, reported as one, with checkpoints at minutes and at agent-step marks (CartPole stands in for Mario: the same
suite code, seconds instead of minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.bench.parts.mario_state import STATE_FILE, MarioState
from flywheel.bench.runner import BenchError
from flywheel.cli import main


def _bench(out: Path, workdir: Path, *opts: str) -> int:
    args = ["bench", "mario", "--quick", "--out", str(out), "--opt", "env=CartPole-v1", "--opt", "actors=1",
            "--opt", "eval_episodes=2", "--opt", "poll_s=2", "--opt", f"workdir={workdir}"]
    for opt in opts:
        args += ["--opt", opt]
    return main(args)


@pytest.mark.timeout(420)
@pytest.mark.system
def test_a_training_resumed_in_a_second_part_is_reported_as_one(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "kept"
    assert _bench(tmp_path / "one", workdir, "minutes=0.4", "checkpoint_at=0.4", "train_seed=3",
                  "checkpoint_steps=3000", "eval_best=0") == 0
    first = MarioState.load(workdir)
    # eval_best=0: the newest weights are played, the kept best copied and marked unplayed, for good
    assert all(c["best"].get("unplayed") == "eval_best=0" and "episodes" not in c["best"]
               for c in first.checkpoints if "best" in c)
    rows_one = json.loads((tmp_path / "one" / "mario.json").read_text())["rows"]
    assert rows_one and not any("kept best at" in r["case"] for r in rows_one)
    [early] = [c for c in first.checkpoints if c.get("steps_mark") is not None]
    [at_first] = [c for c in first.checkpoints if "steps_mark" not in c]
    assert at_first["minute"] == 0.4
    assert first.trained_minutes == pytest.approx(0.4)
    assert "learner.seed=3" in first.recipe["sets"] and first.random is not None
    # the step mark's checkpoint: asked for once a poll read 3,000 agent steps, its own steps read once written
    assert early["steps_mark"] == 3000 and 3000 <= early["polled_env_steps"] <= early["env_steps"]
    assert Path(early["dir"]).name == "ckpt-3000steps" and (Path(early["dir"]) / "learner.safetensors").is_file()
    assert len(early["episodes"]) == 2 and early["part"] == 0
    # what cannot continue this training is refused before anything starts, and the kept state is untouched
    before = (workdir / STATE_FILE).read_bytes()
    assert _bench(tmp_path / "x", workdir, "minutes=0.4", "checkpoint_at=0.8", "train_seed=4", "resume=1") == 2
    assert "its recipe differs (sets:" in capsys.readouterr().err
    assert _bench(tmp_path / "x", workdir, "minutes=0.4", "checkpoint_at=0.3", "train_seed=3", "resume=1") == 2
    assert "each must be in (0.4, 0.8] (the training so far ends at 0.4 min)" in capsys.readouterr().err
    assert _bench(tmp_path / "x", workdir, "minutes=0.4", "checkpoint_at=0.8", "train_seed=3", "resume=1",
                  "checkpoint_steps=1000,3000") == 2  # 1,000 was passed in the first part without a checkpoint
    assert "checkpoint_steps: 1000 lie within the training so far" in capsys.readouterr().err
    assert (workdir / STATE_FILE).read_bytes() == before

    later = round(first.env_steps) + 2000  # marks count agent steps from the first part's start
    # the second part evaluates in this process (eval_workers=1, quicker), the first in a pool of worker processes
    assert _bench(tmp_path / "two", workdir, "minutes=0.4", "checkpoint_at=0.8", "train_seed=3", "resume=1",
                  f"checkpoint_steps=3000,{later}", "eval_workers=1") == 0
    state = MarioState.load(workdir)
    one, two = [c for c in state.checkpoints if "steps_mark" not in c]
    kept_early, second = [c for c in state.checkpoints if "steps_mark" in c]
    assert kept_early == early  # taken in the first part: kept as it was, not taken again
    assert second["steps_mark"] == later and second["part"] == 1 and second["minute"] > 0.4
    assert later <= second["polled_env_steps"] <= second["env_steps"] and len(second["episodes"]) == 2
    assert (one["minute"], two["minute"]) == (0.4, 0.8) and [p["part"] for p in state.parts] == [0, 1]
    assert two["checkpoint_updates"] > one["checkpoint_updates"]  # the learner went on from its checkpoint
    assert two["env_steps"] > one["env_steps"] and two["t"] > 0.4 * 60  # counted from the first part's start
    assert one["episodes"] == at_first["episodes"]  # evaluated once, kept
    logs = "".join(f.read_text() for f in sorted((workdir / "run" / "checkpoints" / "logs").glob("learner*")))
    # each checkpoint keeps the learner's kept best of its moment (what flywheel play takes), played on the same
    # seeds. One written before the learner had kept any has none (its first evaluation, in a spawned process, took
    # both 24 s parts at a load average of 14), and then the learner's log shows it had kept none by then; the copy
    # itself is checked for certain below (test_the_kept_best_of_a_checkpoints_moment_is_copied_beside_it).
    for c, text in ((one, logs.split("learner: resumed from")[0]), (two, logs)):
        if "best" not in c:  # each checkpoint is its part's last one asked for over control
            written = text.rfind("learner: checkpoint (control command")
            assert written > 0 and "the best so far, kept as" not in text[:written], (
                f"{c['dir']}: the learner had kept a best before this checkpoint, and it was not copied")
            continue
        kept = Path(c["best"]["file"])
        assert kept.parent == Path(c["dir"]) / "kept-best" and kept.is_file()
        if c is one:  # the first part's (eval_best=0): the second part (eval_best=1) leaves it unplayed
            assert c["best"]["unplayed"] == "eval_best=0" and "episodes" not in c["best"]
        else:
            assert len(c["best"]["episodes"]) == 2
        assert c["best"]["weight_version"] <= c["weight_version"]
    assert one.get("best") == at_first.get("best")  # unplayed in the first part, left so by the second
    assert state.random == first.random
    steps = [p["env_steps"] for p in state.points]
    assert steps == sorted(steps) and {p["part"] for p in state.points} == {0, 1}
    assert f"learner: resumed from {workdir / 'run' / 'checkpoints' / 'learner'}" in logs
    result = json.loads((tmp_path / "two" / "mario.json").read_text())
    cases = [r["case"] for r in result["rows"]]
    assert any(c.startswith("checkpoint at 0.4 min") for c in cases)
    assert any(c.startswith("checkpoint at 0.8 min") for c in cases)
    assert any(c.startswith(f"checkpoint at 3k steps ({early['env_steps']:,.0f} agent steps, +") for c in cases)
    assert any(n.startswith("Checkpoints at agent-step marks") and "run 3k steps +" in n for n in result["notes"])
    assert any(n.startswith("Trained in 2 parts") for n in result["notes"])
    assert ("best" in two) == any(c.startswith("run: kept best at 0.8 min (weight version") for c in cases)

    # an evaluation cut off (the machine lost midway) is finished with minutes=0: nothing trains, the checkpoint not
    # played yet plays the same seeds with the same weights, what was played is kept as it was
    assert _bench(tmp_path / "x", workdir, "minutes=0", "resume=1", "train_seed=3", "checkpoint_at=0.8") == 2
    assert "trains nothing, so it takes no checkpoint_at or checkpoint_steps" in capsys.readouterr().err
    cut = MarioState.load(workdir)
    [unplayed] = [c for c in cut.checkpoints if c.get("minute") == 0.8 and "steps_mark" not in c]
    del unplayed["episodes"]
    cut.save(workdir)
    assert _bench(tmp_path / "finished", workdir, "minutes=0", "resume=1", "train_seed=3", "eval_workers=1") == 0
    assert "nothing trains (minutes=0)" in capsys.readouterr().err
    finished = MarioState.load(workdir)
    assert (finished.parts, finished.points, finished.trained_minutes) == (state.parts, state.points,
                                                                          state.trained_minutes)
    def timeless(checkpoints: list[dict]) -> list[dict]:  # an episode's seconds are the one thing that may differ
        return [{**c, "episodes": [{k: v for k, v in e.items() if k != "seconds"} for e in c["episodes"]]}
                for c in checkpoints]

    assert timeless(finished.checkpoints) == timeless(state.checkpoints) and finished.random == state.random
    others = [[c for c in cs if c["dir"] != unplayed["dir"]] for cs in (finished.checkpoints, state.checkpoints)]
    assert others[0] == others[1] and len(others[0]) == 3  # the ones played before: kept, not played again
    assert "".join(f.read_text() for f in sorted((workdir / "run" / "checkpoints" / "logs").glob("learner*"))) == logs
    report = json.loads((tmp_path / "finished" / "mario.json").read_text())
    assert [r["case"] for r in report["rows"]] == cases and report["extra"]["settings"]["checkpoint_at"] == [0.4, 0.8]
    assert report["extra"]["settings"]["checkpoint_steps"] == [3000, later]

    # a branch: a new training from this one's end, with a set of its own, in a workdir of its own; the source stays
    source_state = (workdir / STATE_FILE).read_bytes()
    branch = tmp_path / "branch"
    assert _bench(tmp_path / "three", branch, "minutes=0.3", "checkpoint_at=1.1", "train_seed=3",
                  f"branch_from={workdir}", "set=learner.lr=0.0002", "eval_best=0", "eval_workers=1") == 0
    assert (workdir / STATE_FILE).read_bytes() == source_state
    branched = MarioState.load(branch)
    assert branched.branched_from is not None and branched.branched_from["dir"] == str(workdir)
    assert branched.branched_from["trained_minutes"] == pytest.approx(0.8) and branched.branched_from["parts"] == 2
    assert branched.trained_minutes == pytest.approx(1.1) and [p["part"] for p in branched.parts] == [0]
    [own] = branched.checkpoints  # only the branch's: the source's stay its own
    assert own["minute"] == 1.1 and Path(own["dir"]).parent == branch and len(own["episodes"]) == 2
    assert own["checkpoint_updates"] > two["checkpoint_updates"]  # its learner went on from the source's
    assert own["env_steps"] > state.env_steps  # counted from the source's first part's start
    assert branched.random == state.random  # the same evaluation: the random policy is not played again
    saved = json.loads((branch / "run" / "checkpoints" / "run.json").read_text())
    assert "learner.lr=0.0002" in saved["overrides"] and "learner.seed=3" in saved["overrides"]
    branch_logs = "".join(f.read_text() for f in (branch / "run" / "checkpoints" / "logs").glob("learner*"))
    assert f"learner: resumed from {branch / 'run' / 'checkpoints' / 'learner'}" in branch_logs
    three = json.loads((tmp_path / "three" / "mario.json").read_text())
    assert [r["case"] for r in three["rows"] if r["case"].startswith("checkpoint at")][0].startswith(
        "checkpoint at 1.1 min")
    assert any(n.startswith(f"Branched from the training kept in {workdir} at 0.8 min") for n in three["notes"])
    # a second branch into the same workdir is refused before anything trains
    assert _bench(tmp_path / "x", branch, "minutes=0.3", "checkpoint_at=1.1", "train_seed=3",
                  f"branch_from={workdir}") == 2
    assert "holds a training already" in capsys.readouterr().err


def test_the_kept_best_of_a_checkpoints_moment_is_copied_beside_it(tmp_path: Path) -> None:
    from flywheel.bench.parts.mario_checkpoint import copy_kept_best
    from flywheel.policy import BEST_FILE
    from flywheel.services.learner.best import BEST_JSON
    from flywheel.services.learner.checkpoint import save_checkpoint
    from flywheel.testing.cartpole import cartpole_core

    learner, dest = tmp_path / "learner", tmp_path / "ckpt-30min"
    assert copy_kept_best(learner, dest, "CartPole-v1") is None  # before the learner's first evaluation: none
    save_checkpoint(learner, cartpole_core(), weight_version=7)
    (learner / "learner.safetensors").rename(learner / BEST_FILE)
    (learner / BEST_JSON).write_text(json.dumps({"weight_version": 7, "mean_return": 123.5, "episodes": 20,
                                                 "epsilon": 0.0, "noop_max": 0, "other": "left out"}))
    kept = copy_kept_best(learner, dest, "CartPole-v1")
    assert kept is not None and kept["file"] == str(dest / "kept-best" / BEST_FILE) and kept["weight_version"] == 7
    assert (dest / "kept-best" / BEST_FILE).read_bytes() == (learner / BEST_FILE).read_bytes()
    assert kept["scored"] == {"weight_version": 7, "mean_return": 123.5, "episodes": 20, "epsilon": 0.0,
                              "noop_max": 0}


def test_resume_needs_the_kept_workdir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "mario", "--quick", "--out", str(tmp_path), "--opt", "resume=1"]) == 2
    assert "continues a flywheel run kept with --opt workdir=DIR" in capsys.readouterr().err
    assert _bench(tmp_path / "out", tmp_path / "empty", "resume=1") == 2
    assert f"{STATE_FILE} is missing" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / STATE_FILE).write_text('{"format": "something-else"}')
    with pytest.raises(BenchError, match="is not a flywheel-bench-mario-state file"):
        MarioState.load(tmp_path / "bad")
    (tmp_path / "bad" / STATE_FILE).write_text('{"format": ')  # cut off mid-write by hand
    with pytest.raises(BenchError, match=f"{STATE_FILE} cannot be read"):
        MarioState.load(tmp_path / "bad")


def test_a_branch_needs_a_kept_training_and_a_new_workdir(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    recipe = {"env_id": "CartPole-v1", "deploys": ["run"], "sets": []}
    assert _bench(tmp_path / "out", tmp_path / "new", "branch_from=/nowhere", "resume=1") == 2
    assert "--opt branch_from=DIR starts a new training" in capsys.readouterr().err
    assert main(["bench", "mario", "--quick", "--out", str(tmp_path / "out"), "--opt", "branch_from=/nowhere"]) == 2
    assert "kept in a new --opt workdir" in capsys.readouterr().err
    with pytest.raises(BenchError, match=f"--opt branch_from: {tmp_path / 'none' / STATE_FILE} is missing"):
        MarioState.branch(tmp_path / "none", tmp_path / "new", recipe, {})
    source = tmp_path / "source"
    source.mkdir()
    MarioState(recipe, {"seeds": [1]}, trained_minutes=60.0, env_steps=5000.0).save(source)
    with pytest.raises(BenchError, match="learner.safetensors is missing: there is no training to branch from"):
        MarioState.branch(source, tmp_path / "new", recipe, {})
    learner = source / "run" / "checkpoints" / "learner"
    learner.mkdir(parents=True)
    (learner / "learner.safetensors").write_bytes(b"weights")
    (source / "run" / "checkpoints" / ".flywheel-run.lock").write_text("")
    with pytest.raises(BenchError, match="goes on in the source's env \\(CartPole-v1\\), not Acrobot-v1"):
        MarioState.branch(source, tmp_path / "new", {**recipe, "env_id": "Acrobot-v1"}, {})
    (tmp_path / "used" / "run").mkdir(parents=True)
    with pytest.raises(BenchError, match="holds a training already"):
        MarioState.branch(source, tmp_path / "used", recipe, {})
    state = MarioState.branch(source, tmp_path / "new", {**recipe, "sets": ["learner.lr=0.1"]}, {"seeds": [2]})
    assert (state.trained_minutes, state.env_steps, state.checkpoints, state.random) == (60.0, 5000.0, [], None)
    assert not (tmp_path / "new").exists()  # checked only: the copy comes once the marks are checked too
    state.copy_branch(tmp_path / "new")
    assert MarioState.load(tmp_path / "new") == state
    assert (tmp_path / "new" / "run" / "checkpoints" / "learner" / "learner.safetensors").read_bytes() == b"weights"
    assert not (tmp_path / "new" / "run" / "checkpoints" / ".flywheel-run.lock").exists()
    assert not (tmp_path / "new" / "run.copying").exists()
    assert state.branched_from == {"dir": str(source), "trained_minutes": 60.0, "env_steps": 5000.0, "sets": [],
                                   "parts": 0, "last_checkpoint_updates": None}


@pytest.mark.parametrize(("opt", "message"), [
    ("train_seed=-2", "--opt train_seed=-2: a seed is a whole number >= 0"),
    ("also_epsilon=1.5", "--opt also_epsilon=1.5: an exploration rate is in [0, 1]"),
    ("eval_epsilon=-0.1", "--opt eval_epsilon=-0.1: an exploration rate is in [0, 1]"),
    ("eval_best=2", "eval_best 0 or 1"),
    ("minutes=0", "--opt minutes=0: a training needs minutes > 0 (minutes=0 only with resume=1"),
    ("minutes=-5", "--opt minutes=-5: a training needs minutes > 0"),
    ("checkpoint_steps=5000,1e6", "--opt checkpoint_steps='5000,1e6': expected whole numbers of agent steps"),
    ("checkpoint_steps=2500.5", "--opt checkpoint_steps='2500.5': expected whole numbers of agent steps"),
    ("checkpoint_steps=0,5000", "--opt checkpoint_steps='0,5000': each must be > 0 and larger than the one before"),
    ("checkpoint_steps=5000,2000", "'5000,2000': each must be > 0 and larger than the one before"),
    ("checkpoint_steps=5000,5000", "'5000,5000': each must be > 0 and larger than the one before"),
])
def test_bad_options_are_one_line_before_anything_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         opt: str, message: str) -> None:
    workdir = tmp_path / "kept"
    assert _bench(tmp_path / "out", workdir, opt) == 2
    assert message in capsys.readouterr().err
    assert not workdir.exists()


def test_deploys_trained_side_by_side_count_as_one_part() -> None:
    """deploy=run,compose adds a part entry per deploy from the same start: one part of training, not two (the
    report once said "trained in 2 parts ... with flywheel run --resume" of such a run); a resumed part counts."""
    state = MarioState(recipe={}, evaluation={})
    point = {"t": 1.0, "env_steps": 10.0}
    state.add_part(30.0, [dict(point)], [], {}, advance=False)  # flywheel run
    state.add_part(30.0, [dict(point)], [], {}, advance=True)  # docker compose, from the same start
    assert len(state.parts) == 2 and state.training_parts == 1
    state.add_part(30.0, [dict(point)], [], {})  # --opt resume=1
    assert state.training_parts == 2 and state.trained_minutes == pytest.approx(60.0)
