"""The learner's best policy: greedy evaluations in a real child process keep best.safetensors; a collapse after
the best leaves it in place, `latest` is the collapsed one, and a new learner on the folder compares with it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from flywheel.envs.measures import Measures
from flywheel.metrics_spec import GreedyEvalCounters, GreedyEvalGauges
from flywheel.policy import Policy, PolicyError
from flywheel.services.learner.best import BEST_JSON, CANDIDATE_FILE, SPAWN_LEAD_S, BestKeeper, measures
from flywheel.services.learner.checkpoint import save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.testing.cartpole import cartpole_core, set_policy

DEADLINE_S = 300.0  # a child spawned on a loaded machine takes a while to import and play


def evaluate_now(keeper: BestKeeper, core: LearnerCore, version: int) -> None:
    """Start an evaluation of ``version`` and turn the keeper until its result is taken."""
    keeper.next_at = 0.0
    keeper.tick(time.monotonic(), core, version)
    assert keeper.pending is not None and keeper.pending.version == version
    deadline = time.monotonic() + DEADLINE_S
    while keeper.pending is not None:
        assert time.monotonic() < deadline, "no evaluation result"
        time.sleep(0.1)
        keeper.tick(time.monotonic(), core, version)


@pytest.mark.system
def test_best_is_kept_through_a_collapse_and_latest_is_the_newest(tmp_path: Path) -> None:
    core = cartpole_core()
    set_policy(core, right_when_leaning_right=True)
    with pytest.raises(PolicyError, match="no best policy"):
        Policy.load(tmp_path, which="best")
    keeper = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=3, seed=11)
    try:
        evaluate_now(keeper, core, 5)  # a first round and, as it beats no best yet, a confirmation round
        best = json.loads((tmp_path / BEST_JSON).read_text())
        assert (best["weight_version"], best["mean_return"], best["episodes"], best["seeds"]) == (
            5, 500.0, 6, [11, 12, 13, 14, 15, 16])
        assert keeper.gauges() == GreedyEvalGauges(eval_greedy_return=500.0, eval_greedy_version=5.0,
                                                   eval_episodes=6.0, best_greedy_return=500.0,
                                                   best_weight_version=5.0)  # CartPole: no progress measure

        set_policy(core, right_when_leaning_right=False)  # a collapse: the newest weights drop the pole
        save_checkpoint(tmp_path, core, weight_version=9)
        keeper.tick(time.monotonic(), core, 5)
        assert keeper.pending is None  # no new weights since the last evaluation: nothing to do
        evaluate_now(keeper, core, 9)
        assert keeper.last is not None and keeper.last["mean_return"] < 20  # the collapse, seen
        assert keeper.last["seeds"] == [17, 18, 19]  # each round on new seeds; no confirmation of a worse one
        assert keeper.gauges().best_weight_version == 5.0 and keeper.counters() == GreedyEvalCounters(
            greedy_evaluations_total=3.0, greedy_evaluation_failures_total=0.0)
    finally:
        keeper.close()
    assert not (tmp_path / CANDIDATE_FILE).exists()

    best, latest = Policy.load(tmp_path), Policy.load(tmp_path, which="latest")
    assert (best.weight_version, latest.weight_version) == (5, 9)  # play, export: best unless asked
    obs = np.array([[0.0, 0.0, 0.05, 0.1]], np.float32)  # leaning right: best pushes right, latest left
    assert best.predict(obs)[0] == 1 and latest.predict(obs)[0] == 0

    again = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=3, seed=11)  # a resumed learner
    assert again.best is not None and again.best["weight_version"] == 5 and again.best["mean_return"] == 500.0
    assert again.rounds == 2  # its rounds go on from seed 17: the kept best's episodes are never played twice
    again.close()


@pytest.mark.system
def test_the_child_is_spawned_ahead_of_the_first_round_and_plays_the_rounds(tmp_path: Path) -> None:
    core = cartpole_core()
    set_policy(core, right_when_leaning_right=True)
    keeper = BestKeeper(tmp_path, "CartPole-v1", interval_s=SPAWN_LEAD_S + 60, episodes=1, seed=0)
    try:
        keeper.tick(time.monotonic(), core, 1)
        assert keeper.child is None  # a round more than SPAWN_LEAD_S away: nothing started yet
        keeper.tick(keeper.next_at - SPAWN_LEAD_S + 1, core, 1)
        assert keeper.child is not None and keeper.child.process.is_alive() and keeper.pending is None
        pid = keeper.child.process.pid  # its imports run while the interval runs out
        evaluate_now(keeper, core, 1)
        assert keeper.child.process.pid == pid and keeper.counters().greedy_evaluations_total == 2.0  # and confirmed
    finally:
        keeper.close()
    assert keeper.child is None


@pytest.mark.system
def test_a_failed_evaluation_is_counted_and_the_learner_goes_on(tmp_path: Path) -> None:
    core = cartpole_core()
    keeper = BestKeeper(tmp_path, "NoSuchEnv-v0", interval_s=3600, episodes=1, seed=0)
    try:
        evaluate_now(keeper, core, 3)
    finally:
        keeper.close()
    assert keeper.counters() == GreedyEvalCounters(greedy_evaluations_total=0.0, greedy_evaluation_failures_total=1.0)
    assert keeper.gauges().as_dict() == {}  # nothing evaluated, nothing kept: no gauge reported
    assert keeper.best is None and not (tmp_path / "best.safetensors").exists()


@pytest.mark.system
def test_a_killed_evaluation_child_is_a_failure_the_next_round_starts_a_new_one_and_close_never_hangs(
        tmp_path: Path) -> None:
    core = cartpole_core()
    set_policy(core, right_when_leaning_right=True)
    keeper = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=1, seed=0)
    try:
        keeper.next_at = 0.0
        keeper.tick(time.monotonic(), core, 3)
        assert keeper.child is not None and keeper.pending is not None
        first = keeper.child.process
        first.kill()  # e.g. the kernel's out-of-memory killer, mid-evaluation
        first.join(10)
        keeper.tick(time.monotonic(), core, 3)
        assert keeper.pending is None and keeper.child is None  # taken as a failure at once, not after a timeout
        assert keeper.counters().greedy_evaluation_failures_total == 1.0
        evaluate_now(keeper, core, 4)  # a fresh child plays the next round
        assert keeper.child is not None and keeper.child.process is not first
        assert keeper.last is not None and keeper.last["weight_version"] == 4
        keeper.next_at = 0.0
        keeper.tick(time.monotonic(), core, 5)  # a round in flight when the learner stops
        assert keeper.pending is not None
    finally:
        keeper.close()  # kills the child: a hang here is the test's timeout
    assert keeper.child is None
    assert not (tmp_path / CANDIDATE_FILE).exists()


@pytest.mark.system
def test_a_fresh_learner_in_the_folder_starts_its_best_over(tmp_path: Path) -> None:
    core = cartpole_core()
    set_policy(core, right_when_leaning_right=True)
    keeper = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=1, seed=0)
    try:
        evaluate_now(keeper, core, 4)
    finally:
        keeper.close()
    assert (tmp_path / "best.safetensors").is_file() and (tmp_path / BEST_JSON).is_file()
    resumed = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=1, seed=0, resumed=True)
    assert resumed.best is not None and resumed.best["weight_version"] == 4
    fresh = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=1, seed=0, resumed=False)
    assert fresh.best is None and not (tmp_path / "best.safetensors").exists() and not (tmp_path / BEST_JSON).exists()


@pytest.mark.parametrize("text", ['{"mean_return": "lots"',  # cut short
                                  '{"weight_version": 2, "mean_return": 1.0, "records": [{"seed": 0}]}'])  # no return
def test_an_unreadable_best_json_is_said_once_and_the_next_evaluation_sets_the_best(tmp_path: Path,
                                                                                  caplog: pytest.LogCaptureFixture,
                                                                                  text: str) -> None:
    (tmp_path / "best.safetensors").write_bytes(b"kept")
    (tmp_path / BEST_JSON).write_text(text)
    with caplog.at_level("WARNING", logger="flywheel.learner"):
        keeper = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=1, seed=0)
    assert keeper.best is None and (tmp_path / "best.safetensors").read_bytes() == b"kept"  # nothing removed
    assert [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()][0].endswith(
        "the next evaluation sets the best anew")
    with pytest.raises(PolicyError, match="which must be one of auto, best, latest, got 'newest'"):
        Policy.load(tmp_path, which="newest")


def lucky_seed(tmp_path: Path, core: LearnerCore, start: int = 0) -> tuple[int, dict[int, float]]:
    """A first seed from ``start`` on where the pole-dropping policy's round of 3 episodes is luckier than the 3
    after it, and that policy's return on each of 60 seeds from ``start``."""
    from flywheel.evaluation import evaluate
    from flywheel.services.learner.best import write_policy

    probe = tmp_path / "probe.safetensors"
    write_policy(probe, core, 1, "CartPole-v1")
    returns = {int(r["seed"]): float(r["return"]) for r in evaluate(
        "CartPole-v1", list(range(start, start + 60)), checkpoint=str(probe), epsilon=0.0, workers=1)}
    seed = next(s for s in range(start, start + 54)
                if sum(returns[k] for k in range(s, s + 3)) > sum(returns[k] for k in range(s + 3, s + 6)))
    return seed, returns


