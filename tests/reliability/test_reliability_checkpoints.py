"""A kill -9 in the middle of writing a checkpoint leaves the previous one loadable (replay and learner)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq
from pipeline_helpers import clean_env
from reliability_helpers import transitions

from flywheel import proto
from flywheel.services.learner.checkpoint import load_checkpoint, save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.replay import checkpoint as replay_checkpoint
from flywheel.testing.cluster import Cluster, pid_alive

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

# Runs in a child process: writes one checkpoint and dies by SIGKILL at the named point.
LEARNER_WRITER = r"""
import builtins, os, signal, sys
import torch
from flywheel import checkpoints
from flywheel.services.learner import checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore

directory, where, version = sys.argv[1], sys.argv[2], int(sys.argv[3])
core = LearnerCore((4,), 2, CoreConfig(hidden=64), torch.device("cpu"))

class HalfThenDie:
    def __init__(self, fh): self.fh = fh
    def __enter__(self): return self
    def __exit__(self, *exc): self.fh.close()
    def write(self, blob):
        self.fh.write(blob[: len(blob) // 2]); self.fh.flush(); os.fsync(self.fh.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name): return getattr(self.fh, name)

if where == "write":  # the file writer the learner's checkpoint uses (flywheel.checkpoints.write_atomically)
    checkpoints.open = lambda path, mode: HalfThenDie(builtins.open(path, mode))
elif where == "replace":
    checkpoint.os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
checkpoint.save_checkpoint(directory, core, version)
"""

REPLAY_WRITER = r"""
import os, signal, sys
from pathlib import Path
import numpy as np
from flywheel.services.replay import checkpoint

directory, where, rows = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
state = {"storage.positions": np.array([rows, 0], np.int64), "rows": np.arange(rows, dtype=np.int64)}
if where == "between-renames":  # the old checkpoint moved aside, the new one not yet in its place
    real, calls = os.replace, []
    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)
    checkpoint.os.replace = replace
checkpoint.save(state, directory)
"""


def _write(script: str, *args: object) -> int:
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], env=clean_env(), timeout=120,
                          capture_output=True).returncode


def test_learner_killed_while_writing_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    core = LearnerCore((4,), 2, CoreConfig(hidden=64), torch.device("cpu"))
    save_checkpoint(tmp_path, core, 5)
    for where in ("write", "replace"):
        assert _write(LEARNER_WRITER, tmp_path, where, 9) == -signal.SIGKILL
        assert list(tmp_path.glob(".learner.safetensors.*.tmp")), f"killed at {where}: no temp file left behind"
        assert load_checkpoint(tmp_path, core).weight_version == 5
    save_checkpoint(tmp_path, core, 12)
    assert load_checkpoint(tmp_path, core).weight_version == 12
    assert not list(tmp_path.glob(".*.tmp")), "the temp files of killed writers are cleaned up"


def test_replay_killed_between_its_two_renames_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    assert _write(REPLAY_WRITER, tmp_path, "none", 100) == 0
    assert _write(REPLAY_WRITER, tmp_path, "between-renames", 200) == -signal.SIGKILL
    assert not (tmp_path / "replay").exists()
    assert replay_checkpoint.load(tmp_path)["rows"].shape == (100,)  # read from .replay.old-<pid>
    assert _write(REPLAY_WRITER, tmp_path, "none", 300) == 0
    assert replay_checkpoint.load(tmp_path)["rows"].shape == (300,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay"], "leftovers of killed writers are removed"


def test_replay_service_killed_mid_checkpoint_restores_the_previous_one(tmp_path: Path) -> None:
    """The real service, checkpointing pixels every half second from a forked writer: kill -9 the writer, then
    the replay itself, each while a write is under way; the last completed checkpoint is what comes back."""
    ckpt = tmp_path / "replay-ckpt"
    cluster = Cluster(tmp_path, settings={"replay": {
        "CAPACITY": "3000", "MIN_SIZE_TO_SAMPLE": "1", "CHECKPOINT_DIR": str(ckpt), "CHECKPOINT_INTERVAL_S": "0.5",
        "MAX_MESSAGE_MB": "64", "ENV_ID": ""}})  # pixels of no env in particular: the shapes go unchecked
    cluster.add("replay")
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(cluster.endpoint("transitions"))
    try:
        cluster.start("replay-0")
        for seq in range(30):  # 3000 pixel transitions, stored whole: about 170 MB to write per checkpoint
            batch = transitions(100, seq=seq)
            obs = np.full((100, 4, 84, 84), seq, np.uint8)
            batch.obs, batch.next_obs = obs, obs
            push.send_multipart(proto.encode(batch))

        def written() -> list[int]:
            return [int(n) for n in re.findall(r"checkpoint \(periodic\) of (\d+) transitions", cluster.log_text(
                "replay-0"))]
        cluster.wait(lambda: 3000 in written(), 120, "a checkpoint of every transition", alive=["replay-0"])

        def writer_dir() -> Path | None:
            return next(iter(ckpt.glob(".replay.tmp-*")), None)

        busy = cluster.wait(writer_dir, 30, "the next checkpoint to start", poll_s=0.01, alive=["replay-0"])
        writer = int(busy.name.rsplit("-", 1)[1])
        assert writer != cluster.pid("replay-0")
        subprocess.run(["kill", "-9", str(writer)], check=True)
        cluster.wait(lambda: "failed: writer exited with -9" in cluster.log_text("replay-0"), 30,
                     "the replay to report the killed writer", alive=["replay-0"])
        assert replay_checkpoint.load(ckpt)["storage.positions"].tolist() == [3000, 0]
        done = len(written())
        cluster.wait(lambda: len(written()) > done, 60, "the replay to checkpoint again", alive=["replay-0"])

        busy = cluster.wait(writer_dir, 30, "another checkpoint to start", poll_s=0.01, alive=["replay-0"])
        writer = int(busy.name.rsplit("-", 1)[1])
        cluster.kill("replay-0")  # kill -9 of the replay while its writer writes: the writer dies with it
        cluster.wait(lambda: not pid_alive(writer), 10, "the writer to die with its replay")
        state = replay_checkpoint.load(ckpt)  # CRCs verified
        assert state["storage.positions"].tolist() == [3000, 0]
        assert busy.exists(), "the killed writer's temp folder, half a checkpoint in size"
        cluster.start("replay-0")
        cluster.wait(lambda: "restored 3000 transitions" in cluster.log_text("replay-0"), 60,
                     "the replay to restore the last completed checkpoint", alive=["replay-0"])
        # the restarted replay swept it before restoring, in one line naming it
        swept = [line for line in cluster.log_text("replay-0").splitlines() if "killed checkpoint writers" in line]
        assert len(swept) == 1 and busy.name in swept[0] and not busy.exists()
    finally:
        push.close(0)
        ctx.term()
        cluster.stop()
