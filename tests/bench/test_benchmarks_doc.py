"""docs/BENCHMARKS.md: every section says where its figures come from, and the file is what assemble.py builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.testing.scripts import load_script

DOCS = Path(__file__).resolve().parents[2] / "docs"
SCRIPT = DOCS / "benchmarks" / "assemble.py"
assemble = load_script(SCRIPT, "benchmarks_assemble")


def _suite(tmp_path: Path, text: str) -> Path:
    sections = tmp_path / "benchmarks"
    (sections / "results").mkdir(parents=True)
    (sections / "results" / "kept.json").write_text("{}\n")
    (sections / "replay.md").write_text(text)
    return sections


def _refused_by_the_script(tmp_path: Path, text: str) -> str:
    """What the script, run on a suite whose section holds ``text``, says on stderr: it exits 1 and writes nothing."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(_suite(tmp_path, text))], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and not (tmp_path / "BENCHMARKS.md").exists()
    return done.stderr


def test_the_real_sections_say_where_every_figure_comes_from() -> None:
    assert assemble.check(DOCS / "benchmarks") == []


def test_benchmarks_md_is_what_assemble_builds() -> None:
    """Nobody edits docs/BENCHMARKS.md by hand: edit docs/benchmarks/<suite>.md and run assemble.py."""
    assert (DOCS / "BENCHMARKS.md").read_text() == assemble.build(DOCS / "benchmarks"), (
        "docs/BENCHMARKS.md is out of date: run python docs/benchmarks/assemble.py")


def test_the_header_names_the_suites_with_committed_raw_results() -> None:
    built = assemble.build(DOCS / "benchmarks")
    header = built[:built.index("\n## ")]
    assert "Two GPU sessions so far" in header and "has not run on a GPU machine" in header  # what ran on a GPU
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
    ("## Sampling\n\nFast.\n", "section 'Sampling': cites no results/ file and has no label line"),
])
@pytest.mark.system
def test_the_script_refuses_to_write_and_says_why_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    stderr = _refused_by_the_script(tmp_path, text)
    assert stderr.count("\n") == 1 and message in stderr


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


# --- figures in README.md and every doc -------------------------------------------------------------------------

ROOT = DOCS.parent


def _docs(tmp_path: Path, text: str, results: dict[str, str] | None = None) -> Path:
    """A tree like the repository's: README.md holding text, and docs/benchmarks/results holding results."""
    folder = tmp_path / "docs" / "benchmarks" / "results"
    folder.mkdir(parents=True)
    for name, body in (results or {}).items():
        (folder / name).write_text(body)
    (tmp_path / "README.md").write_text(text)
    return tmp_path


def test_the_real_readme_and_docs_cite_or_label_every_figure() -> None:
    """README.md, docs/*.md and docs/benchmarks/*.md: each measured figure is in a cited results file, or labelled."""
    files = assemble.doc_files(ROOT)
    assert ROOT / "README.md" in files and DOCS / "RELIABILITY.md" in files and DOCS / "BENCHMARKS.md" not in files
    assert assemble.check_docs(ROOT) == []


def test_a_made_up_figure_fails_naming_the_file_line_and_figure(tmp_path: Path) -> None:
    root = _docs(tmp_path, "# Flywheel\n\nIntro.\n\nIt trains at 4,321 updates/s on a laptop.\n")
    assert assemble.check_docs(root) == [
        "README.md:5: figure '4,321 updates/s' cites no results file and carries no label"]


def test_a_cited_figure_that_the_results_file_holds_passes(tmp_path: Path) -> None:
    root = _docs(tmp_path, "A median 9.9 s (95% CI 9.0-11.9 s), 2.26x faster, 1.64x fewer CPU-s, 7.5 GiB and\n"
                           "37% idle, 17.9 ms a step ([raw](docs/benchmarks/results/run.json)).\n",
                 {"run.json": '{"s": 9.90957, "ci": "8.96-11.92", "ratio": 2.2566, "cpu": 0.6098, '
                              '"rss": 8041017344, "idle": 0.371, "step_s": 0.01791}\n'})
    assert assemble.check_docs(root) == []