def judge_version_7(folder: Path, seed: int, core: LearnerCore, caplog: pytest.LogCaptureFixture
                    ) -> tuple[BestKeeper, list[str]]:
    """A keeper of rounds of 3 episodes from ``seed`` on ``folder``, once it has judged ``core`` as weight version 7
    (closed); and the learner's log lines."""
    keeper = BestKeeper(folder, "CartPole-v1", interval_s=3600, episodes=3, seed=seed)
    try:
        with caplog.at_level("INFO", logger="flywheel.learner"):
            evaluate_now(keeper, core, 7)
    finally:
        keeper.close()
    return keeper, [r.getMessage() for r in caplog.records]


@pytest.mark.system
def test_a_round_that_beats_the_best_is_played_again_and_kept_only_if_both_rounds_do(tmp_path: Path,
                                                                                    caplog: pytest.LogCaptureFixture
                                                                                    ) -> None:
    core = cartpole_core()
    set_policy(core, right_when_leaning_right=False)  # drops the pole within ~10 steps; how soon depends on the seed
    seed, returns = lucky_seed(tmp_path, core)
    first, both = sum(returns[k] for k in range(seed, seed + 3)) / 3, sum(returns[k] for k in range(seed, seed + 6)) / 6
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "best.safetensors").write_bytes(b"kept")  # never played: an earlier version's best.json has no episodes
    (folder / BEST_JSON).write_text(json.dumps({"weight_version": 2, "mean_return": (first + both) / 2}))
    keeper, messages = judge_version_7(folder, seed, core, caplog)
    assert keeper.last is not None and keeper.last["episodes"] == 6
    assert keeper.last["mean_return"] == pytest.approx(both)
    assert keeper.last["seeds"] == list(range(seed, seed + 6))
    assert [r["return"] for r in keeper.last["records"]] == [returns[k] for k in range(seed, seed + 6)]
    assert keeper.best is not None and keeper.best["weight_version"] == 2  # the lucky round was not kept
    assert (folder / "best.safetensors").read_bytes() == b"kept"
    assert any("playing it on 3 more seeds before it is kept" in m for m in messages)
    assert any("the best stays version 2" in m for m in messages)
    assert keeper.counters().greedy_evaluations_total == 2.0


