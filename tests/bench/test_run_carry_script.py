"""scripts/run_carry.py: a kept bench training packed, left where it was, and unpacked byte for byte; the evaluated
checkpoint copies, the control token, locks and temporary files left out (a replay save's fallback kept when it is
the only checkpoint); a live run, a link, a damaged archive and a used folder refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from flywheel.bench.parts.mario_state import MarioState
from flywheel.launch import runfolder
from flywheel.testing.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_carry.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "run_carry")


def _kept_training(folder: Path) -> dict[str, bytes]:
    """A bench workdir as `flywheel bench mario --opt workdir=` leaves it; the files a carry must bring back."""
    checkpoints = folder / "run" / "checkpoints"
    files = {
        "run/checkpoints/run.json": b'{"format": "flywheel-run"}',
        "run/checkpoints/learner/learner.safetensors": os.urandom(4096),
        "run/checkpoints/replay/replay/manifest.json": b"{}",
        "run/checkpoints/replay/replay/storage.frames.frames.npy": bytes(300_000) + os.urandom(1000),
        "run/checkpoints/actors/actor-0-env0.npz": os.urandom(512),
        "run/checkpoints/logs/learner-0.log": b"learner: checkpoint\n",
        "ckpt-90min/learner.safetensors": os.urandom(2048),  # its kept best not evaluated yet: it travels
        "ckpt-90min/kept-best/best.safetensors": os.urandom(2048),
    }
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    for copy in ("ckpt-30min", "ckpt-60min", "ckpt-120min"):  # evaluated in full (a kept best played or marked
        # unplayed by eval_best=0): left out
        (folder / copy / "kept-best").mkdir(parents=True)
        (folder / copy / "learner.safetensors").write_bytes(os.urandom(2048))
    (checkpoints / "replay" / ".replay.tmp-4242").mkdir()
    (checkpoints / "replay" / ".replay.tmp-4242" / "half.npy").write_bytes(b"x")
    (checkpoints / "replay" / ".replay.old-4242").mkdir()  # a finished save's fallback, beside the new one
    (checkpoints / "replay" / ".replay.old-4242" / "manifest.json").write_bytes(b"{}")
    (checkpoints / "learner" / ".learner.safetensors.4242.tmp").write_bytes(b"half")
    (checkpoints / runfolder.LOCK_FILE).write_text("4242\n")
    (folder / "control-token").write_text("secret")
    episodes = [{"seed": 500_000, "x_pos_max": 3161.0, "flag": True}]
    played = {"episodes": episodes, "episodes_also": episodes}
    state = MarioState({"env_id": "SuperMarioBros-1-1-v0"}, {"also_epsilon": 0.001}, trained_minutes=90.0,
                       checkpoints=[{"minute": 30.0, "dir": str(folder / "ckpt-30min"), **played},
                                    {"minute": 60.0, "dir": str(folder / "ckpt-60min"), **played,
                                     "best": {"file": "kept-best/best.safetensors", "episodes": episodes}},
                                    {"minute": 90.0, "dir": str(folder / "ckpt-90min"), **played,
                                     "best": {"file": str(folder / "ckpt-90min" / "kept-best" / "best.safetensors")}},
                                    {"minute": 120.0, "dir": str(folder / "ckpt-120min"), **played,
                                     "best": {"file": "kept-best/best.safetensors", "unplayed": "eval_best=0"}}])
    state.save(folder)
    files["bench-mario-state.json"] = (folder / "bench-mario-state.json").read_bytes()
    return files


def test_a_packed_training_comes_back_where_it_was_byte_for_byte(tmp_path: Path, capsys) -> None:
    carry = _script()
    folder = tmp_path / "long" / "work"
    files = _kept_training(folder)
    archive = tmp_path / "repo" / "long.tar.xz"
    assert carry.main(["pack", str(folder), str(archive)]) == 0
    manifest = carry.json.loads(Path(f"{archive}.json").read_text())
    assert manifest["folder"] == str(folder) and manifest["left_out"] == ["ckpt-120min", "ckpt-30min", "ckpt-60min"]
    assert sorted(manifest["files"]) == sorted(files)  # no lock, token, temporary file or evaluated copy
    assert manifest["archive_bytes"] < 40_000  # the zeros of the frames compress
    assert f"packed {len(files)} files" in capsys.readouterr().out
    with pytest.raises(carry.CarryError, match="exists and is not an empty folder"):
        carry.unpack(archive)
    shutil.move(folder, tmp_path / "aside")
    assert carry.main(["unpack", str(archive)]) == 0
    assert {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == files
    assert not folder.with_name("work.unpacking").exists()
    assert MarioState.load(folder).trained_minutes == 90.0
    assert f"--opt workdir={folder} --opt resume=1" in capsys.readouterr().out
    # --to: the same files elsewhere, to branch from while the packed folder goes on
    elsewhere = tmp_path / "base" / "seed21"
    assert carry.main(["unpack", str(archive), "--to", str(elsewhere)]) == 0
    assert {str(p.relative_to(elsewhere)): p.read_bytes() for p in elsewhere.rglob("*") if p.is_file()} == files
    assert f"--opt branch_from={elsewhere} --opt workdir=NEW" in capsys.readouterr().out


def test_a_live_run_a_folder_without_one_and_a_damaged_archive_are_refused(tmp_path: Path) -> None:
    carry = _script()
    folder = tmp_path / "work"
    _kept_training(folder)
    held = runfolder.lock(folder / "run" / "checkpoints")  # as a live flywheel run holds it
    try:
        with pytest.raises(carry.CarryError, match="in use by a live flywheel run: let the bench finish"):
            carry.pack(folder, tmp_path / "a.tar.xz")
    finally:
        held.close()
    with pytest.raises(carry.CarryError, match="holds no kept run"):
        carry.pack(tmp_path, tmp_path / "b.tar.xz")
    (folder / "link").symlink_to(folder / "control-token")
    with pytest.raises(carry.CarryError, match="is a symbolic link"):
        carry.pack(folder, tmp_path / "b.tar.xz")
    (folder / "link").unlink()
    assert not (tmp_path / "b.tar.xz").exists() and not (tmp_path / "b.tar.xz.partial").exists()
    archive = tmp_path / "a.tar.xz"
    carry.pack(folder, archive)
    shutil.rmtree(folder)
    manifest_file = Path(f"{archive}.json")
    manifest = carry.json.loads(manifest_file.read_text())
    manifest["files"]["run/checkpoints/run.json"]["sha256"] = "0" * 64
    manifest_file.write_text(carry.json.dumps(manifest))
    with pytest.raises(carry.CarryError, match="run.json in .* differs from its manifest"):
        carry.unpack(archive)
    assert not folder.exists() and not folder.with_name("work.unpacking").exists()  # nothing half-unpacked stays
    del manifest["files"]["run/checkpoints/run.json"]
    manifest_file.write_text(carry.json.dumps(manifest))
    with pytest.raises(carry.CarryError, match="does not hold the files its manifest lists"):
        carry.unpack(archive)
    manifest_file.write_text("not json")
    assert carry.main(["unpack", str(archive)]) == 2
    manifest_file.write_text(carry.json.dumps({**manifest, "folder": "relative/path"}))
    with pytest.raises(carry.CarryError, match="is not a flywheel-run-carry manifest"):
        carry.unpack(archive)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the compressed stream
    archive.write_bytes(bytes(data))
    manifest_file.write_text(carry.json.dumps(manifest))
    with pytest.raises(carry.CarryError, match="cannot be read|differs from its manifest"):
        carry.unpack(archive)
    archive.write_bytes(bytes(data[:200]))  # cut short
    with pytest.raises(carry.CarryError, match="cannot be read"):
        carry.unpack(archive)
    assert not folder.exists() and not folder.with_name("work.unpacking").exists()


def test_a_replay_saves_fallback_travels_when_it_is_the_only_checkpoint(tmp_path: Path) -> None:
    """A save killed between its renames leaves ``.replay.old-PID`` and no ``replay``: the replay resumes from it."""
    carry = _script()
    folder = tmp_path / "work"
    _kept_training(folder)
    replay = folder / "run" / "checkpoints" / "replay"
    shutil.rmtree(replay / "replay")
    manifest = carry.pack(folder, tmp_path / "a.tar.xz")
    assert "run/checkpoints/replay/.replay.old-4242/manifest.json" in manifest["files"]
    assert not any(".tmp" in name for name in manifest["files"])
