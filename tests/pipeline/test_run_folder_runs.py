"""Real ``flywheel run`` processes into one folder: a second run never destroys the first (numbered folder,
--if-exists overwrite|fail), a live run's lock refuses another, and --resume continues the curves (rows within
one run may repeat a step: the actors' totals arrive in bursts)."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_helpers import clean_env, wait_until

from flywheel.launch.runfolder import LOCK_FILE
from flywheel.processes import launch

pytestmark = pytest.mark.system

CHEAP = ["--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2", "--base-port", "0", "--http-port", "0",
         "--no-video", "--progress-interval", "1", "--set", "replay.min_size_to_sample=200"]


def flywheel_run(cwd: Path, *argv: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", "run", *CHEAP, *argv], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def steps(folder: Path) -> tuple[list[int], list[int]]:
    """The env steps of every progress.csv row and of every TensorBoard point (one tag), in file order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with open(folder / "progress.csv", newline="") as fh:
        rows = [int(r["env_steps"]) for r in csv.DictReader(fh)]
    events = EventAccumulator(str(folder / "tb"))
    events.Reload()
    return rows, [e.step for e in events.Scalars("replay/size")]


def test_a_second_run_never_destroys_the_first(tmp_path: Path) -> None:
    log = tmp_path / "first.log"
    first = launch(["run", *CHEAP, "--checkpoint-dir", "ckpt", "--time-limit", "90"], clean_env(), log, cwd=tmp_path)
    ckpt = tmp_path / "ckpt"
    try:
        wait_until(lambda: "env steps" in log.read_text(), 90, "the first run to train", [log])
        assert (ckpt / LOCK_FILE).read_text().strip() == str(first.pid)
        refused = flywheel_run(tmp_path, "--resume", "--checkpoint-dir", "ckpt", timeout=60)  # a live run's folder
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
        assert refused.stderr.strip().splitlines() == [
            f"error: flywheel run: ckpt/ is in use by a live flywheel run (pid {first.pid}); stop it first or pass "
            "another --checkpoint-dir"]
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 0, log.read_text()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (ckpt / "run.json").is_file() and (ckpt / "progress.csv").is_file()
    before = snapshot(ckpt)

    second = flywheel_run(tmp_path, "--checkpoint-dir", "ckpt", "--steps", "1500")  # the stale lock: no obstacle
    assert second.returncode == 0, second.stdout + second.stderr
    lines = second.stdout.splitlines()
    assert lines[0].startswith("flywheel: ckpt/ holds a CartPole-v1 run from ") and lines[0].endswith(
        ": this run writes to ckpt-2/ (--resume continues the old one, --if-exists overwrite replaces it)"), lines
    assert f"logs in {tmp_path / 'ckpt-2' / 'logs'};" in lines[1], lines
    assert lines[-1] == (f"flywheel: stopped; checkpoints in {tmp_path / 'ckpt-2'} (flywheel play ckpt-2; "
                         "flywheel run --resume --checkpoint-dir ckpt-2)")
    assert snapshot(ckpt) == before  # byte for byte
    new = tmp_path / "ckpt-2"
    assert (new / "run.json").is_file() and (new / "progress.csv").is_file() and (new / "logs").is_dir()
    assert (new / LOCK_FILE).read_text().strip().isdigit()  # the second run's pid, stale now

    failed = flywheel_run(tmp_path, "--checkpoint-dir", "ckpt", "--if-exists", "fail", timeout=60)
    assert failed.returncode == 2 and failed.stdout == "" and len(failed.stderr.strip().splitlines()) == 1
    assert "ckpt/ holds a CartPole-v1 run" in failed.stderr and "--if-exists new writes to ckpt-3/" in failed.stderr
    assert snapshot(ckpt) == before and not (tmp_path / "ckpt-3").exists()

    overwritten = flywheel_run(tmp_path, "--checkpoint-dir", "ckpt", "--if-exists", "overwrite", "--steps", "1500")
    assert overwritten.returncode == 0, overwritten.stdout + overwritten.stderr
    assert overwritten.stdout.splitlines()[0].startswith("flywheel: ckpt/ holds a CartPole-v1 run from ")
    assert "--if-exists overwrite replaces it" in overwritten.stdout.splitlines()[0]
    after = snapshot(ckpt)
    assert after["run.json"] != before["run.json"] and not (tmp_path / "ckpt-3").exists()
    old_events = {name for name in before if name.startswith("tb/")}
    assert old_events and not old_events & set(after) and after["progress.csv"] != before["progress.csv"]


def test_resume_continues_the_curves_without_going_back(tmp_path: Path) -> None:
    first = flywheel_run(tmp_path, "--checkpoint-dir", "ckpt", "--steps", "3000")
    assert first.returncode == 0, first.stdout + first.stderr
    ckpt = tmp_path / "ckpt"
    rows_before, tb_before = steps(ckpt)
    assert rows_before and tb_before
    resumed = flywheel_run(tmp_path, "--resume", "--checkpoint-dir", "ckpt", "--steps", "3000")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[0].startswith("flywheel: resuming a CartPole-v1 run from ")
    rows, tb = steps(ckpt)
    assert rows[:len(rows_before)] == rows_before and len(rows) > len(rows_before)
    assert rows == sorted(rows) and tb == sorted(tb), (rows, tb)  # no step goes back
    new_rows, new_tb = rows[len(rows_before):], tb[len(tb_before):]
    assert new_rows[0] > rows_before[-1] and new_tb[0] > tb_before[-1], (rows, tb)  # no step at the seam twice
    assert new_rows[-1] >= rows_before[-1] + 3000 and new_tb[-1] >= tb_before[-1] + 3000  # every new step counted
    assert not (tmp_path / "ckpt-2").exists()