@pytest.mark.parametrize(("kept_episodes", "playable", "kept"), [(1, True, 7), (50, True, 2), (1, False, 2)])
@pytest.mark.system
def test_the_kept_best_plays_the_confirmations_seeds_and_its_score_pools_every_episode_it_played(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, kept_episodes: int, playable: bool, kept: int) -> None:
    """A kept best whose score is luckier than the policy: the candidate's two rounds fall short of that score, but
    its replay of the confirmation's seeds pools in; one lucky episode is outweighed, fifty are not."""
    from flywheel.services.learner.best import write_policy

    core = cartpole_core()
    set_policy(core, right_when_leaning_right=False)
    seed, returns = lucky_seed(tmp_path, core, start=100)
    replayed = [returns[k] for k in range(seed + 3, seed + 6)]  # the kept best is that policy: it plays these
    first, both = sum(returns[k] for k in range(seed, seed + 3)) / 3, sum(returns[k] for k in range(seed, seed + 6)) / 6
    lucky = (first + both) / 2  # above both rounds' mean, below the first round's: the candidate is confirmed
    folder = tmp_path / "run"
    folder.mkdir()
    if playable:
        write_policy(folder / "best.safetensors", core, 2, "CartPole-v1")  # the same policy: it plays as it does
    else:
        (folder / "best.safetensors").write_bytes(b"not a policy")
    episodes = [{"seed": seed - 1 - k, "return": lucky, "progress": None, "success": None, "end": "terminated"}
                for k in range(kept_episodes)]
    (folder / BEST_JSON).write_text(json.dumps({"weight_version": 2, "mean_return": lucky, "episodes": kept_episodes,
                                                "records": episodes}))
    keeper, messages = judge_version_7(folder, seed, core, caplog)
    assert keeper.last is not None and keeper.last["mean_return"] == pytest.approx(both)
    assert keeper.best is not None and keeper.best["weight_version"] == kept
    written = json.loads((folder / BEST_JSON).read_text())
    assert written["weight_version"] == kept
    if not playable:  # the replay failed: counted, said, and the stored score decides
        assert keeper.counters() == GreedyEvalCounters(greedy_evaluations_total=2.0,
                                                       greedy_evaluation_failures_total=1.0)
        assert any("the kept best's replay of weight version 7's seeds failed" in m for m in messages)
        assert written == json.loads(json.dumps({"weight_version": 2, "mean_return": lucky,
                                                 "episodes": kept_episodes, "records": episodes}))
        return
    pooled = sum([lucky] * kept_episodes + replayed) / (kept_episodes + 3)  # as the keeper sums: the same float
    second = sum(replayed) / 3
    assert keeper.counters().greedy_evaluations_total == 3.0  # two rounds of the candidate, one replay
    assert any(f"the kept best, version 2, played the same seeds: {second:.2f}, its score {lucky:.2f} over "
               f"{kept_episodes} episodes now {pooled:.2f} over {kept_episodes + 3}" in m for m in messages)
    if kept == 7:  # the candidate's 6 episodes beat the kept best's 4 (1 lucky one and its replay)
        assert written["episodes"] == 6 and written["seeds"] == list(range(seed, seed + 6))
    else:  # the kept best stays, its score pooled in best.json
        assert (written["episodes"], written["mean_return"]) == (53, pytest.approx(pooled))
        assert written["seeds"] == [seed - 1 - k for k in range(50)] + list(range(seed + 3, seed + 6))
        assert keeper.gauges().best_greedy_return == pytest.approx(pooled) and "rescored_at" in written


