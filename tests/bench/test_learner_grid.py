"""The learner suite's batch size x torch threads grid: the cells, the rows and table made from them, the child."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from flywheel.bench.parts.learner_grid import Cell, _ints, grid_rows, measure_cells
from flywheel.bench.runner import BenchError


def _cell(batch: int, threads: int, seconds: list[float], cpu: list[float]) -> Cell:
    return Cell(batch=batch, threads=threads, updates=10, seconds=seconds, cpu_seconds=cpu)


def test_grid_rows_give_rates_cpu_and_the_speedup_with_the_goal_at_batch_128() -> None:
    cells = [_cell(32, 1, [1.0, 0.5, 2.0], [1.0, 0.5, 2.0]), _cell(128, 1, [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]),
             _cell(32, 2, [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]), _cell(128, 2, [1.0, 1.25, 1.0], [4.0, 4.0, 4.0])]
    rows, notes, section = grid_rows(cells, "Env-v0", 8.0)
    got = {(r.case, r.metric): r for r in rows}
    one = "learner update, Env-v0, batch 128, 1 thread(s)"
    two = "learner update, Env-v0, batch 128, 2 thread(s)"
    assert got[(one, "updates/s")].flywheel == pytest.approx(5.0)  # 10 updates in 2 s
    assert got[(one, "samples/s (updates/s x batch)")].flywheel == pytest.approx(640.0)
    assert got[(two, "updates/s")].flywheel == pytest.approx(10.0)  # median of 10, 8, 10
    assert got[(two, "process CPU per update")].flywheel == pytest.approx(400.0)  # ms: 4 CPU-s for 10 updates
    assert not got[(two, "process CPU per update")].higher_is_better
    assert got[(two, "updates per process CPU-second")].flywheel == pytest.approx(2.5)
    goal = got[("learner update, Env-v0, batch 128", "updates/s, 2 threads ÷ 1 thread")]
    assert goal.flywheel == pytest.approx(2.0) and goal.goal == ">= 1.60" and goal.met is True
    assert goal.flywheel_runs == pytest.approx([2.0, 1.6, 2.0])  # paired repeat by repeat
    small = got[("learner update, Env-v0, batch 32", "updates/s, 2 threads ÷ 1 thread")]
    assert small.flywheel == pytest.approx(2.0) and small.goal == "" and small.met is None
    assert "Goal: 2 torch threads >= 1.6x one thread's updates/s at batch 128: 2.00x, met." in section
    assert "| 128 | 2 | 10.0 | 1,280 | 160 | 400.0 | 2.5 | 2.00x |" in section  # 1,280 samples/s ÷ 8 per insert
    assert "| 128 | 1 | 5.0 | 640 | 80 | 200.0 | 5.0 | – |" in section
    assert any("met" in n for n in notes)


def test_the_goal_is_not_met_below_the_speedup_and_unmeasured_without_its_cell() -> None:
    slow = [_cell(128, 1, [1.0], [1.0]), _cell(128, 2, [0.8], [1.6])]
    rows, _, section = grid_rows(slow, "Env-v0", 8.0)
    goal = next(r for r in rows if r.goal)
    assert goal.flywheel == pytest.approx(1.25) and goal.met is False
    assert "1.25x, not met" in section
    _, _, section = grid_rows([_cell(64, 1, [1.0], [1.0]), _cell(64, 2, [0.5], [1.0])], "Env-v0", 0.0)
    assert "not measured" in section and "| 64 | 2 | 20.0 | 1,280 | – |" in section


def test_grid_options_refuse_what_is_not_a_list_of_counts() -> None:
    assert _ints("32, 64,32,128", "grid_batches") == [32, 64, 128]
    for bad in ("", "a,b", "0,2", "-1"):
        with pytest.raises(BenchError, match="grid_threads"):
            _ints(bad, "grid_threads")


def test_measure_cells_times_the_real_core_at_each_batch_in_this_process() -> None:
    cells = measure_cells([2, 3], updates=2, repeats=2, compile_choice="off", warmup=1)
    assert [(c.batch, c.threads, c.updates) for c in cells] == [(2, torch.get_num_threads(), 2),
                                                                (3, torch.get_num_threads(), 2)]
    for cell in cells:
        assert len(cell.seconds) == len(cell.cpu_seconds) == 2
        assert all(s > 0 for s in cell.seconds) and all(c >= 0 for c in cell.cpu_seconds)


@pytest.mark.system
def test_the_grid_child_sets_its_threads_and_prints_its_cells_as_json() -> None:
    done = subprocess.run([sys.executable, "-m", "flywheel.bench.parts.learner_grid", "--threads", "2",
                           "--batches", "2", "--updates", "1", "--repeats", "1", "--compile", "off"],
                          capture_output=True, text=True, timeout=600, check=True)
    (cell,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert (cell["batch"], cell["threads"], cell["updates"], len(cell["seconds"])) == (2, 2, 1, 1)
