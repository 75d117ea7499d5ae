"""scripts/scale_projection.py: the committed projection is what the script computes from the committed raw results,
and its rules hold (the single learner caps a CPU job once the actors outgrow it; more threads never lower it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
script = load_script(ROOT / "scripts" / "scale_projection.py", "scale_projection")
COMMITTED = ROOT / "docs" / "benchmarks" / "results" / "scale_projection_20261205.json"


def test_the_committed_projection_is_what_the_script_computes(tmp_path: Path) -> None:
    committed = json.loads(COMMITTED.read_text())
    argv = committed["command"].split()[2:]
    out = argv.index("--out")
    argv[out + 1] = str(tmp_path / "p.json")
    assert script.main(argv) == 0
    again = json.loads((tmp_path / "p.json").read_text())
    assert again["rows"] == committed["rows"] and again["markdown"] == committed["markdown"]


def test_the_rules_of_the_projection() -> None:
    rows = json.loads(COMMITTED.read_text())["rows"]
    by_actors = {row["actors"]: row for row in rows}
    assert by_actors[2]["binds"] == "cores" and by_actors[2]["learner_threads"] == 1
    assert all(row["binds"] == "learner" for row in rows if row["actors"] >= 8)
    rates = [row["env_steps_per_s"] for row in rows]
    assert rates == sorted(rates)  # more cores never lower the rate
    for row in rows:
        assert row["env_steps_per_s"] == pytest.approx(min(row["caps_env_steps_per_s"].values()))
        assert row["gpu_learner"]["env_steps_per_s"] >= row["env_steps_per_s"]  # a GPU lifts the learner's cap
        sends = row["actors"] * json.loads(COMMITTED.read_text())["inputs"]["weights_mb"] / 64.0
        assert row["publish_interval_s"] >= sends - 1e-9  # the fan-out budget spaces sends


def test_a_missing_input_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="error: .*nothing.json"):
        script.main(["--grid", str(tmp_path / "nothing.json")])
