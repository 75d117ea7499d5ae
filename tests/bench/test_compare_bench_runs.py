"""scripts/compare_bench_runs.py: two code versions' runs of one bench suite, row by row, against their own noise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.system

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_bench_runs.py"
MACHINE = {"cpu_model": "AMD EPYC", "cpus": 2}


def _result(tmp_path: Path, name: str, rows: dict[str, tuple[float, float | None]], *, suite: str = "actor",
            machine: dict[str, Any] = MACHINE, higher: bool = True) -> Path:
    """A result file in `flywheel bench`'s layout: one row per case, (Flywheel value, Flywheel ÷ peer)."""
    doc = {"suite": suite, "quick": True, "machine": machine, "command": f"flywheel bench {suite} --quick",
           "time": "2026-11-26T15:00:00", "rows": [
               {"case": case, "metric": "steps per CPU s", "unit": "steps/s", "flywheel": value, "ratio": ratio,
                "higher_is_better": higher} for case, (value, ratio) in rows.items()]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_a_change_inside_the_runs_own_spread_is_noise_and_one_outside_it_is_not(tmp_path: Path) -> None:
    nan = {"no value": (float("nan"), None)}  # a row whose value could not be measured (NaN) in every file
    old = [_result(tmp_path, "old1", {"steady": (100.0, 0.9), "slower": (100.0, 0.9), "share": (-3.0, None), **nan}),
           _result(tmp_path, "old2", {"steady": (110.0, 0.92), "slower": (104.0, 0.91), "share": (1.0, None), **nan})]
    new = [_result(tmp_path, "new1", {"steady": (106.0, 0.91), "slower": (80.0, 0.7), "share": (2.0, None), **nan}),
           _result(tmp_path, "new2", {"steady": (102.0, 0.9), "slower": (82.0, 0.72), "share": (2.5, None), **nan})]
    out = tmp_path / "compare.json"
    done = _run("--side", "before", *old, "--side", "after", *new, "--out", out)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    rows = {r["case"]: r for r in doc["rows"]}
    steady, slower = rows["steady"], rows["slower"]
    assert steady["runs"] == {"before": [100.0, 110.0], "after": [106.0, 102.0]}
    assert steady["after_over_before"] == pytest.approx(104 / 105) and steady["noise"] == pytest.approx(1.1)
    assert steady["verdict"] == "within noise" and steady["over_peer"]["after"] == [0.91, 0.9]
    assert slower["after_over_before"] == pytest.approx(81 / 102) and slower["verdict"] == "changed (worse)"
    assert rows["share"]["verdict"] == "no ratio (a value <= 0)" and rows["share"]["after_over_before"] is None
    assert doc["within_noise"] == 1 and doc["changed"] == 1 and "no value" not in rows  # a NaN is no figure
    assert doc["sides"][0]["files"] == [str(p) for p in old] and "compare_bench_runs.py --side before" in doc["command"]
    assert "| steady | steps per CPU s (steps/s) | 100, 110 | 106, 102 | 0.990 | 1.100 | within noise" in done.stdout


def test_lower_is_better_rows_and_one_run_a_side(tmp_path: Path) -> None:
    old = _result(tmp_path, "old", {"latency": (3.0, None)}, higher=False)
    new = _result(tmp_path, "new", {"latency": (2.0, None)}, higher=False)
    two = _result(tmp_path, "old2", {"latency": (3.1, None)}, higher=False)
    alone = json.loads(_run("--side", "a", old, "--side", "b", new, "--out", tmp_path / "o.json").stdout and
                       (tmp_path / "o.json").read_text())
    assert alone["rows"][0]["verdict"] == "no noise estimate" and alone["rows"][0]["noise"] is None
    _run("--side", "a", old, two, "--side", "b", new, "--out", tmp_path / "o.json")
    assert json.loads((tmp_path / "o.json").read_text())["rows"][0]["verdict"] == "changed (better)"


@pytest.mark.parametrize("case", ["suite", "machine", "one side", "not a result", "no file"])
def test_files_that_cannot_be_compared_are_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    a = _result(tmp_path, "a", {"x": (1.0, None)})
    other = {"suite": _result(tmp_path, "b_suite", {"x": (1.0, None)}, suite="replay"),
             "machine": _result(tmp_path, "b_machine", {"x": (1.0, None)},
                                machine={"cpu_model": "Intel Xeon", "cpus": 2}),
             "not a result": tmp_path / "junk.json"}.get(case)
    (tmp_path / "junk.json").write_text('{"rows": 3}')
    args: list[str | Path] = {"one side": ["--side", "a", a], "no file": ["--side", "a", a, "--side", "b"]}.get(
        case, ["--side", "a", a, "--side", "b", other or a])
    done = _run(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("compare_bench_runs: ") and len(done.stderr.strip().splitlines()) == 1
    expected = {"suite": "one suite", "machine": "one machine", "one side": "exactly two sides",
                "not a result": "not a `flywheel bench` result", "no file": "at least one result file"}[case]
    assert expected in done.stderr
