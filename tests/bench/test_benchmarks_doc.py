"""docs/BENCHMARKS.md: every section says where its figures come from, and the file is what assemble.py builds."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
SCRIPT = DOCS / "benchmarks" / "assemble.py"


def _assemble() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmarks_assemble", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


assemble = _assemble()


def _suite(tmp_path: Path, text: str) -> Path:
    sections = tmp_path / "benchmarks"
    (sections / "results").mkdir(parents=True)
    (sections / "results" / "kept.json").write_text("{}\n")
    (sections / "replay.md").write_text(text)
    return sections


def test_the_real_sections_say_where_every_figure_comes_from() -> None:
    assert assemble.check(DOCS / "benchmarks") == []


def test_benchmarks_md_is_what_assemble_builds() -> None:
    """Nobody edits docs/BENCHMARKS.md by hand: edit docs/benchmarks/<suite>.md and run assemble.py."""
    assert (DOCS / "BENCHMARKS.md").read_text() == assemble.build(DOCS / "benchmarks"), (
        "docs/BENCHMARKS.md is out of date: run python docs/benchmarks/assemble.py")


def test_the_header_names_the_suites_with_committed_raw_results() -> None:
    built = assemble.build(DOCS / "benchmarks")
    header = built[:built.index("\n## ")]
    assert "No GPU has been lent to this project yet" in header and "untested on a" in header
    where = next(p for p in header.split("\n\n") if p.startswith("**Where each figure comes from.**"))
    for path in assemble.suite_files(DOCS / "benchmarks"):
        cites = any(s.cites for s in assemble.sections(path))
        assert (f"**{path.stem}**" in where) == cites, path.stem


def test_a_cited_results_file_that_does_not_exist_fails(tmp_path: Path) -> None:
    sections = _suite(tmp_path, "## Inserts\n\nRaw result: [results/kept.json](results/kept.json).\n\n"
                                "### Sampling\n\nRaw result: `results/gone.json`.\n")
    assert assemble.check(sections) == [
        f"benchmarks/replay.md, section 'Sampling': cites results/gone.json, but there is no such file "
        f"({sections / 'results' / 'gone.json'})"]


def test_a_section_with_neither_a_results_file_nor_a_label_fails(tmp_path: Path) -> None:
    sections = _suite(tmp_path, "## Inserts\n\nHand measurement: a stopwatch.\n\n### Sampling\n\n200 batches/s.\n\n"
                                "### Memory\n\nRaw result not kept (before results were committed). Rerun: `x`.\n"
                                "### Checkpoints\n\nNot measured: no GPU.\n")
    [problem] = assemble.check(sections)
    assert problem.startswith("benchmarks/replay.md, section 'Sampling': cites no results/ file and has no label")
    assert "'Raw result not kept', 'Hand measurement' or 'Not measured'" in problem


def test_a_label_must_start_its_line(tmp_path: Path) -> None:
    sections = _suite(tmp_path, "## Inserts\n\nThis is a hand measurement. And a Raw result not kept, in passing.\n")
    assert len(assemble.check(sections)) == 1


@pytest.mark.parametrize(("text", "message"), [
    ("## Sampling\n\nSee `results/gone.json`.\n", "section 'Sampling': cites results/gone.json, but there is no"),
    ("## Sampling\n\n200 batches/s.\n", "section 'Sampling': cites no results/ file and has no label line"),
])
def test_the_script_refuses_to_write_and_says_why_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    sections = _suite(tmp_path, text)
    done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(sections)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and message in done.stderr
    assert not (tmp_path / "BENCHMARKS.md").exists()


def test_the_script_writes_and_checks_a_good_folder(tmp_path: Path) -> None:
    sections = _suite(tmp_path, "## Inserts\n\nRaw result: [results/kept.json](results/kept.json).\n")
    out = tmp_path / "BENCHMARKS.md"
    assert assemble.main(["--dir", str(sections), "--check"]) == 1  # not written yet
    assert assemble.main(["--dir", str(sections)]) == 0
    assert out.read_text() == assemble.build(sections)
    assert "](benchmarks/results/kept.json)" in out.read_text()
    assert assemble.main(["--dir", str(sections), "--check"]) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert assemble.main(["--dir", str(sections), "--check"]) == 1
