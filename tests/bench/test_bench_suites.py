"""The sb3, origins, scaling, mario and demos suites' parts that need no peer: summaries, the scale model,
evaluation, the weights watcher over a real socket, and the origin loop itself (briefly)."""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from flywheel import proto
from flywheel.bench.parts import mario_report
from flywheel.bench.parts.origin_loop import measure
from flywheel.bench.parts.scale import ScaleModel, scale_table
from flywheel.bench.runner import BenchContext, BenchError
from flywheel.bench.suites import demos, mario, origins, sb3, scaling
from flywheel.envs import env_spec
from flywheel.nets import build_q_network, weights_message
from flywheel.testing.run import greedy_returns
from flywheel.testing.weights import WeightsWatcher


def _point(t: float, steps: float, updates: float, transitions: float, cpu: dict[str, float]) -> dict:
    return {"t": t, "env_steps": steps, "updates": updates, "samples": 32 * updates, "transitions": transitions,
            "cpu": cpu}


def test_scale_model_costs_limits_and_needs() -> None:
    first = _point(10, 1000, 100, 1000, {"actor-0": 1.0, "actor-1": 1.0, "learner-0": 2.0, "replay-0": 0.5})
    last = _point(20, 3000, 350, 3000, {"actor-0": 3.0, "actor-1": 3.0, "learner-0": 10.0, "replay-0": 1.5})
    model = ScaleModel.between(first, last, actors=2, frame_skip=4)
    assert model is not None
    assert model.env_steps_per_s == 200 and model.updates_per_s == 25 and model.batch == 32
    assert model.spi == pytest.approx(4.0)
    assert model.actor_cpu_per_step == pytest.approx(4.0 / 2000)
    assert model.learner_cpu_per_sample == pytest.approx(8.0 / 8000)
    assert model.replay_cpu_per_item == pytest.approx(1.0 / 10000)
    assert model.cores_used == pytest.approx(1.3)
    # per env step: 2 ms actor + 4 x 1 ms learner + 5 x 0.1 ms replay = 6.5 ms of CPU
    rate, limit = model.env_steps_on(1.0)
    assert limit == "cores" and rate == pytest.approx(1 / 0.0065)
    rate, limit = model.env_steps_on(64.0)
    assert limit == "learner (one process)" and rate == pytest.approx(250.0)
    needs = model.needs(frames=4 * 3600 * 100, hours=1)  # 100 env steps/s
    assert needs["env_steps_per_s"] == pytest.approx(100)
    assert needs["actor_cores"] == pytest.approx(0.2) and needs["learner_samples_per_s"] == pytest.approx(400)
    assert needs["actors_at_measured_rate"] == pytest.approx(1.0)
    table = scale_table(model, targets=((1.44e6, 1),))[0]
    assert "| 1M frames in 1 h | 100 | 0.2 | 1 | 400 | 0.4 | 0.8 | 0.05 |" in table
    assert ScaleModel.between(first, first, actors=2) is None
    assert ScaleModel.from_points([first], actors=2) is None


