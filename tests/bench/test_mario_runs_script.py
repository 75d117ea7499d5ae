"""Training runs aggregated as rliable does (flywheel.stats.across_runs) and scripts/mario_runs.py over real
`flywheel bench mario` result files' layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from flywheel.stats import across_runs, interquartile_mean
from flywheel.testing.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mario_runs.py"


def test_interquartile_mean_cuts_a_quarter_from_each_end_as_scipy_does() -> None:
    assert interquartile_mean([1, 2, 3]) == 2.0  # under 4 values nothing is cut
    assert interquartile_mean([100, 1, 2, 3, -50, 4, 5, 6]) == pytest.approx(3.5)  # 2 cut from each end
    assert interquartile_mean([0, 10, 10, 1000]) == 10.0


def test_across_runs_medians_and_intervals() -> None:
    runs = [[1000.0, 1200.0] * 50, [2000.0, 2200.0] * 50, [3000.0, 3200.0] * 50]
    flags = [[False] * 100, [True] * 10 + [False] * 90, [True] * 40 + [False] * 60]
    out = across_runs(runs, flags)
    assert out["run_means"] == [1100.0, 2100.0, 3100.0] and out["run_flag_rates"] == [0.0, 0.1, 0.4]
    assert out["median_mean"] == 2100.0 and out["iqm_mean"] == pytest.approx(2100.0)
    assert out["median_flag_rate"] == 0.1 and out["pooled_flag_rate"] == pytest.approx(50 / 300)
    assert out["median_mean_ci"] == [1100.0, 3100.0]  # three runs: resampled medians span the runs
    low, high = out["pooled_mean_ci"]
    assert low < out["pooled_mean"] < high and high - low > 500  # the run-to-run spread is in the interval
    same = across_runs([[1500.0, 1501.0] * 50] * 3, [[False] * 100] * 3)
    one_level = same["median_mean_ci"]
    assert one_level[0] == one_level[1] == 1500.5  # identical runs: no run-to-run noise at all
    alone = across_runs([[900.0, 1100.0] * 10], [[False] * 20])
    assert alone["median_mean"] == 1000.0 and alone["median_mean_ci"] is None  # one run: no spread between runs
    assert alone["pooled_mean_ci"][0] < 1000.0 < alone["pooled_mean_ci"][1]  # its episodes still have one
    with pytest.raises(ValueError, match="one non-empty list"):
        across_runs([[1.0], []], [[True], []])
    with pytest.raises(ValueError, match="of equal length"):
        across_runs([[1.0, 2.0]], [[True]])


def _bench_result(path: Path, x: float, flags: int, seeds: range, minute: float = 60.0,
                  train_seed: int | None = None) -> Path:
    episodes = [{"seed": s, "x_pos_max": x + (i % 2) * 100, "flag": i < flags} for i, s in enumerate(seeds)]
    result = {"command": "flywheel bench mario --opt minutes=60", "time": "2026-11-26T12:00:00+0000",
              "options": {} if train_seed is None else {"train_seed": str(train_seed)},
              "machine": {"cpu_model": "AMD EPYC"},
              "extra": {"scale_model": {"env_steps_per_s": 140.0, "updates_per_s": 35.0},
                        "points": [{"t": 10.0, "machine_cpu_s": 100.0, "load": [1.8, 1.7, 1.6]},
                                   {"t": 110.0, "machine_cpu_s": 280.0, "load": [2.0, 1.8, 1.7]}],
                        "checkpoints": [{"minute": 30.0, "env_steps": 250_000, "checkpoint_updates": 60_000,
                                         "episodes": [{**e, "flag": False} for e in episodes]},
                                        {"minute": minute, "env_steps": 500_000, "checkpoint_updates": 120_000,
                                         "episodes": episodes}]}}
    path.write_text(json.dumps(result))
    return path


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.system
def test_the_script_tables_each_run_and_each_side(tmp_path: Path) -> None:
    seeds = range(300_000, 300_020)
    without = [_bench_result(tmp_path / f"off{i}.json", 900.0 + 100 * i, 0, seeds) for i in range(3)]
    share = [_bench_result(tmp_path / f"on{i}.json", 1900.0 + 100 * i, 5 * i, seeds) for i in range(3)]
    out = tmp_path / "agg.json"
    done = run_script("--minute", "60", "--side", "without", *map(str, without), "--side", "share 0.25",
                      *map(str, share), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "| without | off0.json | AMD EPYC | 500,000 | 120,000 | 140.0 | 35.0 | 2.00 | 1.80 | 950 (" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["aggregate"]["without"]["median_mean"] == 1050.0
    assert saved["aggregate"]["share 0.25"]["run_flag_rates"] == [0.0, 0.25, 0.5]
    assert saved["aggregate"]["share 0.25"]["median_flag_rate"] == 0.25
    assert "| share 0.25 | 3 | 2,050 (1,950-2,150; 75.0%) |" in saved["markdown"]  # three runs: the range, 75%
    assert saved["aggregate"]["share 0.25"]["median_flag_rate_order"] == {"low": 0.0, "high": 0.5, "coverage": 0.75}
    assert np.isclose(saved["aggregate"]["share 0.25"]["pooled_flag_rate"], 15 / 60)
    at_30 = run_script("--minute", "30", "--side", "share", *map(str, share))
    assert at_30.returncode == 0 and "| share | 3 |" in at_30.stdout and "| 0% (0%-0%) |" in at_30.stdout
    single = run_script("--side", "one", str(share[0]))
    assert single.returncode == 0 and "| one | 1 | 1,950 (one run: no interval) |" in single.stdout


@pytest.mark.system
def test_the_script_refuses_what_it_cannot_compare(tmp_path: Path) -> None:
    a = _bench_result(tmp_path / "a.json", 1000.0, 0, range(100, 110))
    b = _bench_result(tmp_path / "b.json", 1000.0, 0, range(200, 210))
    done = run_script("--side", "x", str(a), str(b))
    assert done.returncode == 2 and "evaluated on different seeds" in done.stderr
    missing = run_script("--minute", "45", "--side", "x", str(a))
    assert missing.returncode == 2 and "no checkpoint at 45 min (it has 30, 60 min)" in missing.stderr
    no_mark = run_script("--steps", "250000", "--side", "x", str(a))
    assert no_mark.returncode == 2 and "no checkpoint at the 250000 agent steps mark (it has 30, 60 min)" in \
        no_mark.stderr
    both = run_script("--minute", "60", "--steps", "250000", "--side", "x", str(a))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert "broken.json" in run_script("--side", "x", str(broken)).stderr


@pytest.mark.system
def test_the_script_takes_one_deploy_of_a_run_and_compose_result(tmp_path: Path) -> None:
    seeds = range(300_000, 300_010)

    def deploy(name: str, part: int, x: float, steps: float) -> tuple[list[dict], dict]:
        polls = [{"t": t, "env_steps": steps * t / 100, "updates": steps * t / 400, "machine_cpu_s": 2.0 * t,
                  "load": [3.0, 2.0, 2.0], "deploy": name, "part": part} for t in (10.0, 110.0)]
        return polls, {"minute": 30.0, "env_steps": steps, "checkpoint_updates": int(steps / 4), "deploy": name,
                       "part": part, "episodes": [{"seed": s, "x_pos_max": x, "flag": False} for s in seeds]}

    run_polls, run_ckpt = deploy("run", 0, 600.0, 24_000.0)
    compose_polls, compose_ckpt = deploy("compose", 1, 1000.0, 22_000.0)
    path = tmp_path / "both.json"
    path.write_text(json.dumps({"machine": {"cpu_model": "Xeon"}, "extra": {
        "scale_model": {"env_steps_per_s": 1.0, "updates_per_s": 1.0}, "points": run_polls + compose_polls,
        "checkpoints": [run_ckpt, compose_ckpt]}}))
    done = run_script("--side", "run", f"{path}#run", "--side", "compose", f"{path}#compose")
    assert done.returncode == 0, done.stderr
    assert "| run | both.json#run | Xeon | 24,000 | 6,000 | 240.0 | 60.0 | 3.00 | 2.00 | 600 (" in done.stdout
    assert "| compose | both.json#compose | Xeon | 22,000 | 5,500 | 220.0 | 55.0 | 3.00 | 2.00 | 1,000 (" in done.stdout
    missing = run_script("--side", "k8s", f"{path}#k8s")
    assert missing.returncode == 2 and "no evaluated checkpoint of deploy 'k8s'" in missing.stderr


def _script() -> ModuleType:
    return load_script(SCRIPT, "mario_runs")


def test_steps_picks_each_runs_checkpoint_at_that_agent_steps_mark(tmp_path: Path) -> None:
    runs = _script()
    path = _bench_result(tmp_path / "a.json", 1000.0, 0, range(100, 110))
    result = json.loads(path.read_text())
    at_mark = {"minute": 60.0, "steps_mark": 500_000, "env_steps": 503_000, "polled_env_steps": 501_000,
               "checkpoint_updates": 110_000, "episodes": [{"seed": s, "x_pos_max": 2000.0, "flag": True}
                                                           for s in range(100, 110)]}
    result["extra"]["checkpoints"].insert(1, at_mark)  # taken before the 60-minute one, at the same minute
    path.write_text(json.dumps(result))
    row = runs.one_run(str(path), None, 500_000)
    assert (row["steps_mark"], row["env_steps"], row["updates"]) == (500_000, 503_000, 110_000)
    assert row["summary"]["flag_rate"] == 1.0
    by_minute = runs.one_run(str(path), 60.0)  # --minute takes the minute checkpoint, not a mark's
    assert (by_minute["steps_mark"], by_minute["env_steps"]) == (None, 500_000)
    assert runs.one_run(str(path), None)["env_steps"] == 500_000  # neither: the last checkpoint
    with pytest.raises(runs.RunsError, match=r"no checkpoint at the 250000 agent steps mark \(it has 30, 60 min and "
                                             r"the agent-step marks 500000\)"):
        runs.one_run(str(path), None, 250_000)


def test_paired_takes_the_second_side_minus_the_first_by_training_seed(tmp_path: Path, capsys) -> None:
    runs, seeds = _script(), range(100, 120)
    base = [_bench_result(tmp_path / f"a{k}.json", 1000.0 + 100 * k, 4, seeds, train_seed=k) for k in (1, 2, 3)]
    arm = [_bench_result(tmp_path / f"b{k}.json", 1050.0 + 100 * k, 4 + 2 * (k != 2), seeds, train_seed=k)
           for k in (3, 1, 2)]  # listed in another order: pairs follow the training seeds
    out = tmp_path / "paired.json"
    assert runs.main(["--minute", "60", "--paired", "--side", "default", *map(str, base), "--side", "arm",
                      *map(str, arm), "--out", str(out)]) == 0
    diff = json.loads(out.read_text())["paired"]
    assert (diff["a"], diff["b"], diff["train_seeds"]) == ("default", "arm", ["1", "2", "3"])
    assert diff["pair_mean_differences"] == pytest.approx([50.0] * 3) and diff["mean_difference_ci"] == \
        pytest.approx([50.0, 50.0])
    assert diff["pair_flag_rate_differences"] == pytest.approx([0.1, 0.0, 0.1])
    assert (diff["flag_rate_b_ahead"], diff["flag_rate_b_behind"]) == (2, 0)
    text = capsys.readouterr().out
    assert "| 2 | 20% | 20% | +0% | 1,250 | 1,300 | +50 |" in text and "ahead on 2, behind on 0" in text
    unpaired = [_bench_result(tmp_path / f"c{k}.json", 1000.0, 0, seeds, train_seed=k) for k in (1, 2, 4)]
    assert runs.main(["--paired", "--side", "default", *map(str, base), "--side", "other", *map(str, unpaired)]) == 2
    assert "training seeds differ" in capsys.readouterr().err
    assert runs.main(["--paired", "--side", "default", *map(str, base)]) == 2
    assert "--paired compares two sides" in capsys.readouterr().err


def test_also_scores_the_episodes_played_at_the_second_epsilon(tmp_path: Path, capsys) -> None:
    runs = _script()
    paths = []
    for k, also_flags in ((1, 3), (2, 5)):
        path = _bench_result(tmp_path / f"a{k}.json", 1000.0, 1, range(100, 110), train_seed=k)
        result = json.loads(path.read_text())
        result["extra"]["settings"] = {"eval_epsilon": 0.05, "also_epsilon": 0.001}
        result["extra"]["checkpoints"][-1]["episodes_also"] = [
            {"seed": s, "x_pos_max": 3000.0, "flag": i < also_flags} for i, s in enumerate(range(100, 110))]
        path.write_text(json.dumps(result))
        paths.append(path)
    headline, second = runs.one_run(str(paths[0]), 60.0), runs.one_run(str(paths[0]), 60.0, also=True)
    assert (headline["epsilon"], headline["summary"]["flag_rate"]) == (0.05, 0.1)
    assert (second["epsilon"], second["summary"]["flag_rate"], second["summary"]["mean"]) == (0.001, 0.3, 3000.0)
    with pytest.raises(runs.RunsError, match="no evaluated checkpoint at a second epsilon"):
        runs.one_run(str(_bench_result(tmp_path / "plain.json", 1000.0, 1, range(100, 110))), 60.0, also=True)
    out = tmp_path / "also.json"
    assert runs.main(["--minute", "60", "--also", "--side", "both", *map(str, paths), "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["epsilon"] == 0.001 and document["aggregate"]["both"]["pooled_flag_rate"] == pytest.approx(0.4)
    capsys.readouterr()
    mixed = json.loads(paths[1].read_text())
    mixed["extra"]["settings"]["eval_epsilon"] = 0.01
    paths[1].write_text(json.dumps(mixed))
    assert runs.main(["--minute", "60", "--side", "a", str(paths[0]), "--side", "b", str(paths[1])]) == 2
    assert "evaluated at different epsilons" in capsys.readouterr().err