@pytest.mark.parametrize("figure", ["9.8 s", "2.4x", "7.6 GiB", "1,029 updates/s"])
def test_a_cited_file_that_lacks_the_figure_fails(tmp_path: Path, figure: str) -> None:
    root = _docs(tmp_path, f"Measured: {figure} (`docs/benchmarks/results/run.json`).\n",
                 {"run.json": '{"s": 9.90957, "ratio": 2.2566, "rss": 8041017344, "rate": 1028.16}\n'})
    assert assemble.check_docs(root) == [
        f"README.md:1: figure '{figure}' is not in results/run.json (the results file cited) and carries no label"]


def test_a_cited_file_that_does_not_exist_fails(tmp_path: Path) -> None:
    root = _docs(tmp_path, "Measured: 9.9 s (docs/benchmarks/results/gone.json).\n")
    assert assemble.check_docs(root) == [
        "README.md:1: figure '9.9 s' cites results/gone.json, which does not exist, and carries no label"]


@pytest.mark.parametrize("text", [
    "The image is 1150 MB (a hand measurement, `docker image inspect`).\n",
    "Hand measurement, one core: encoding costs 2 ms a frame. Later sentences of the paragraph: 3 ms.\n",
    "At 4 actors it would reach 500 steps/s, a projection from the scale model.\n",
    "A 512-batch would be ~5 MB instead of ~25 MB (an estimate).\n",
    "Public agents needed 1.6x more steps (quoted from the PPO paper).\n",
    "## Section\n\nRaw result not kept (an earlier run).\n\nIt ran at 120 batches/s.\n",
    "The load run (raw result not kept):\n\n| | measured |\n|---|---|\n| rate | 7,897 |\n",
    "| | measured |\n|---|---|\n| rate, a hand measurement | 6,573 |\n",
])
def test_a_labelled_figure_passes(tmp_path: Path, text: str) -> None:
    assert assemble.check_docs(_docs(tmp_path, text)) == []


def test_a_label_speaks_for_its_sentence_not_the_next_one(tmp_path: Path) -> None:
    root = _docs(tmp_path, "It is small. It compiles in about 30 s (hand measurement). It trains at 9.5 s a run.\n")
    assert assemble.check_docs(root) == [
        "README.md:1: figure '9.5 s' cites no results file and carries no label"]


@pytest.mark.parametrize("text", [
    "Checkpoints every 10 minutes, after 1 s, within 5 s, up to 30 s, `timeout` (60 s), default 300 s.\n",
    "Messages are capped at 64 KiB; a 4 GiB frame is refused; the test pauses it for 20 s.\n",
    "1.1M frames x 7,056 B = 7.2 GiB; 84x84 frames; a 95% CI; `--time-limit 120 s` and `3.5 s` in code.\n",
    "```\n[ 204s] env steps 704,128 (14,300/s) | updates 37,263 (255.8/s)\n```\n",
    "| option | default |\n|---|---|\n| `num_envs` | 8 |\n| `interval` | 2.5 s |\n",
    "## Took 9.9 s\n\nA heading is a title, not a claim.\n",
])
def test_settings_limits_and_code_are_not_figures(tmp_path: Path, text: str) -> None:
    assert assemble.check_docs(_docs(tmp_path, text)) == []