def test_sb3_summary_counts_censored_runs_at_the_cap() -> None:
    opts = {"env": "CartPole-v1", "target": 475.0, "eval_episodes": 10, "eval_interval_s": 2.0, "actors": 2,
            "sb3_threads": [1, 2], "sets": []}

    def reached(s: float, steps: int, cpu: float) -> dict:
        return {"s": s, "steps": steps, "cpu_s": cpu}

    runs = [
        {"side": "sb3-1t", "seed": 0, "reached": reached(40.0, 20000, 41.0), "first_step_s": 3.0, "curve": []},
        {"side": "sb3-1t", "seed": 1, "reached": None, "first_step_s": 3.5, "curve": []},
        {"side": "sb3-1t", "seed": 2, "reached": reached(60.0, 30000, 59.0), "first_step_s": 3.2, "curve": []},
        {"side": "sb3-2t", "seed": 0, "reached": reached(30.0, 20000, 58.0), "first_step_s": 3.0, "curve": []},
        {"side": "sb3-2t", "seed": 1, "reached": reached(50.0, 26000, 96.0), "first_step_s": 3.1, "curve": []},
        {"side": "sb3-2t", "seed": 2, "reached": reached(70.0, 31000, 130.0), "first_step_s": 3.3, "curve": []},
        {"side": "flywheel", "seed": 0, "reached": reached(20.0, 90000, 36.0), "first_step_s": 5.0, "curve": []},
        {"side": "flywheel", "seed": 1, "reached": reached(25.0, 95000, 47.0), "first_step_s": 5.5, "curve": []},
        {"side": "flywheel", "seed": 2, "reached": reached(35.0, 99000, 66.0), "first_step_s": 6.0, "curve": []},
    ]
    result = sb3.summarize(runs, 300.0, opts, first_seed=1000)
    rows = {(r.metric, r.peer_name): r for r in result.rows}
    one = rows[("time to greedy 475", "SB3 DQN (zoo), 1 thread(s)")]
    assert one.peer_runs == [40.0, 300.0, 60.0] and one.peer == 60.0
    assert one.flywheel == 25.0 and one.ratio == pytest.approx(2.4) and one.met is True
    two = rows[("time to greedy 475", "SB3 DQN (zoo), 2 thread(s)")]
    assert two.peer == 50.0 and two.ratio == pytest.approx(2.0) and two.met is True
    cpu_one = rows[("CPU-seconds to greedy target", "SB3 DQN (zoo), 1 thread(s)")]
    assert cpu_one.flywheel == 47.0 and cpu_one.peer_runs == [41.0, 59.0] and cpu_one.peer == 50.0  # reached only
    assert rows[("CPU-seconds to greedy target", "SB3 DQN (zoo), 2 thread(s)")].peer == 96.0
    assert rows[("env steps to greedy target", "SB3 DQN (zoo), all threads")].flywheel == 95000
    assert any("sb3-1t 1 of 3" in note and "flywheel 0 of 3" in note for note in result.notes)
    seeds = "Seeds: reported on 1000-1002; tuning: Flywheel's vector preset was tuned on CartPole-v1 seeds 0-2"
    assert any(note.startswith(seeds) for note in result.notes)
    ci = next(note for note in result.notes if note.startswith("flywheel seconds"))
    assert "median 25.0, 95% CI 20.0-35.0 (n=3)" in ci  # the bootstrap of three values spans their range
    runs[6]["reached"] = runs[7]["reached"] = None  # a median that is censored never meets the goal
    assert sb3.summarize(runs, 300.0, opts).rows[0].met is False
    only = sb3.summarize([r for r in runs if r["side"] == "flywheel"], 300.0, opts)
    assert only.rows[0].peer is None and only.rows[0].met is None


def test_sb3_acrobot_is_reported_without_a_goal() -> None:
    opts = {"env": "Acrobot-v1", "target": -100.0, "eval_episodes": 10, "eval_interval_s": 2.0, "actors": 2,
            "sb3_threads": [1], "sets": []}
    runs = [{"side": "flywheel", "seed": 0, "reached": {"s": 80.0, "steps": 1, "cpu_s": 150.0}, "first_step_s": 5.0,
             "curve": []},
            {"side": "sb3-1t", "seed": 0, "reached": {"s": 60.0, "steps": 1, "cpu_s": 60.0}, "first_step_s": 3.0,
             "curve": []}]
    result = sb3.summarize(runs, 300.0, opts)
    assert result.rows[0].metric == "time to greedy -100" and result.rows[0].met is None and not result.rows[0].goal
    assert any("nobody tuned Flywheel for Acrobot-v1" in note for note in result.notes)


def test_origins_rows_compare_medians_against_the_reports_goals() -> None:
    def side(steps: float, updates: float, epoch: float) -> dict:
        return {"env_steps_per_s": steps, "updates_per_s": updates, "samples_per_s": 128 * updates,
                "learner_wait": 0.1, "acting_wait": 0.5, "lock_wait_ms_per_s": 0.0, "drops": 0, "epoch_s": epoch}

    result = origins.SuiteResult(suite="origins", title="t")
    origins._rows(result, "CartPole-v1", {"loop": [side(500, 30, 8), side(520, 32, 7.9)],
                                          "flywheel": [side(1000, 90, 4), side(1200, 100, 3.5)]})
    rows = {(r.metric, r.unit): r for r in result.rows}
    experience = rows[("experience rate", "env steps/s")]
    assert experience.flywheel == 1100 and experience.peer == 510 and experience.met is True
    training = rows[("training throughput", "updates/s")]
    assert training.ratio == pytest.approx(95 / 31) and training.met is True
    epoch = rows[("time per epoch (4,096 env steps + training)", "s")]
    assert epoch.ratio == pytest.approx(7.95 / 3.75) and epoch.met is False
    assert rows[("learner waiting for data", "% of time")].flywheel == pytest.approx(10.0)