def test_a_replay_that_never_answers_is_a_failure_and_the_candidates_rounds_are_judged_on_the_kept_score(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from flywheel.services.learner.best import Round

    def episode(seed: int, ret: float) -> dict[str, object]:
        return {"seed": seed, "return": ret, "progress": None, "success": None, "end": "terminated"}

    (tmp_path / "best.safetensors").write_bytes(b"kept")
    (tmp_path / BEST_JSON).write_text(json.dumps({"weight_version": 2, "mean_return": 100.0, "episodes": 1,
                                                  "records": [episode(0, 100.0)]}))
    (tmp_path / CANDIDATE_FILE).write_bytes(b"candidate")
    keeper = BestKeeper(tmp_path, "CartPole-v1", interval_s=60, episodes=1, seed=0)  # given up after 1,800 s
    assert keeper.rounds == 1  # seed 0 is the kept best's
    now = time.monotonic()
    keeper.pending = Round(7, now - 4000.0, [2], [episode(1, 150.0)], challenger=[episode(2, 130.0)], took=9.0)
    keeper.evaluated_version = 7
    with caplog.at_level("INFO", logger="flywheel.learner"):
        keeper.tick(now, cartpole_core(), 7)  # no child ever answered: past the timeout
    keeper.close()
    assert keeper.pending is None and keeper.counters().greedy_evaluation_failures_total == 1.0
    assert any("the kept best's replay of weight version 7's seeds gave no result in 4000 s" in r.getMessage()
               for r in caplog.records)
    best = json.loads((tmp_path / BEST_JSON).read_text())  # 140 over the two rounds beats the kept 100
    assert (best["weight_version"], best["mean_return"], best["seeds"], best["seconds"]) == (7, 140.0, [1, 2], 9.0)
    assert (tmp_path / "best.safetensors").read_bytes() == b"candidate"


def mario_walker() -> LearnerCore:
    """A real Mario learner core whose network always prefers action 1 (right) of SIMPLE_MOVEMENT."""
    core = LearnerCore((4, 84, 84), 7, CoreConfig())
    core.env_id = "SuperMarioBros-1-1-v0"  # type: ignore[attr-defined]
    with torch.no_grad():
        core.online.advantage.weight.zero_()
        core.online.advantage.bias.copy_(torch.tensor([0.0, 1.0, 0, 0, 0, 0, 0]))
    return core


@pytest.mark.parametrize(("epsilon", "noop_max", "alike"), [(0.0, 0, True), (0.05, 30, False)])
@pytest.mark.system
def test_mario_episodes_are_one_episode_played_greedily_and_differ_on_the_evaluation_protocol(
        tmp_path: Path, epsilon: float, noop_max: int, alike: bool) -> None:
    keeper = BestKeeper(tmp_path, "SuperMarioBros-1-1-v0", interval_s=3600, episodes=4, seed=300,
                        max_steps=40, epsilon=epsilon, noop_max=noop_max)
    try:
        evaluate_now(keeper, mario_walker(), 3)
    finally:
        keeper.close()
    best = json.loads((tmp_path / BEST_JSON).read_text())
    assert (best["epsilon"], best["noop_max"], best["episodes"]) == (epsilon, noop_max, 8)
    # the emulator is deterministic: greedy from the level start, 8 seeds are one episode; no-ops and epsilon differ
    assert (best["min_return"] == best["max_return"]) is alike


def test_a_best_scored_under_another_protocol_is_not_compared_with(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "best.safetensors").write_bytes(b"kept")
    (tmp_path / BEST_JSON).write_text(json.dumps({"weight_version": 2, "mean_return": 311.0, "epsilon": 0.0}))
    assert BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=1, seed=0).best is not None  # same: greedy
    with caplog.at_level("WARNING", logger="flywheel.learner"):
        keeper = BestKeeper(tmp_path, "CartPole-v1", interval_s=3600, episodes=1, seed=0, epsilon=0.05, noop_max=30)
    assert keeper.best is None and (tmp_path / "best.safetensors").read_bytes() == b"kept"  # nothing removed
    assert any("scored at epsilon 0 with 0..0 no-ops, these evaluations play epsilon 0.05 with 0..30: not "
               "comparable" in r.getMessage() for r in caplog.records)