def test_a_measured_tables_cells_are_figures(tmp_path: Path) -> None:
    root = _docs(tmp_path, "In one hour:\n\n| after | agent steps | mean x_pos | 95% CI |\n|---|---:|---:|---|\n"
                           "| 15 min | 0.10M | 1,028 | 951-1,108 |\n")
    assert [p.split(": ", 1)[1] for p in assemble.check_docs(root)] == [
        f"figure '{f}' cites no results file and carries no label" for f in ("0.10M", "1,028", "951-1,108")]
    (root / "README.md").write_text((root / "README.md").read_text().replace(
        "In one hour:", "In one hour ([raw](docs/benchmarks/results/mario.json)):"))
    (root / "docs" / "benchmarks" / "results" / "mario.json").write_text(
        '{"env_steps": 101552.0, "mean": 1028.16, "ci": [951.0, 1108.08]}\n')
    assert assemble.check_docs(root) == []


@pytest.mark.system
def test_the_script_refuses_a_made_up_figure_in_a_section(tmp_path: Path) -> None:
    stderr = _refused_by_the_script(
        tmp_path, "## Inserts\n\nRaw result: [results/kept.json](results/kept.json). It took 12.5 s.\n")
    assert stderr == ("assemble.py: benchmarks/replay.md:3: figure '12.5 s' is not in results/kept.json "
                      "(the results file cited) and carries no label\n")


# --- the research log, and no internal issue numbers in user docs -----------------------------------------------


def test_the_research_log_is_checked_like_the_sections() -> None:
    """docs/research/*.md: every section cites a raw result that exists or carries a label, and its figures are
    read (doc_files includes it); the real log passes."""
    assert DOCS / "research" / "mario-tuning.md" in assemble.doc_files(ROOT)
    assert assemble.check_research(ROOT) == []


def test_a_research_section_citing_a_missing_file_or_nothing_fails(tmp_path: Path) -> None:
    root = _docs(tmp_path, "# Flywheel\n", {"kept.json": '{"s": 9.90957}\n'})
    (root / "docs" / "research").mkdir()
    (root / "docs" / "research" / "log.md").write_text(
        "## Kept\n\nIt took 9.9 s ([raw](../benchmarks/results/kept.json)).\n\n"
        "## Gone\n\nSee [raw](../benchmarks/results/gone.json).\n\n## Bare\n\nA trial.\n\n"
        "## Labelled\n\nNot measured: an index.\n")
    assert assemble.check_research(root) == [
        f"research/log.md, section 'Gone': cites results/gone.json, but there is no such file "
        f"({root / 'docs' / 'benchmarks' / 'results' / 'gone.json'})",
        "research/log.md, section 'Bare': cites no results/ file and has no label line"]
    assert assemble.check_docs(root) == []  # 9.9 s is in kept.json, cited as ../benchmarks/results/kept.json


def test_the_real_readme_and_docs_name_no_internal_issue() -> None:
    """A user cannot see the project's issue tracker: README.md and docs/ (but docs/research/) never cite one."""
    files = assemble.user_doc_files(ROOT)
    assert ROOT / "README.md" in files and DOCS / "benchmarks" / "mario.md" in files
    assert not any("research" in p.relative_to(DOCS).parts for p in files if p.is_relative_to(DOCS))
    assert assemble.internal_issue_refs(ROOT) == []


@pytest.mark.parametrize("text", ["Issue 24's goal is met.", "as issue #24 asked", "see issues 8 and 9"])
def test_an_internal_issue_number_in_a_user_doc_fails(tmp_path: Path, text: str) -> None:
    root = _docs(tmp_path, f"# Flywheel\n\n{text}\n", {"mario.json": '{"notes": "issue 24 goal"}\n'})
    (root / "docs" / "research").mkdir()
    (root / "docs" / "research" / "log.md").write_text("Issue 24 asked for three seeds.\n")  # allowed here
    (root / "docs" / "benchmarks" / "mario.md").write_text("Nothing internal. The tissue 3 is not one.\n")
    [problem] = assemble.internal_issue_refs(root)
    assert problem.startswith("README.md:3: '") and "names an internal issue" in problem


def test_assemble_check_refuses_an_internal_issue_number() -> None:
    """``assemble.py --check`` runs the same check over this repository (main reads the real tree)."""
    assert "internal_issue_refs(root)" in SCRIPT.read_text()