def test_scaling_model_section_names_the_limit() -> None:
    first = _point(0, 0, 0, 0, {"actor-0": 0.0, "actor-1": 0.0, "learner-0": 0.0, "replay-0": 0.0})
    last = _point(10, 20000, 500, 20000, {"actor-0": 5.0, "actor-1": 5.0, "learner-0": 8.0, "replay-0": 1.0})
    model = ScaleModel.between(first, last, actors=2)
    run = {"model": model, "env_steps_per_s": model.env_steps_per_s, "samples_per_s": model.samples_per_s}
    measured = {"CartPole-v1": {"preset": {1: [run], 2: [run]}, "free": {1: [run], 2: [run]}}}
    section = scaling._model_sections(measured, [1, 2])[0]
    assert "| CartPole-v1 |" in section and "(learner)" in section
    assert "2,000 (1.90 cores busy)" in section


def _episodes(xs: list[float], flags: int = 0) -> list[dict]:
    return [{"seed": 100 + i, "x_pos_max": x, "flag": i < flags, "return": x / 10, "length": 100, "end": "death",
             "seconds": 1.0} for i, x in enumerate(xs)]


def test_mario_summary_rows_and_issue_24_goals() -> None:
    points = [
        {**_point(60 * m, 1000 * m, 100 * m, 1000 * m, {"actor-0": 10.0 * m, "learner-0": 5.0 * m,
                                                         "replay-0": 1.0 * m}),
         "distance": {"actor-0": 300.0 + m}, "flag_rate": {"actor-0": 0.01 if m == 5 else 0.0},
         "epsilon": {"actor-0": 0.4}, "replay_size": 1000.0 * m, "load": [1.5 + m, 1.0, 1.0]}
        for m in range(1, 61)]
    settings = {"env_id": "SuperMarioBros-1-1-v0", "minutes": 60.0, "actors": 1, "sets": ["learner.lr=0.0002"],
                "eval_episodes": 100, "eval_epsilon": 0.05, "eval_workers": 2, "stall_steps": 250,
                "seeds": list(range(100_000, 100_100))}
    random = _episodes([400.0, 600.0] * 50)
    checkpoints = [{"minute": 30.0, "env_steps": 30_000, "episodes": _episodes([900.0, 1100.0] * 50)},
                   {"minute": 60.0, "env_steps": 60_000, "episodes": _episodes([2400.0, 2600.0] * 50, flags=30)}]
    loads = {"start": [0.5, 0.5, 0.5], "end": [3.0, 2.0, 1.0]}
    result = mario_report.summarize(settings, points, checkpoints, random, loads)
    first, last, goal, moonshot = result.rows[:4]
    assert first.flywheel == 1000.0 and first.peer == 500.0 and "30,000 agent steps" in first.case
    assert last.flywheel == 2500.0 and "flags 30%" in last.metric and "95% CI" in last.metric
    assert goal.case == "goal: checkpoint at 60 min" and goal.flywheel == 30.0 and goal.met is True
    assert moonshot.case.startswith("moonshot") and moonshot.met is False  # 30% < 50%
    assert not any(r.case.startswith("long run") for r in result.rows)  # no checkpoint at 180 min
    assert any(r.metric == "env steps/s per actor" for r in result.rows)
    assert any("min 0.50, median" in n and "max 61.50" in n for n in result.notes)
    assert any("seeds 100000..100099" in n and "250 agent steps" in n for n in result.notes)
    assert result.extra["random"]["summary"]["mean"] == 500.0 and result.extra["flag_in_training"] is True
    short_x = {**checkpoints[1], "episodes": _episodes([2300.0, 2400.0] * 50, flags=60)}  # mean 2,350 < 2,400
    missed = mario_report.summarize(settings, points, [short_x], random, loads)
    assert [r.met for r in missed.rows if ": checkpoint at 60" in r.case] == [False, True]
    few = mario_report.summarize({**settings, "seeds": settings["seeds"][:4]}, points,
                                 [{**checkpoints[1], "episodes": _episodes([3000.0] * 4, flags=4)}],
                                 _episodes([400.0] * 4), loads)
    assert [r.met for r in few.rows[1:3]] == [False, False]  # 4 episodes are not the issue's 100
    long = mario_report.summarize({**settings, "minutes": 180.0}, points,
                                  [{"minute": 180.0, "env_steps": 2e6, "episodes": _episodes([3100.0] * 100, 85)}],
                                  random, loads)
    assert [(r.case, r.met) for r in long.rows[1:]][:1] == [("long run: checkpoint at 180 min", True)]
    short = mario_report.summarize({**settings, "seeds": settings["seeds"][:4]}, points[:2],
                                   [{**checkpoints[1], "minute": 2.0, "episodes": _episodes([1500.0] * 4)}],
                                   _episodes([400.0] * 4), loads)
    assert not any(r.met is not None for r in short.rows)  # no checkpoint at a goal's minute: no goal row
    assert any("Last poll: 60,000 agent steps (240,000 frames)" in n for n in result.notes)  # 4 frames a step
    skip6 = mario_report.summarize({**settings, "env_id": "SuperMarioBros-1-1-v0?size=42,frame_skip=6"}, points,
                                   checkpoints, random, loads)
    assert any("Last poll: 60,000 agent steps (360,000 frames)" in n for n in skip6.notes)
    assert skip6.extra["scale_model"]["frame_skip"] == 6