def test_the_evaluation_protocol_settings_are_validated_at_start() -> None:
    from pydantic import ValidationError

    from flywheel.services.learner.settings import LearnerSettings

    assert (LearnerSettings().best_eval_epsilon, LearnerSettings().best_eval_noop_max) == (0.0, 0)  # greedy, as before
    for bad in ({"best_eval_epsilon": 1.5}, {"best_eval_epsilon": -0.1}, {"best_eval_noop_max": -1}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            LearnerSettings(**bad)


def test_an_evaluation_reports_the_success_rate_and_progress_where_the_env_has_them() -> None:
    records = [{"progress": x, "success": flag, "return": 1.0} for x, flag in ((3161, True), (722, False),
                                                                               (1400, False), (3161, True))]
    both = Measures(progress="cells visited", success="goal")  # the labels of the env's own measures
    assert measures(records, both) == {"success_rate": 0.5, "progress_mean": 2111.0, "progress_median": 2280.5}
    assert measures(records, Measures(success="goal")) == {"success_rate": 0.5}  # only the measures it declares
    assert measures([{"progress": None, "success": False, "return": 1.0}], Measures()) == {}  # an env with none


def test_the_learner_names_its_evaluation_measures_with_the_env_labels(tmp_path: Path) -> None:
    mario = BestKeeper(tmp_path / "m", "SuperMarioBros-1-1-v0", interval_s=3600, episodes=1, seed=0)
    assert mario.labels() == {"eval_progress_label": "furthest x", "eval_success_label": "flag"}
    assert BestKeeper(tmp_path / "c", "CartPole-v1", interval_s=3600, episodes=1, seed=0).labels() == {}
