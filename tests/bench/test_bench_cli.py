"""``flywheel bench`` end to end with a suite discovered from a folder: options, errors and result files."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flywheel.bench import suites
from flywheel.cli import main

SUITE = '''"""A tiny suite for the CLI tests."""
from flywheel.bench.runner import BenchError, Row, SuiteResult

DESCRIPTION = "tiny test suite"
OPTIONS = {"size": "how many", "fail": "raise a BenchError"}


def run(ctx):
    if ctx.option("fail", "0") == "1":
        raise BenchError("the peer is not installed")
    size = ctx.option_int("size", 2)
    values = [float(size + i) for i in range(ctx.runs)]
    return SuiteResult(suite=ctx.suite, title="Tiny", rows=[Row("c", "rate", "1/s", max(values), peer=1.0,
                       peer_name="one", flywheel_runs=values)], notes=[f"quick={ctx.quick}"])
'''


@pytest.fixture
def tiny_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    folder = tmp_path / "extra_suites"
    folder.mkdir()
    (folder / "zz_tiny.py").write_text(SUITE)
    monkeypatch.setattr(suites, "__path__", [*suites.__path__, str(folder)])
    yield "zz_tiny"
    sys.modules.pop("flywheel.bench.suites.zz_tiny", None)


def test_suite_runs_and_writes_results(tiny_suite: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    assert main(["bench", tiny_suite, "--runs", "2", "--quick", "--opt", "size=5", "--out", str(out)]) == 0
    payload = json.loads((out / f"{tiny_suite}.json").read_text())
    assert payload["rows"][0]["flywheel_runs"] == [5.0, 6.0] and payload["rows"][0]["ratio"] == pytest.approx(6.0)
    assert payload["options"] == {"size": "5"} and payload["quick"] is True
    assert "quick=True" in (out / f"{tiny_suite}.md").read_text()
    assert "| c | rate (1/s) | 6 | one | 1 | 6.00x |" in capsys.readouterr().out


def test_unknown_option_of_a_declaring_suite_is_refused(tiny_suite: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", tiny_suite, "--opt", "sise=5", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has no option sise" in err and "size" in err
    assert not (tmp_path / f"{tiny_suite}.json").exists()


def test_bench_error_and_bad_typed_option_are_one_line(tiny_suite: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", tiny_suite, "--opt", "fail=1", "--out", str(tmp_path)]) == 2
    assert f"error: flywheel bench {tiny_suite}: the peer is not installed" in capsys.readouterr().err
    assert main(["bench", tiny_suite, "--opt", "size=many", "--out", str(tmp_path)]) == 2
    assert "--opt size='many': expected an integer" in capsys.readouterr().err


def test_list_shows_declared_options(tiny_suite: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "list"]) == 0
    out = capsys.readouterr().out
    assert "zz_tiny      tiny test suite" in out and "--opt size=...  how many" in out
    for name in ("sb3", "origins", "scaling", "mario"):
        assert f"\n{name} " in f"\n{out}"