def test_mario_compose_beside_flywheel_run_at_the_nearest_agent_steps() -> None:
    settings = {"env_id": "SuperMarioBros-1-1-v0?size=42", "minutes": 30.0, "actors": 2, "sets": [],
                "deploys": ["run", "compose"], "eval_episodes": 50, "eval_epsilon": 0.05, "eval_workers": 2,
                "noop_max": 30, "stall_steps": 0, "seeds": list(range(100_000, 100_050))}
    cut = [{**r, "x_pos_max_stall_rule": r["x_pos_max"] - 100, "flag_stall_rule": False}
           for r in _episodes([950.0, 1050.0] * 25, flags=10)]
    checkpoints = [{"deploy": "run", "minute": 15.0, "env_steps": 15_000, "episodes": _episodes([900.0, 1100.0] * 25)},
                   {"deploy": "run", "minute": 30.0, "env_steps": 30_000, "episodes": _episodes([1500.0, 1700.0] * 25)},
                   {"deploy": "compose", "minute": 30.0, "env_steps": 16_000, "episodes": cut}]
    random = _episodes([400.0, 600.0] * 25)
    result = mario_report.summarize(settings, [], checkpoints, random, {"start": [0.5, 0.5, 0.5]})
    [row] = [r for r in result.rows if r.case.startswith("compose at 30 min")]
    assert "flywheel run at 15 min" in row.case  # 16,000 agent steps: nearer 15,000 than 30,000
    assert (row.flywheel, row.peer, row.met) == (1000.0, 1000.0, True)
    assert [r.case.split(":")[0] for r in result.rows[:3]] == ["run", "run", "compose"]
    [table] = result.sections
    assert "| compose 30 min | 16,000 | 1,000 (" in table and "| 900 | 0% |" in table  # the stall rule, beside
    assert "| 20% (" in table  # 10 flags of 50, with a Wilson interval
    assert any("0..30 NOOPs" in n and "No stall rule in the headline" in n for n in result.notes)
    assert any("docker compose up --scale actor=2" in n for n in result.notes)
    worse = [*checkpoints[:2], {**checkpoints[2], "episodes": _episodes([500.0, 700.0] * 25)}]
    rows = mario_report.summarize(settings, [], worse, random, {"start": [0.5, 0.5, 0.5]}).rows
    [row] = [r for r in rows if r.case.startswith("compose at")]
    assert row.met is False  # above random, but its mean is outside flywheel run's interval


