"""scripts/mario_trial.py: the paired plan (arms alternate from seed to seed), the bench commands, skipping what is
done, recording a failed run, and the report (paired, or one arm's runs aggregated) over result files in `flywheel
bench mario`'s layout."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import ModuleType

import pytest

from flywheel.testing.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mario_trial.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "mario_trial")


def _result(path: Path, seed: int, x: float, flags: int, also_flags: int | None = None) -> None:
    """A finished run's result: checkpoints at 60 min and at the 500,000-step mark on evaluation seeds 300000+
    (``also_flags``: each also played at epsilon 0.001, with that many flags)."""
    def played(flagged: int) -> list[dict[str, object]]:
        return [{"seed": 300_000 + i, "x_pos_max": x, "flag": i < flagged} for i in range(20)]

    also = {} if also_flags is None else {"episodes_also": played(also_flags)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"options": {"train_seed": str(seed)}, "machine": {"cpu_model": "AMD EPYC"}, "extra": {
        "settings": {"eval_epsilon": 0.05, "also_epsilon": None if also_flags is None else 0.001},
        "scale_model": {}, "points": [], "checkpoints": [
            {"minute": 40.0, "steps_mark": 500_000, "env_steps": 500_100, "episodes": played(flags), **also},
            {"minute": 60.0, "env_steps": 700_000, "episodes": played(flags), **also}]}}))


def test_arms_alternate_their_order_from_seed_to_seed() -> None:
    trial = _script()
    arms = trial.arms_of(["default=", "ema=learner.acting_ema=0.001;actor.cut_at_exploration=true"])
    assert arms == {"default": "", "ema": "learner.acting_ema=0.001;actor.cut_at_exploration=true"}
    assert trial.plan(arms, [1, 2, 3]) == [("default", 1), ("ema", 1), ("ema", 2), ("default", 2), ("default", 3),
                                           ("ema", 3)]
    for bad in ([], ["default=", "default=x=1"], ["no-equals-sign", "b="], ["a b=", "c="]):
        with pytest.raises(SystemExit, match="mario_trial"):
            trial.arms_of(bad)



def test_bad_seeds_are_one_clear_error(tmp_path: Path) -> None:
    trial = _script()
    arms = ["--root", str(tmp_path), "--arm", "a=", "--arm", "b=x.y=1", "--dry-run"]
    with pytest.raises(SystemExit, match="--seeds takes whole numbers"):
        trial.main([*arms, "--seeds", "1,x"])
    with pytest.raises(SystemExit, match="each once"):
        trial.main([*arms, "--seeds", "1,1"])


def test_a_dry_run_prints_the_bench_commands_of_the_runs_not_done(tmp_path: Path, capsys) -> None:
    trial = _script()
    _result(tmp_path / "default" / "seed1" / "out" / "mario.json", 1, 1000.0, 2)
    assert trial.main(["--root", str(tmp_path), "--arm", "default=", "--arm", "ema=learner.acting_ema=0.001",
                       "--seeds", "1,2", "--checkpoint-steps", "250000,500000", "--eval", "test", "--also-epsilon",
                       "0.001", "--flywheel", "flywheel", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "[1/4] default seed 1: done already" in lines[0]
    commands = [shlex.split(line.split("would run ", 1)[1]) for line in lines[1:]]
    assert [c[c.index("--out") + 1] for c in commands] == [str(tmp_path / p / "out") for p in
                                                           ("ema/seed1", "ema/seed2", "default/seed2")]
    ema = commands[0]
    assert ema[:3] == ["flywheel", "bench", "mario"]
    opts = dict(ema[i + 1].split("=", 1) for i, word in enumerate(ema) if word == "--opt")
    assert opts == {"minutes": "60", "checkpoint_at": "30,60", "eval_episodes": "100", "seed_base": "500000",
                    "actors": "2", "train_seed": "1", "workdir": str(tmp_path / "ema" / "seed1" / "work"),
                    "checkpoint_steps": "250000,500000", "also_epsilon": "0.001", "set": "learner.acting_ema=0.001"}
    assert "set" not in dict(c.split("=", 1) for c in commands[2] if "=" in c and not c.startswith("/"))
    assert not (tmp_path / "ema").exists()  # a dry run makes nothing


def test_an_arm_may_name_its_env_id_beside_its_settings(tmp_path: Path, capsys) -> None:
    """An arm's item env=ID goes to bench mario's env= option (commas and all), its other items to set=; two env ids
    in one arm are refused."""
    trial = _script()
    env = "SuperMarioBros-1-1-v0?size=42,crop_top=32,rejump=true"
    assert trial.main(["--root", str(tmp_path), "--arm", "default=", "--arm", f"rejump=env={env}", "--arm",
                       f"both=learner.lr=0.0005;env={env}", "--seeds", "1", "--flywheel", "flywheel",
                       "--dry-run"]) == 0
    commands = [shlex.split(line.split("would run ", 1)[1]) for line in capsys.readouterr().out.splitlines()]
    opts = [dict(c[i + 1].split("=", 1) for i, w in enumerate(c) if w == "--opt") for c in commands]
    assert [(o.get("env"), o.get("set")) for o in opts] == [(None, None), (env, None), (env, "learner.lr=0.0005")]
    with pytest.raises(SystemExit, match="more than one env= id"):
        trial.arms_of(["default=", f"two=env={env};env=CartPole-v1"])


def test_branch_from_names_each_seeds_own_kept_training(tmp_path: Path, capsys) -> None:
    trial = _script()
    base = ["--root", str(tmp_path), "--arm", "default=", "--arm", "sp=learner.reset_interval_updates=45000",
            "--seeds", "1,2", "--checkpoint-at", "120", "--flywheel", "flywheel", "--dry-run"]
    assert trial.main([*base, "--branch-from", "/work/bases/seed{seed}/work"]) == 0
    commands = [shlex.split(line.split("would run ", 1)[1]) for line in capsys.readouterr().out.splitlines()]
    froms = [dict(c[i + 1].split("=", 1) for i, w in enumerate(c) if w == "--opt")["branch_from"] for c in commands]
    assert froms == ["/work/bases/seed1/work", "/work/bases/seed1/work", "/work/bases/seed2/work",
                     "/work/bases/seed2/work"]
    with pytest.raises(SystemExit, match="put \\{seed\\} in it"):
        trial.main([*base, "--branch-from", "/work/bases/one"])


def test_max_seeds_stops_at_a_seed_boundary_and_no_kept_best_skips_its_evaluation(tmp_path: Path, capsys) -> None:
    """A seed's arms within one session: --max-seeds 1 finishes the seed begun before (its done runs skipped) and
    stops before the next seed's first run, naming it."""
    trial = _script()
    _result(tmp_path / "default" / "seed1" / "out" / "mario.json", 1, 1000.0, 2)
    assert trial.main(["--root", str(tmp_path), "--arm", "default=", "--arm", "ema=learner.acting_ema=0.001",
                       "--seeds", "1,2,3", "--flywheel", "flywheel", "--max-seeds", "1", "--no-kept-best",
                       "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1] for line in lines[:2]] == ["[1/6] default seed 1", "[2/6] ema seed 1"]
    assert lines[2] == ("mario_trial: stopping after the runs of 1 training seed(s) (--max-seeds); the same command "
                        "goes on from ema seed 2")
    assert len(lines) == 3 and "--opt eval_best=0" in lines[1]
    with pytest.raises(SystemExit, match="--max-seeds takes a count"):
        trial.main(["--root", str(tmp_path), "--arm", "a=", "--arm", "b=", "--seeds", "1", "--max-seeds", "-1"])


@pytest.mark.system
def test_a_failed_run_is_recorded_and_a_cut_off_one_starts_again(tmp_path: Path, capsys) -> None:
    trial = _script()
    cut_off = tmp_path / "b" / "seed7"
    (cut_off / "work").mkdir(parents=True)
    (cut_off / "work" / "left-over").write_text("x")
    code = trial.main(["--root", str(tmp_path), "--arm", "a=", "--arm", "b=x.y=1", "--seeds", "7",
                       "--flywheel", "false"])  # a real command that fails at once
    assert code == 1
    out = capsys.readouterr().out
    assert "b seed 7 was cut off before its result: starting it again" in out and "a seed 7 failed (exit code 1)" in out
    assert not (cut_off / "work" / "left-over").exists() and (cut_off / "bench.log").is_file()
    records = [json.loads(line) for line in (tmp_path / "trial.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["seed"], r["exit_code"]) for r in records] == [("a", 7, 1), ("b", 7, 1)]
    assert all(len(r["load_at_start"]) == 3 and r["cpu_model"] and r["end"] and r["code"] for r in records)


def test_the_report_pairs_every_arm_with_the_first_at_every_checkpoint(tmp_path: Path, capsys) -> None:
    trial = _script()
    for seed, (x, flags) in {1: (1000.0, 2), 2: (1200.0, 4), 3: (900.0, 0)}.items():
        _result(tmp_path / "default" / f"seed{seed}" / "out" / "mario.json", seed, x, flags)
        _result(tmp_path / "ema" / f"seed{seed}" / "out" / "mario.json", seed, x + 100.0, flags + 2)
    args = ["--root", str(tmp_path), "--arm", "default=", "--arm", "ema=learner.acting_ema=0.001", "--seeds",
            "1,2,3", "--checkpoint-at", "60", "--checkpoint-steps", "500000"]
    assert trial.main([*args, "--report"]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "## ema against default at 60min" in text and "## ema against default at 500000steps" in text
    assert "| 2 | 20% | 30% | +10% | 1,200 | 1,300 | +100 |" in text
    paired = json.loads((tmp_path / "report-500000steps-ema.json").read_text())["paired"]
    assert paired["pair_flag_rate_differences"] == pytest.approx([0.1] * 3) and paired["flag_rate_b_ahead"] == 3
    _result(tmp_path / "default" / "seed4" / "out" / "mario.json", 4, 1000.0, 2)  # its ema run still to come
    assert trial.main([*args, "--report", "--seeds", "1,2,3,4"]) == 0  # reported as it goes: seeds 1-3
    text = (tmp_path / "report.md").read_text()
    assert "training seeds 1, 2, 3 (still to run: 4)" in text and "| 2 | 20% | 30% | +10% |" in text
    assert trial.main([*args, "--report", "--seeds", "4,5"]) == 1
    assert "no report yet: no training seed has a result of every arm" in capsys.readouterr().out


def test_the_report_also_pairs_the_arms_at_the_second_epsilon_every_checkpoint_played(tmp_path: Path) -> None:
    trial = _script()
    for seed in (1, 2):
        _result(tmp_path / "default" / f"seed{seed}" / "out" / "mario.json", seed, 1000.0, 2, also_flags=5)
        _result(tmp_path / "rejump" / f"seed{seed}" / "out" / "mario.json", seed, 1000.0, 2, also_flags=5 + seed)
    args = ["--root", str(tmp_path), "--arm", "default=", "--arm", "rejump=env=SuperMarioBros-1-1-v0", "--seeds",
            "1,2", "--checkpoint-at", "60", "--checkpoint-steps", "500000", "--also-epsilon", "0.001", "--report"]
    assert trial.main(args) == 0
    text = (tmp_path / "report.md").read_text()
    for label in ("60min", "500000steps"):
        assert f"## rejump against default at {label}\n" in text
        assert f"## rejump against default at {label}, epsilon 0.001\n" in text
        headline = json.loads((tmp_path / f"report-{label}-rejump.json").read_text())
        second = json.loads((tmp_path / f"report-{label}-rejump-eps0.001.json").read_text())
        assert (headline["epsilon"], second["epsilon"]) == (0.05, 0.001)
        assert headline["paired"]["pair_flag_rate_differences"] == pytest.approx([0.0, 0.0])
        assert second["paired"]["pair_flag_rate_differences"] == pytest.approx([0.05, 0.10])
    assert "| 2 | 25% | 35% | +10% |" in text


def test_one_arm_is_a_series_of_runs_on_the_test_seeds_aggregated_at_every_checkpoint(tmp_path: Path, capsys) -> None:
    trial = _script()
    args = ["--root", str(tmp_path), "--arm", "default=", "--seeds", "11,12,13", "--eval", "test",
            "--checkpoint-at", "60", "--checkpoint-steps", "500000", "--also-epsilon", "0.001"]
    assert trial.main([*args, "--dry-run"]) == 0
    planned = [line for line in capsys.readouterr().out.splitlines() if "would run" in line]
    assert [line.split(":")[1].strip() for line in planned] == ["[1/3] default seed 11", "[2/3] default seed 12",
                                                               "[3/3] default seed 13"]
    assert all("--opt seed_base=500000" in line and "--opt set=" not in line for line in planned)
    for seed, flags in {11: 4, 12: 10}.items():
        _result(tmp_path / "default" / f"seed{seed}" / "out" / "mario.json", seed, 1000.0 + seed, flags, also_flags=16)
    assert trial.main([*args, "--report"]) == 0
    text = (tmp_path / "report.md").read_text()
    assert text.startswith(f"# Mario runs in {tmp_path}") and "(still to run: 13)" in text and "against" not in text
    for label in ("60min", "500000steps"):
        assert f"## default, 2 runs, at {label}\n" in text
        assert f"## default, 2 runs, at {label}, epsilon 0.001\n" in text
        headline = json.loads((tmp_path / f"report-{label}-default.json").read_text())
        second = json.loads((tmp_path / f"report-{label}-default-eps0.001.json").read_text())
        assert headline["paired"] is None and [r["train_seed"] for r in headline["runs"]["default"]] == ["11", "12"]
        assert headline["aggregate"]["default"]["median_flag_rate"] == pytest.approx(0.35)  # 20% and 50%
        assert second["aggregate"]["default"]["median_flag_rate"] == pytest.approx(0.8)
    # a run on a slow machine that ended before the 500,000-step mark: reported where it has checkpoints
    slow = tmp_path / "default" / "seed13" / "out" / "mario.json"
    _result(slow, 13, 1013.0, 6, also_flags=16)
    result = json.loads(slow.read_text())
    result["extra"]["checkpoints"] = [c for c in result["extra"]["checkpoints"] if "steps_mark" not in c]
    slow.write_text(json.dumps(result))
    assert trial.main([*args, "--report"]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "## default, 3 runs, at 60min\n" in text
    assert ("## default, 2 runs, at 500000steps (training seed 13: no checkpoint here, the training ended before "
            "it)\n") in text
    at_mark = json.loads((tmp_path / "report-500000steps-default.json").read_text())
    assert [r["train_seed"] for r in at_mark["runs"]["default"]] == ["11", "12"]


@pytest.mark.system
def test_a_run_cut_off_in_its_evaluation_is_finished_not_trained_again(tmp_path: Path, capsys) -> None:
    from flywheel.bench.parts.mario_state import MarioState

    trial = _script()
    work = tmp_path / "default" / "seed7" / "work"
    state = MarioState({"env_id": "SuperMarioBros-1-1-v0"}, {"seeds": [500_000]})
    state.add_part(60.0, [{"t": 3600.0, "env_steps": 600_000.0}], [], {})
    (work / "ckpt-60min").mkdir(parents=True)
    state.save(work)
    args = ["--root", str(tmp_path), "--arm", "default=", "--seeds", "7,8", "--eval", "test", "--checkpoint-at",
            "15,60", "--checkpoint-steps", "250000", "--no-kept-best", "--branch-from", "/work/bases/seed{seed}/work"]
    assert trial.main([*args, "--dry-run"]) == 0
    finish, fresh = [line.split("would run ")[1] for line in capsys.readouterr().out.splitlines()]
    assert "--opt minutes=0" in finish and "--opt resume=1" in finish and f"--opt workdir={work}" in finish
    assert "checkpoint_at" not in finish and "checkpoint_steps" not in finish and "branch_from" not in finish
    assert "--opt minutes=60" in fresh and "--opt checkpoint_at=15,60" in fresh and "resume" not in fresh
    assert trial.main([*args, "--seeds", "7", "--flywheel", "false"]) == 1  # a real command that fails at once
    assert "default seed 7 trained and was cut off in its evaluation: finishing it" in capsys.readouterr().out
    assert (work / "ckpt-60min").is_dir() and MarioState.load(work).parts  # kept for the next try
    [record] = [json.loads(line) for line in (tmp_path / "trial.jsonl").read_text().splitlines()]
    assert record["exit_code"] == 1 and "--opt minutes=0 " in record["command"] and "resume=1" in record["command"]
