"""Who may steer: no pickle anywhere on the wire or in checkpoints, checkpoints that cannot run code, CURVE."""

from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pipeline_helpers import clean_env

from flywheel.services.learner.checkpoint import CHECKPOINT_FILE, CheckpointError, load_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.replay import checkpoint as replay_checkpoint

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("flywheel", "services", "proto")
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}
UNSAFE_METHODS = {"recv_pyobj", "send_pyobj", "recv_serialized", "send_serialized", "read_pickle", "to_pickle",
                  "unsafe_load"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _literal(node: ast.AST | None) -> object:
    return node.value if isinstance(node, ast.Constant) else "not a literal"


def unsafe_loading(source: str) -> list[str]:
    """Every way ``source`` could turn bytes into running code: pickle and friends, torch.load without
    weights_only=True, np.load(allow_pickle=...) not False, pyzmq's pickle helpers, yaml.load, eval and exec."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            last = name.rsplit(".", 1)[-1]
            if name == "torch.load" and _literal(keywords.get("weights_only")) is not True:
                found.append(f"line {node.lineno}: torch.load without weights_only=True")
            elif last == "load" and name.split(".")[0] in ("np", "numpy") and "allow_pickle" in keywords \
                    and _literal(keywords["allow_pickle"]) is not False:
                found.append(f"line {node.lineno}: {name}(allow_pickle=...) that is not False")
            elif isinstance(node.func, ast.Attribute) and last in UNSAFE_METHODS:
                found.append(f"line {node.lineno}: {name}")
            elif name == "yaml.load" and "SafeLoader" not in _dotted(keywords.get("Loader", ast.Name("?"))):
                found.append(f"line {node.lineno}: yaml.load without SafeLoader")
            elif name in ("eval", "exec", "torch.jit.load"):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_the_scan_finds_every_unsafe_load_it_guards_against() -> None:
    bad = """
import pickle
from cloudpickle import loads
import numpy as np
torch.load(f)
torch.load(f, weights_only=False)
np.load(f, allow_pickle=True)
sock.recv_pyobj()
yaml.load(text)
eval("1")
"""
    assert len(unsafe_loading(bad)) == 8
    fine = "torch.load(f, weights_only=True)\nnp.load(f, allow_pickle=False)\nnp.load(f)\nnet.eval()\n" \
           "yaml.load(t, Loader=yaml.SafeLoader)\nsock.recv_multipart()\n"
    assert unsafe_loading(fine) == []


def test_no_pickle_on_the_wire_or_in_checkpoints() -> None:
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50
    problems = {str(p.relative_to(ROOT)): found for p in files if (found := unsafe_loading(p.read_text()))}
    assert problems == {}


class Payload:
    """Unpickling this creates ``marker``: proof that loading ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


@pytest.mark.system
def test_a_pickle_disguised_as_the_learner_checkpoint_is_refused_without_running(tmp_path: Path) -> None:
    core = LearnerCore((4,), 2, CoreConfig(hidden=16), torch.device("cpu"))
    marker = tmp_path / "pwned"
    payloads = {
        "a pickle": pickle.dumps(Payload(marker)),
        "a torch.save archive": None,  # written below: a zip whose data.pkl is the payload
    }
    for what, blob in payloads.items():
        path = tmp_path / what.replace(" ", "-") / CHECKPOINT_FILE
        path.parent.mkdir()
        if blob is None:
            torch.save({"online.weight": Payload(marker)}, path)
        else:
            path.write_bytes(blob)
        with pytest.raises(CheckpointError, match="not a readable learner checkpoint") as err:
            load_checkpoint(path.parent, core)
        assert "\n" not in str(err.value)
        assert not marker.exists(), f"{what}: loading ran code"
    # The service says so in one line and exits 2 (no traceback).
    proc = subprocess.run([sys.executable, "-m", "flywheel", "learner", "--env-id", "CartPole-v1", "--resume", "true",
                           "--checkpoint-dir", str(tmp_path / "a-pickle"), "--torch-threads", "1",
                           "--weights-bind", "tcp://127.0.0.1:0"],
                          env=clean_env(), capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not a readable learner checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_object_arrays_in_a_replay_checkpoint_are_refused_without_running(tmp_path: Path) -> None:
    state = {"storage.positions": np.array([4, 0], np.int64), "limiter.counts": np.array([4, 0], np.int64)}
    replay_checkpoint.save(state, tmp_path)
    folder = tmp_path / "replay"
    marker = tmp_path / "pwned"
    np.save(folder / "storage.positions.npy", np.array([Payload(marker)], dtype=object), allow_pickle=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["arrays"]["storage.positions"]["dtype"] = "object"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(replay_checkpoint.CheckpointError, match="storage.positions is corrupt"):
        replay_checkpoint.load(tmp_path)
    assert not marker.exists()
    manifest["arrays"] = {"../../etc/passwd": {"dtype": "uint8", "shape": [1], "crc32": 0}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(replay_checkpoint.CheckpointError, match="bad entry"):
        replay_checkpoint.load(tmp_path)