def test_mario_second_epsilon_table_sits_beside_the_headline() -> None:
    settings = {"env_id": "SuperMarioBros-1-1-v0?size=42", "minutes": 30.0, "actors": 1, "sets": [],
                "eval_episodes": 50, "eval_epsilon": 0.05, "also_epsilon": 0.001, "eval_workers": 2,
                "noop_max": 30, "stall_steps": 0, "seeds": list(range(100_000, 100_050))}
    checkpoints = [{"minute": 30.0, "env_steps": 30_000, "episodes": _episodes([900.0, 1100.0] * 25),
                    "episodes_also": _episodes([1400.0, 1600.0] * 25, flags=25)}]
    result = mario_report.summarize(settings, [], checkpoints, _episodes([400.0, 600.0] * 25),
                                    {"start": [0.5, 0.5, 0.5]})
    assert result.rows[0].flywheel == 1000.0  # the headline stays at the headline's epsilon
    [_, table] = result.sections
    assert "at epsilon 0.001" in table and "| mean x, eps 0.05 |" in table
    assert "| run 30 min | 1,500 (" in table and "| 1,000 | 0% |" in table
    assert "| 50% (" in table  # 25 flags of 50 at epsilon 0.001, with a Wilson interval
    assert "| random | 500 (" in table
    without = mario_report.summarize({**settings, "also_epsilon": None}, [], checkpoints,
                                     _episodes([400.0, 600.0] * 25), {"start": [0.5, 0.5, 0.5]})
    assert len(without.sections) == 1


def test_mario_deploy_option_refuses_what_it_cannot_train(tmp_path: Path) -> None:
    assert mario._deploys("run, compose") == ["run", "compose"] and mario._deploys("compose") == ["compose"]
    for bad in ("", "kubernetes", "run,run"):
        with pytest.raises(BenchError, match="expected run, compose or run,compose"):
            mario._deploys(bad)
    with ExitStack() as stack, pytest.raises(BenchError, match="compose file as shipped: no --opt set"):
        mario._open("compose", stack, tmp_path, "CartPole-v1", 1, ["actor.eval_envs=0", "learner.lr=0.1"])
    assert not list(tmp_path.iterdir())  # refused before anything was built or written


def test_demos_plays_the_newest_mario_weights_through_flywheel_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    spec = env_spec(demos.MARIO)
    net = build_q_network(spec.obs_shape, spec.n_actions)
    with torch.no_grad():  # always "right" (action 1 of the simple set), but for the 5% exploration
        net.advantage.weight.zero_()
        net.advantage.bias.copy_(torch.eye(spec.n_actions)[1])
    distances = demos.evaluate_network(BenchContext(suite="demos"), "with", net, 2)
    assert len(distances) == 2 and all(d > 150 for d in distances)  # walked right from the start (x ~40)
    assert distances == demos.evaluate_network(BenchContext(suite="demos"), "with", net, 2)  # seeded episodes
    err = capsys.readouterr().err
    assert f"Mario with: evaluation seed {demos.EVAL_SEED}: distance" in err


def test_greedy_returns_are_seeded_and_batched() -> None:
    always_left = lambda obs: np.tile([1.0, 0.0], (len(obs), 1))  # noqa: E731
    a = greedy_returns(always_left, "CartPole-v1", 3, seed=7)
    b = greedy_returns(always_left, "CartPole-v1", 3, seed=7)
    assert a.shape == (3,) and (a == b).all() and (a >= 1).all() and (a < 30).all()


def test_weights_watcher_loads_the_newest_version_over_a_real_socket() -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:0")
    watcher = WeightsWatcher(pub.getsockopt_string(zmq.LAST_ENDPOINT), (4,), 2)
    try:
        source = build_q_network((4,), 2, hidden=64)
        deadline = time.monotonic() + 20
        while watcher.version < 3 and time.monotonic() < deadline:  # PUB/SUB joins late: resend until it lands
            pub.send(b"not a message")
            pub.send_multipart(proto.encode(weights_message(source, 3, source.name)))
            watcher.poll(200)
        assert watcher.version == 3 and watcher.net.name == "mlp-4-2-dueling-h64"
        obs = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
        with torch.inference_mode():
            expected = source(torch.from_numpy(obs)).numpy()
        np.testing.assert_allclose(watcher.q_values(obs), expected, rtol=1e-5, atol=1e-6)  # float32 sums
        assert watcher.rejected >= 1
        pub.send_multipart(proto.encode(weights_message(source, 2, source.name)))  # older: ignored
        watcher.poll(200)
        assert watcher.version == 3
    finally:
        watcher.close()
        pub.close(0)
        ctx.term()


