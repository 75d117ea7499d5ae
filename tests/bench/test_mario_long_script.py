"""scripts/mario_long.py: the long run's table from a bench state file or result, the first checkpoint at each flag
rate, checkpoints not played yet, and runs that cannot be compared."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flywheel.testing.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mario_long.py"
SEEDS = [500_000 + i for i in range(4)]


def _script() -> ModuleType:
    return load_script(SCRIPT, "mario_long")


def _episodes(flags: int, x: float) -> list[dict[str, Any]]:
    return [{"seed": s, "progress": 3161.0 if i < flags else x, "success": i < flags} for i, s in enumerate(SEEDS)]


def _checkpoints() -> list[dict[str, Any]]:
    """15 min, the 250k mark, 30 and 60 min played at both epsilons; 90 min taken but not played yet."""
    played = [(15.0, None, 170_000, 0, 1), (22.0, 250_000, 250_100, 1, 2), (30.0, None, 330_000, 2, 3),
              (60.0, None, 700_000, 3, 4)]
    out: list[dict[str, Any]] = [
        {"minute": m, "env_steps": steps, "checkpoint_updates": steps // 4, "part": 0,
         **({} if mark is None else {"steps_mark": mark}),
         "episodes": _episodes(f, 1500.0), "episodes_also": _episodes(fa, 1800.0)}
        for m, mark, steps, f, fa in played]
    return [*out[::-1], {"minute": 90.0, "env_steps": 1_000_000, "checkpoint_updates": 250_000, "part": 1}]


def _state(path: Path, seeds: list[int] = SEEDS) -> Path:
    path.write_text(json.dumps({"format": "flywheel-bench-mario-state", "recipe": {},
                                "evaluation": {"seeds": seeds, "eval_epsilon": 0.05, "also_epsilon": 0.001},
                                "checkpoints": _checkpoints()}))
    return path


def test_each_checkpoint_in_agent_steps_and_the_first_to_reach_each_rate(tmp_path: Path, capsys) -> None:
    long = _script()
    out = tmp_path / "table.json"
    assert long.main(["--run", f"seed 21={_state(tmp_path / 'state.json')}", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["runs"]["seed 21"]["rows"]
    assert [r["checkpoint"] for r in rows] == ["15 min", "250k steps", "30 min", "60 min", "90 min"]
    assert [r["summary"] and r["summary"]["flag_rate"] for r in rows] == [0.0, 0.25, 0.5, 0.75, None]
    assert rows[3]["summary_also"]["flag_rate"] == 1.0 and rows[0]["summary"]["mean"] == 1500.0
    reached = {r["what"]: r for r in doc["runs"]["seed 21"]["reached"]}
    assert reached["50% flags at eps 0.05"] == {"what": "50% flags at eps 0.05", "rate": 0.5, "reached": True,
                                                "checkpoint": "30 min", "minute": 30.0, "env_steps": 330_000,
                                                "flag_rate": 0.5}
    assert reached["80% flags at eps 0.05"]["reached"] is False
    assert reached["80% flags at eps 0.05"]["last_played"] == "60 min"  # 90 min is not played yet
    assert reached["90% flags at eps 0.001"]["checkpoint"] == "60 min"
    text = capsys.readouterr().out
    assert text == doc["markdown"]
    assert "| 90 min | 90 | 1,000,000 | not played |  | not played |  |" in text
    assert "- seed 21, 80% flags at eps 0.05: not by 700,000 agent steps (60 min)" in text
    assert "- seed 21, 50% flags at eps 0.05: 330,000 agent steps (30 min: 50%)" in text
    assert doc["evaluation"] == {"seeds": [500_000, 500_003], "episodes": 4, "epsilon": 0.05, "also_epsilon": 0.001}


def test_a_bench_result_gives_the_same_table_as_its_state_file(tmp_path: Path, capsys) -> None:
    long = _script()
    result = tmp_path / "mario.json"
    result.write_text(json.dumps({"suite": "mario", "extra": {
        "settings": {"seeds": SEEDS, "eval_epsilon": 0.05, "also_epsilon": 0.001}, "checkpoints": _checkpoints()}}))
    assert long.main(["--run", f"a={result}"]) == 0
    from_result = capsys.readouterr().out
    assert long.main(["--run", f"a={_state(tmp_path / 'state.json')}"]) == 0
    assert capsys.readouterr().out == from_result


def test_runs_on_other_seeds_and_unreadable_files_are_one_line(tmp_path: Path, capsys) -> None:
    long = _script()
    one, other = _state(tmp_path / "one.json"), _state(tmp_path / "other.json", [300_000, 300_001])
    assert long.main(["--run", f"a={one}", "--run", f"b={other}"]) == 2
    assert "b (" in (err := capsys.readouterr().err) and "played other evaluation seeds or epsilons" in err
    (tmp_path / "bad.json").write_text("{")
    assert long.main(["--run", f"a={tmp_path / 'bad.json'}"]) == 2
    assert "bad.json cannot be read" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[]")
    assert long.main(["--run", f"a={tmp_path / 'list.json'}"]) == 2
    assert "neither a flywheel bench mario result nor its state file" in capsys.readouterr().err
    for bad in (["--run", "nofile"], ["--run", f"a={one}", "--run", f"a={one}"]):
        assert long.main(bad) == 2
        assert "--run takes NAME=FILE" in capsys.readouterr().err
    assert long.main(["--run", f"a={one}", "--thresholds", "0.5,80"]) == 2
    assert "flag rates in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("rate", [0.5, 0.8])
def test_nothing_played_yet_says_so(tmp_path: Path, rate: float) -> None:
    long = _script()
    rows = [{"checkpoint": "15 min", "minute": 15.0, "env_steps": 1.0, "summary": None, "summary_also": None}]
    assert long.first_reached(rows, rate, "summary") == {"rate": rate, "reached": False, "last_played": None,
                                                         "minute": None, "env_steps": None}
    assert long._reached_cell(long.first_reached(rows, rate, "summary")) == "nothing played yet"
