"""scripts/plot_mario_flags.py: the README's flag-rate plot reads the committed raw results of the default job."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.testing.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot_mario_flags.py"
plot = load_script(SCRIPT, "plot_mario_flags")


def test_the_default_runs_are_the_four_training_seeds_with_their_flag_rates() -> None:
    """What the plot draws, read from the committed files (the same figures docs/benchmarks/mario.md tables)."""
    runs = [plot.load(path) for path in plot.DEFAULT_RUNS]
    assert [run.name for run, _, _ in runs] == [f"training seed {k}" for k in (1, 2, 3, 4)]
    assert [[round(f[0], 2) for f in run.flags] for run, _, _ in runs] == [
        [0.13, 0.29], [0.25, 0.37], [0.09, 0.36], [0.11, 0.24, 0.12, 0.34, 0.29, 0.39]]
    seed4 = runs[3][0]
    assert seed4.minutes == [30, 60, 90, 120, 150, 180] and seed4.also_epsilon == 0.001
    assert seed4.also_flags == pytest.approx([0.14, 0.42, 0.35, 0.36, 0.66, 0.53])
    assert all(random[0] == 0.0 for _, random, _ in runs)  # the random policy never reached the flag
    assert {(seeds[0], len(seeds)) for _, _, seeds in runs} == {(300000, 100)}


def test_a_file_that_is_not_a_mario_result_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"suite": "sb3"}\n')
    with pytest.raises(plot.PlotError, match="not a `flywheel bench mario` result"):
        plot.load(bad)
    assert plot.main([str(bad), "--out", str(tmp_path / "x.png")]) == 1
    assert not (tmp_path / "x.png").exists()


def test_the_plot_is_written(tmp_path: Path) -> None:
    out = tmp_path / "flags.png"
    assert plot.main(["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