def test_origin_loop_measures_a_short_cartpole_run() -> None:
    r = measure({"env": "CartPole-v1", "batch": 32, "learn_every": 4, "capacity": 5000, "min_size": 200,
                 "seconds": 1.0, "hidden": 32, "epoch_steps": 64, "sync_epochs": 1})
    assert r["env_steps"] > 64 and r["updates"] == r["env_steps"] // 4 and r["samples"] == 32 * r["updates"]
    assert 0 < r["learn_s"] < r["seconds"] and 0 < r["act_s"] < r["seconds"] and r["sync_s"] > 0
    assert len(r["epoch_times"]) == r["env_steps"] // 64 and all(t > 0 for t in r["epoch_times"])
    assert r["lock_wait_s"] >= 0 and r["drops"] == 0 and not math.isnan(r["seconds"])


def test_origin_loop_does_the_presets_work_per_step() -> None:
    from flywheel import presets

    for env_id, name in (("CartPole-v1", "vector"), ("SuperMarioBros-1-1-v0", "pixel")):
        preset = presets.load(name).sections
        p = origins._preset(env_id)
        assert p["batch"] == int(preset["learner"]["batch_size"])
        assert p["spi"] == float(preset["replay"]["samples_per_insert"])
        assert p["learn_every"] * p["spi"] == pytest.approx(p["batch"], rel=0.1)
        assert p["target_update_interval"] >= 1 and p["min_size"] >= 1


def test_learner_host_staging_option_refuses_a_typo_in_one_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from flywheel.cli import main

    assert main(["bench", "learner", "--quick", "--out", str(tmp_path / "out"), "--opt", "device=cpu",
                 "--opt", "host_staging=zero-copy"]) == 2
    assert "--opt host_staging='zero-copy': expected pinned or direct" in capsys.readouterr().err


def test_mario_kept_best_is_reported_beside_the_newest_weights_and_judges_no_goal() -> None:
    settings = {"env_id": "SuperMarioBros-1-1-v0?size=42", "minutes": 60.0, "actors": 2, "sets": [],
                "eval_episodes": 100, "eval_epsilon": 0.05, "eval_workers": 2, "noop_max": 30, "stall_steps": 0,
                "seeds": list(range(300_000, 300_100))}
    scored = {"weight_version": 2532, "mean_return": 311.2, "episodes": 10, "epsilon": 0.05, "noop_max": 30}
    checkpoints = [{"minute": 30.0, "env_steps": 30_000, "weight_version": 1400,
                    "episodes": _episodes([900.0, 1100.0] * 50)},  # no kept best yet at this checkpoint
                   {"minute": 60.0, "env_steps": 60_000, "weight_version": 3083,
                    "episodes": _episodes([2400.0, 2600.0] * 50, flags=30),
                    "best": {"file": "ckpt-60min/kept-best/best.safetensors", "weight_version": 2532,
                             "scored": scored, "episodes": _episodes([2000.0, 2200.0] * 50, flags=20)}}]
    result = mario_report.summarize(settings, [], checkpoints, _episodes([400.0, 600.0] * 50),
                                    {"start": [0.5, 0.5, 0.5]})
    [kept] = [r for r in result.rows if "kept best" in r.case]
    assert kept.case == "run: kept best at 60 min (weight version 2532; the newest 3083)"
    assert (kept.flywheel, kept.peer) == (2100.0, 2500.0) and "flags 20%" in kept.metric
    goal = next(r for r in result.rows if r.case == "goal: checkpoint at 60 min")
    assert goal.flywheel == 30.0  # the goals judge the newest weights, as before
    table = result.sections[-1]
    assert "best.safetensors" in table and "| run 60 min | v3083, 2,500, 30% | v2532, 311.2 over 10, eps 0.05, " \
        "0..30 | 2,100 (" in table
    assert "| 20% (" in table and "run 30 min" not in table  # only checkpoints that had a kept best
