"""``flywheel run --if-exists``: which folder a run writes to, and the lock a live run holds on it (no processes
but small lock holders)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.cli import build_parser
from flywheel.launch.runfolder import LOCK_FILE, FolderLocked, choose, holds_run, take
from flywheel.settings import SettingsError

HOLDER = """
import sys, time
from pathlib import Path
from flywheel.launch.runfolder import lock
held = lock(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(120)
"""


def make_run(folder: Path, env_id: str = "CartPole-v1") -> dict[str, bytes]:
    """A finished run's files in ``folder``; returns every file's bytes."""
    (folder / "learner").mkdir(parents=True)
    (folder / "learner" / "learner.safetensors").write_bytes(b"weights")
    (folder / "run.json").write_text(json.dumps({"format": "flywheel-run", "env_id": env_id,
                                                 "started_at": 1_700_000_000.0}))
    (folder / "progress.csv").write_text("env_steps,elapsed_s\n100,1.0\n")
    return snapshot(folder)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def holder(folder: Path) -> subprocess.Popen[str]:
    """Another process holding ``folder``'s lock, as a live ``flywheel run`` does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_missing_or_empty_folder_is_used_and_locked_with_the_pid(tmp_path: Path) -> None:
    for folder in (tmp_path / "missing" / "ckpt", tmp_path):
        with choose(folder, None) as chosen:
            assert (chosen.path, chosen.resume, chosen.message) == (folder, False, None)
            assert (folder / LOCK_FILE).read_text().strip() == str(os.getpid())
        assert not holds_run(folder)


def test_a_used_folder_is_left_alone_and_the_run_goes_to_the_next_free_number(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    before = make_run(ckpt)
    with choose(ckpt, None) as second:
        assert second.path == tmp_path / "checkpoints-2" and not second.resume
        assert second.message == (f"flywheel: {ckpt}/ holds a CartPole-v1 run from 2023-11-14 22:13 UTC: this run "
                                  f"writes to {ckpt}-2/ (--resume continues the old one, --if-exists overwrite "
                                  "replaces it)")
    make_run(tmp_path / "checkpoints-2")
    with choose(ckpt, "new") as third:
        assert third.path == tmp_path / "checkpoints-3"
    assert snapshot(ckpt) == before  # not even a lock file added
    relative = Path("checkpoints")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with choose(relative, None) as chosen:  # the folder as the user named it
            assert chosen.path == Path("checkpoints-3") and "checkpoints/ holds" in (chosen.message or "")
    finally:
        os.chdir(cwd)


def test_a_folder_with_only_curves_or_a_replay_checkpoint_counts_as_used(tmp_path: Path) -> None:
    (tmp_path / "a" / "tb").mkdir(parents=True)
    (tmp_path / "a" / "tb" / "events.out.tfevents.1").write_bytes(b"x")
    (tmp_path / "b" / "replay" / "replay").mkdir(parents=True)
    (tmp_path / "b" / "replay" / "replay" / "manifest.json").write_text("{}")
    (tmp_path / "c" / "logs").mkdir(parents=True)
    (tmp_path / "c" / LOCK_FILE).write_text("1\n")
    assert holds_run(tmp_path / "a") and holds_run(tmp_path / "b") and not holds_run(tmp_path / "c")
    with choose(tmp_path / "a", None) as chosen:
        assert chosen.path == tmp_path / "a-2" and "holds a run from" in (chosen.message or "")


def test_overwrite_resume_and_fail(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    before = make_run(ckpt)
    with choose(ckpt, "overwrite") as chosen:
        assert (chosen.path, chosen.resume) == (ckpt, False)
        assert "holds a CartPole-v1 run" in (chosen.message or "") and "overwrite replaces it" in (chosen.message or "")
    for if_exists, resume in (("resume", False), (None, True), ("resume", True)):
        with choose(ckpt, if_exists, resume) as chosen:
            assert (chosen.path, chosen.resume) == (ckpt, True)
            assert chosen.message == f"flywheel: resuming a CartPole-v1 run from 2023-11-14 22:13 UTC in {ckpt}/"
    with pytest.raises(SettingsError) as refused:
        choose(ckpt, "fail")
    assert refused.value.code == 2 and "\n" not in str(refused.value)
    assert str(refused.value).startswith(f"flywheel run: {ckpt}/ holds a CartPole-v1 run") and f"{ckpt}-2/" in str(
        refused.value)
    with pytest.raises(SettingsError, match="--resume contradicts --if-exists new"):
        choose(ckpt, "new", resume=True)
    assert not (tmp_path / "ckpt-2").exists()
    assert {k: v for k, v in snapshot(ckpt).items() if k != LOCK_FILE} == before
    with choose(tmp_path / "empty", "resume") as chosen:
        assert chosen.resume and "holds no run yet" in (chosen.message or "")
    with choose(tmp_path / "fresh", "fail") as chosen:  # fail only refuses a used folder
        assert chosen.path == tmp_path / "fresh" and chosen.message is None


def test_take_points_the_arguments_at_the_chosen_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "ckpt"
    make_run(ckpt)
    args = build_parser().parse_args(["run", "--checkpoint-dir", str(ckpt)])
    assert args.if_exists is None  # new, unless --resume
    with take(args):
        assert args.checkpoint_dir == tmp_path / "ckpt-2" and args.resume is False
    assert capsys.readouterr().out.splitlines() == [
        f"flywheel: {ckpt}/ holds a CartPole-v1 run from 2023-11-14 22:13 UTC: this run writes to {ckpt}-2/ "
        "(--resume continues the old one, --if-exists overwrite replaces it)"]
    args = build_parser().parse_args(["run", "--checkpoint-dir", str(ckpt), "--if-exists", "resume"])
    with take(args):
        assert args.checkpoint_dir == ckpt and args.resume is True


@pytest.mark.system
def test_a_live_lock_refuses_every_mode_and_names_the_pid(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    make_run(ckpt)
    proc = holder(ckpt)
    try:
        for if_exists in ("new", "resume", "overwrite", "fail"):
            started = time.monotonic()
            with pytest.raises(FolderLocked) as refused:
                choose(ckpt, if_exists)
            assert time.monotonic() - started < 5
            assert str(refused.value) == (f"flywheel run: {ckpt}/ is in use by a live flywheel run (pid {proc.pid}); "
                                          "stop it first or pass another --checkpoint-dir")
            assert refused.value.code == 2
        assert not (tmp_path / "ckpt-2").exists()
    finally:
        proc.kill()
        proc.wait()
    assert (ckpt / LOCK_FILE).read_text().strip() == str(proc.pid)  # a stale lock file of a run killed with -9
    with choose(ckpt, "resume") as chosen:  # is no obstacle
        assert chosen.path == ckpt and (ckpt / LOCK_FILE).read_text().strip() == str(os.getpid())


@pytest.mark.system
def test_a_numbered_folder_a_live_run_is_starting_in_is_skipped(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    make_run(ckpt)
    proc = holder(tmp_path / "ckpt-2")  # locked, nothing written yet
    try:
        with choose(ckpt, None) as chosen:
            assert chosen.path == tmp_path / "ckpt-3"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def test_curves_after_a_resume_add_every_new_step_to_the_last_row(tmp_path: Path) -> None:
    from flywheel.curves import FRESH_MARK, Curves

    with Curves(tmp_path) as curves:
        curves.record(10.0, 2000, {"loss": 1.0})
    Curves.mark_counters_restart(tmp_path)  # flywheel run --resume: every service starts again
    with Curves(tmp_path, resume=True) as curves:
        assert not (tmp_path / FRESH_MARK).exists()  # read once: a later gateway restart guesses as before
        curves.record(5.0, 2500, {"loss": 0.5})  # above the last row, yet all of it new
        curves.record(9.0, 2700, {"loss": 0.4})
    with open(tmp_path / "progress.csv") as fh:
        rows = [line.split(",")[:2] for line in fh.read().splitlines()[1:]]
    assert rows == [["2000", "10.0"], ["4500", "15.0"], ["4700", "19.0"]]  # no step twice, none lost
