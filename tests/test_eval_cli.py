"""``flywheel eval``: a row per epsilon with intervals and a JSON file, the bench's figures, one-line errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checkpoint_helpers import learner_checkpoint

from flywheel.bench.parts import mario_report
from flywheel.cli import main
from flywheel.evaluation import evaluate
from flywheel.stats import summarize

MARIO = "SuperMarioBros-1-1-v0"
INTERVAL = r"-?[\d,.]+ \(-?[\d,.]+--?[\d,.]+\)"  # "21.4 (18.2-25.0)"


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return learner_checkpoint(tmp_path_factory.mktemp("cartpole"), "CartPole-v1", (4,), 2, weight_version=4)


def flywheel_eval(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.run([sys.executable, "-m", "flywheel", "eval", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.system
def test_a_row_per_epsilon_with_intervals_progress_and_a_json_file(cartpole: Path) -> None:
    result = flywheel_eval(cartpole, "--episodes", "5", "--epsilon", "0.05", "0.001", "--workers", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "learner.safetensors (weight version 4" in lines[0] and "CartPole-v1" in lines[0]
    assert "5 episodes (seeds 100000..100004), epsilon 0.05 and 0.001, no no-op starts, no stall rule" in lines[1]
    header = next(i for i, line in enumerate(lines) if line.startswith("epsilon"))
    assert "mean return (95% CI)" in lines[header] and "median return (95% CI)" in lines[header]
    for line, eps in zip(lines[header + 1:header + 3], ("0.05", "0.001"), strict=True):
        assert re.fullmatch(rf"{re.escape(eps)}\s+{INTERVAL}\s+{INTERVAL}", line), line
    assert "flywheel eval: 10/10 episodes" in result.stderr  # progress while it plays
    [written] = list(cartpole.glob("eval-latest-*.json"))  # the default path
    assert lines[-1] == f"wrote {written}"
    data = json.loads(written.read_text())
    assert data["which"] == "latest" and data["weight_version"] == 4 and data["env_id"] == "CartPole-v1"
    assert data["protocol"] == {"episodes": 5, "seed": 100_000, "epsilons": [0.05, 0.001], "noop_max": 0,
                                "stall_steps": 0, "max_steps": None}
    for row, eps in zip(data["rows"], (0.05, 0.001), strict=True):
        again = evaluate("CartPole-v1", range(100_000, 100_005), checkpoint=str(cartpole), epsilon=eps)
        assert row["epsilon"] == eps and [r["seed"] for r in row["records"]] == list(range(100_000, 100_005))
        assert [r["return"] for r in row["records"]] == [r["return"] for r in again]
        assert row["return"] == summarize([r["return"] for r in again])


@pytest.mark.system
def test_mario_rows_equal_the_bench_on_the_same_checkpoint_and_seeds(tmp_path: Path) -> None:
    """flywheel bench mario evaluates a checkpoint folder with flywheel.evaluation (seeds from 100000, 0..30
    no-ops) and reports mario_report's summary of the furthest x and flags: flywheel eval gives the same figures.
    Two short episodes: a stall rule of 60 steps (the same on both sides) keeps them short."""
    folder = learner_checkpoint(tmp_path / "run", MARIO, (4, 84, 84), 7, weight_version=4)
    out = tmp_path / "eval.json"
    result = flywheel_eval(folder, "--episodes", "2", "--epsilon", "0.5", "--stall-steps", "60", "--workers", "1",
                           "--json", out)
    assert result.returncode == 0, result.stderr
    assert "furthest x" in result.stdout and "flag rate (95% CI)" in result.stdout
    seeds = [100_000, 100_001]
    # what flywheel/bench/suites/mario.py's _evaluate passes for --opt eval_epsilon=0.5,stall_steps=60
    bench = evaluate(MARIO, seeds, checkpoint=str(folder / "learner"), epsilon=0.5, workers=1, stall_steps=60,
                     noop_max=30)
    checkpoint = {"minute": 1.0, "env_steps": 1000, "episodes": bench}
    settings = {"env_id": MARIO, "minutes": 1.0, "actors": 1, "sets": [], "eval_episodes": 2, "eval_epsilon": 0.5,
                "eval_workers": 1, "stall_steps": 60, "noop_max": 30, "seeds": seeds}
    mario_report.summarize(settings, [], [checkpoint], bench, {"start": [0.5, 0.5, 0.5]})
    expected = checkpoint["summary"]
    [row] = json.loads(out.read_text())["rows"]
    assert [r["noops"] for r in row["records"]] == [r["noops"] for r in bench] and any(r["noops"] for r in bench)
    assert row["progress"] == {k: v for k, v in expected.items() if not k.startswith("flag_")}
    assert (row["success"]["rate"], row["success"]["ci_low"], row["success"]["ci_high"]) == (
        expected["flag_rate"], expected["flag_ci_low"], expected["flag_ci_high"])


def _error(capsys: pytest.CaptureFixture[str], *args: str | Path) -> str:
    assert main(["eval", *map(str, args)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: flywheel eval: "), captured.err
    return captured.err


def test_bad_input_is_one_line_and_exit_2(cartpole: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    assert "does not exist" in _error(capsys, tmp_path / "missing")
    assert "no learner checkpoint" in _error(capsys, tmp_path)  # a folder with no weights
    assert "no best policy" in _error(capsys, cartpole, "--which", "best")
    assert "Nope-v0" in _error(capsys, cartpole, "--env", "Nope-v0")  # an unknown env
    for bad in (["1.5"], ["abc"], ["0.1", "0.1"], ["-0.01", "0.05"]):
        assert "--epsilon takes" in _error(capsys, cartpole, "--epsilon", *bad)
    assert "--episodes must be at least 1" in _error(capsys, cartpole, "--episodes", "0")
    assert "--workers must be at least 1" in _error(capsys, cartpole, "--workers", "0")


def test_which_best_finds_a_bench_checkpoints_kept_best(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """`flywheel bench mario` copies a checkpoint as DIR/learner.safetensors with the learner's best of that moment
    in DIR/kept-best/: --which best plays that file, the default (latest) the newest weights beside it."""
    newest = learner_checkpoint(tmp_path / "newest", "CartPole-v1", (4,), 2, weight_version=12)
    kept = learner_checkpoint(tmp_path / "kept", "CartPole-v1", (4,), 2, weight_version=7, seed=1)
    bench = tmp_path / "ckpt-60min"
    (bench / "kept-best").mkdir(parents=True)
    shutil.copy2(newest / "learner" / "learner.safetensors", bench / "learner.safetensors")
    shutil.copy2(kept / "learner" / "learner.safetensors", bench / "kept-best" / "best.safetensors")
    for which, version in (("best", 7), ("latest", 12)):
        out = tmp_path / f"{which}.json"
        assert main(["eval", str(bench), "--which", which, "--episodes", "1", "--workers", "1", "--json",
                     str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["which"] == which and data["weight_version"] == version
    capsys.readouterr()
    shutil.rmtree(bench / "kept-best")
    assert "no best policy" in _error(capsys, bench, "--which", "best")
