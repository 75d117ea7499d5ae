"""flywheel run --seed: two one-actor CartPole runs with the same seed store the same first transitions (envs,
exploration draws and the learner's initial network seeded), another seed does not; run.json records the seed, a
run without one draws and records it, and --resume restores it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flywheel.cli import build_parser
from flywheel.services.replay import checkpoint
from flywheel.testing.run import clean_env

FIRST = 500  # rows the replay holds before the learner may sample: all made before any update, by seeded draws only
RUN = ["run", "--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "4", "--steps", str(2 * FIRST),
       "--no-video", "--base-port", "0", "--http-port", "0", "--progress-interval", "1",
       "--set", f"replay.min_size_to_sample={FIRST}"]
COLUMNS = ("obs", "action", "reward", "discount", "next_obs")
pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]  # three short runs at once


def _start(folder: Path, *seed: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flywheel", *RUN, "--checkpoint-dir", str(folder), *seed],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _first_rows(folder: Path, proc: subprocess.Popen[str]) -> dict[str, np.ndarray]:
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()  # only if it outlived the wait
    assert proc.returncode == 0, output[-4000:]
    state = checkpoint.load(folder / "replay")
    end, oldest = (int(x) for x in state["storage.positions"])  # next position, oldest
    assert oldest == 0 and end >= FIRST, (oldest, end)
    return {name: np.array(state[f"storage.{name}"][:FIRST]) for name in COLUMNS}


def _saved(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """Three runs at once (each on Unix sockets and a port the kernel picks): seed 7 twice, and no seed."""
    base = tmp_path_factory.mktemp("seed")
    procs = {name: _start(base / name, *seed) for name, seed in (("a", ("--seed", "7")), ("b", ("--seed", "7")),
                                                                 ("drawn", ()))}
    return {name: (base / name, _first_rows(base / name, proc)) for name, proc in procs.items()}


def test_the_same_seed_gives_the_same_first_transitions_and_another_does_not(
        runs: dict[str, tuple[Path, dict[str, np.ndarray]]]) -> None:
    (_, a), (_, b), (_, other) = runs["a"], runs["b"], runs["drawn"]
    for name in COLUMNS:
        np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name}: same seed, different transitions")
    assert not np.array_equal(a["obs"], other["obs"])  # other env seeds: other first observations
    assert not np.array_equal(a["action"], other["action"])
    assert len(np.unique(a["action"])) == 2  # both actions were played: the comparison is not trivially equal
    for folder, _ in runs.values():  # the actor waited for the learner's (seeded) first weights before acting
        log = (folder / "logs" / "actor-0.log").read_text()
        assert -1 < log.find("first weights received") < log.find("actor actor-0: 4 x CartPole-v1"), log[-2000:]


def test_run_json_records_the_seed_and_each_child_gets_its_own(
        runs: dict[str, tuple[Path, dict[str, np.ndarray]]]) -> None:
    a, b, drawn = (_saved(runs[name][0]) for name in ("a", "b", "drawn"))
    assert a["flags"]["seed"] == b["flags"]["seed"] == 7
    assert isinstance(drawn["flags"]["seed"], int) and drawn["flags"]["seed"] != 7  # drawn, then recorded
    seeds = [a["services"]["replay"]["SEED"], a["services"]["learner"]["SEED"], a["actor_instances"][0]["SEED"]]
    assert len(set(seeds)) == 3  # each child its own seed
    assert seeds == [b["services"]["replay"]["SEED"], b["services"]["learner"]["SEED"],
                     b["actor_instances"][0]["SEED"]]
    assert seeds[0] != drawn["services"]["replay"]["SEED"]


def test_resume_restores_the_seed_and_derives_new_child_seeds(
        runs: dict[str, tuple[Path, dict[str, np.ndarray]]]) -> None:
    """What `flywheel run --resume` does before it starts anything: the saved seed comes back, the children's seeds
    are derived for the run's second start (a resumed run does not replay its first draws)."""
    from flywheel.launch import runconfig
    from flywheel.launch.run import make_plan
    from flywheel.launch.runplan import seed_plan

    folder = runs["a"][0]
    argv = ["run", "--resume", "--checkpoint-dir", str(folder), "--base-port", "0", "--http-port", "0"]
    args = build_parser().parse_args(argv)
    args.given_flags = runconfig.given_flags(argv)
    saved = runconfig.apply_saved(args)
    assert args.seed == 7 and runconfig.start_index(saved) == 1
    plan = make_plan(args)
    try:
        seed_plan(plan, args.seed, runconfig.start_index(saved))
        first = _saved(folder)["services"]["learner"]["SEED"]
        assert plan.env["learner"]["SEED"] != first  # start 1, not start 0
    finally:
        plan.remove_socket_dir()
    again = build_parser().parse_args([*argv, "--seed", "8"])
    again.given_flags = runconfig.given_flags([*argv, "--seed", "8"])
    runconfig.apply_saved(again)
    assert again.seed == 8  # given again, it wins
