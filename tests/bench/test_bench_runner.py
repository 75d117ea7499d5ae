"""The benchmark runner: medians, ratios, result files and the ``flywheel bench`` command's errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flywheel.bench.cli import suite_names
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median, rate, repeat, write_results
from flywheel.cli import main


def test_median_and_repeat_discard_warmup() -> None:
    calls = iter([100.0, 3.0, 1.0, 2.0])
    values = repeat(lambda: next(calls), runs=3, warmup=1)
    assert values == [3.0, 1.0, 2.0]
    assert median(values) == 2.0
    with pytest.raises(ValueError):
        median([])
    with pytest.raises(ValueError):
        rate(10, 0.0)


def test_ratio_direction() -> None:
    faster = Row(case="c", metric="throughput", unit="1/s", flywheel=200.0, peer=100.0)
    assert faster.ratio == pytest.approx(2.0)
    quicker = Row(case="c", metric="time", unit="s", flywheel=50.0, peer=100.0, higher_is_better=False)
    assert quicker.ratio == pytest.approx(2.0)
    assert Row(case="c", metric="m", unit="u", flywheel=1.0).ratio is None


def test_write_results(tmp_path: Path) -> None:
    ctx = BenchContext(suite="demo", runs=2, warmup=0, out_dir=tmp_path)
    result = SuiteResult(suite="demo", title="Demo", notes=["a note"])
    result.rows.append(Row(case="x", metric="rate", unit="1/s", flywheel=3000.0, peer=1500.0, peer_name="peer"))
    json_path, md_path = write_results(result, ctx, "flywheel bench demo")
    payload = json.loads(json_path.read_text())
    assert payload["rows"][0]["ratio"] == pytest.approx(2.0)
    assert payload["machine"]["cpus"] >= 1
    text = md_path.read_text()
    assert "| x | rate (1/s) | 3,000 | peer | 1,500 | 2.00x |" in text
    assert "- a note" in text


def test_unknown_suite_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no-such-suite"]) == 2
    err = capsys.readouterr().err
    assert "unknown bench suite 'no-such-suite'" in err
    for name in suite_names():
        assert name in err


def test_bad_opt_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "list", "--opt", "novalue"]) == 2
    assert "--opt expects NAME=VALUE" in capsys.readouterr().err


def test_repeated_opt_is_refused_not_replaced(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "list", "--opt", "set=a=1", "--opt", "set=b=2"]) == 2
    assert "--opt set given twice ('a=1', 'b=2')" in capsys.readouterr().err


def test_typed_options_refuse_bad_values(tmp_path: Path) -> None:
    ctx = BenchContext(suite="demo", out_dir=tmp_path / "out", options={"n": "3", "x": "2.5", "bad": "lots",
                                                                         "inf": "inf"})
    assert ctx.option_int("n", 1) == 3 and ctx.option_int("missing", 7) == 7
    assert ctx.option_float("x", 0.0) == 2.5 and ctx.option_float("missing", 1.5) == 1.5
    with pytest.raises(BenchError, match="--opt bad='lots': expected an integer"):
        ctx.option_int("bad", 1)
    with pytest.raises(BenchError, match="expected a number"):
        ctx.option_float("bad", 1.0)
    with pytest.raises(BenchError, match="expected a number"):
        ctx.option_float("inf", 1.0)
    path = ctx.plot_path("curves")
    assert path == tmp_path / "out" / "demo_curves.png" and path.parent.is_dir()


def test_goal_met_sections_and_missing_values_in_markdown(tmp_path: Path) -> None:
    ctx = BenchContext(suite="demo", runs=1, warmup=0, out_dir=tmp_path)
    result = SuiteResult(suite="demo", title="Demo", sections=["| model | x |\n|---|---|\n| a | 1 |"])
    result.rows += [
        Row(case="t", metric="time", unit="s", flywheel=10.0, peer=30.0, peer_name="peer", higher_is_better=False,
            goal="<= 0.5x peer", met=True),
        Row(case="u", metric="rate", unit="1/s", flywheel=1.0, peer=4.0, peer_name="peer", goal=">= 2x", met=False),
        Row(case="v", metric="rate", unit="1/s", flywheel=math.nan, peer=4.0, peer_name="peer"),
    ]
    assert result.rows[2].ratio is None
    _, md_path = write_results(result, ctx, "flywheel bench demo")
    text = md_path.read_text()
    assert "| t | time (s) | 10.0 | peer | 30.0 | 3.00x | <= 0.5x peer (met) |" in text
    assert "| u | rate (1/s) | 1 | peer | 4 | 0.25x | >= 2x (not met) |" in text
    assert "| v | rate (1/s) | – | peer | 4 | – | – |" in text
    assert text.index("| a | 1 |") > text.index("| v |")  # sections follow the table
    assert "load average (1 min)" in text
    payload = json.loads((tmp_path / "demo.json").read_text())
    assert payload["rows"][0]["met"] is True and payload["sections"] == result.sections
    assert len(payload["load_average_at_start"]) == 3
