"""flywheel bench load: the simulated actors' parts, and one short step of 4 of them against the real services."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flywheel.bench.parts.load_services import DEFAULT_SETS, compose_memory_limits, make_keys, metric, parse_sets
from flywheel.bench.parts.sim_actors import Frames
from flywheel.bench.runner import BenchContext, BenchError, write_results
from flywheel.bench.suites import load


def test_frames_slide_one_new_distinct_frame_per_step() -> None:
    frames = Frames(3, (4, 42, 42), "uint8", seed=1)
    obs, next_obs = frames.step()
    assert obs.shape == next_obs.shape == (3, 4, 42, 42) and obs.dtype == np.uint8
    assert np.array_equal(next_obs[:, :3], obs[:, 1:])  # a real stack: all but the newest frame shared
    later, _ = frames.step()
    assert np.array_equal(later, next_obs)
    newest = [next_obs[:, -1]] + [frames.step()[1][:, -1] for _ in range(50)]
    distinct = {bytes(f) for step in newest for f in step}
    assert len(distinct) == 3 * 51  # every new frame differs from every other: the replay stores each once


def test_settings_and_memory_limits_are_read() -> None:
    assert parse_sets("replay.capacity=5;learner.compile=off") == {"replay": {"CAPACITY": "5"},
                                                                  "learner": {"COMPILE": "off"}}
    assert parse_sets(DEFAULT_SETS)["replay"]["SAMPLES_PER_INSERT"] == "0"
    for bad in ("actor.num_envs=2", "replay.capacity", "capacity=5"):
        with pytest.raises(BenchError, match="SERVICE.KEY=VALUE"):
            parse_sets(bad)
    limits = compose_memory_limits()
    assert limits["gateway"] == 512 * 2**20 and limits["replay"] == 8 * 2**30 and limits["learner"] == 16 * 2**30
    text = 'flywheel_x{a="1"} 2.5\nflywheel_x{a="2"} 1\nflywheel_xy 7\n'
    assert metric(text, "flywheel_x") == 3.5 and metric(text, "flywheel_z") == 0.0


@pytest.mark.parametrize(("options", "message"), [
    ({"actors": "16,lots"}, "comma-separated integers"), ({"actors": "0"}, "at least 1"),
    ({"actors": "2", "rate": "0"}, "rate must be above 0"), ({"actors": "2", "envs": "0"}, "at least 1"),
])
def test_bad_options_are_one_clear_error_before_any_service_starts(tmp_path: Path, options: dict[str, str],
                                                                   message: str) -> None:
    ctx = BenchContext(suite="load", out_dir=tmp_path / "out", options={**options, "workdir": str(tmp_path / "w")})
    with pytest.raises(BenchError, match=message):
        load.run(ctx)
    assert not list((tmp_path / "w").glob("actors-*"))  # no step began: nothing was started


STEP_KEYS = {"actors", "window_s", "offered_per_s", "sent_per_s", "received_per_s", "leases_granted_after_s",
             "leases", "gateway", "replay", "learner", "publishing", "policy_lag", "metrics_render", "losses",
             "generator", "falls_behind", "exit_codes", "settings"}
SERVICE_KEYS = {"cpu_cores", "cpu_cores_per_1k_transitions_per_s", "rss_peak_bytes", "rss_reported_max_bytes",
                "rss_limit_bytes", "rss_share_of_limit", "zmq_io_cpu_cores"}
NESTED = {
    "publishing": {"publishes", "publishes_per_s", "updates_per_s", "bytes_per_publish", "wire_bytes_per_publish",
                   "encode_cpu_s_per_publish", "learner_io_thread_cpu_s_per_publish", "learner_cpu_s_per_update"},
    "policy_lag": {"p50_versions", "p95_versions", "max_versions", "samples", "fanout_spread_p50_s",
                   "fanout_spread_max_s", "versions_per_actor_min"},
    "metrics_render": {"p50_s", "max_s", "bytes"},
    "losses": {"sent", "received", "unaccounted", "actor_dropped", "generator_late_steps", "replay_rejected_batches",
               "replay_rejected", "actor_telemetry_dropped", "actor_rejected", "gateway_rejected",
               "curve_handshakes_refused", "identities_without_lease", "identities_without_weights"},
}


@pytest.mark.system
@pytest.mark.timeout(420)
def test_four_simulated_actors_against_the_real_services(tmp_path: Path) -> None:
    names = load.sim_names(4)
    keys = make_keys(tmp_path / "keys", names)
    sets = parse_sets(DEFAULT_SETS + ";replay.min_size_to_sample=200;learner.publish_interval_updates=5")
    figures = load.measure_step(tmp_path / "run", keys, 4, rate=16.0, seconds=8.0, warmup_s=3.0, per_process=2,
                                sets=sets, progress=print)
    print(json.dumps({k: v for k, v in figures.items() if k != "leases"}, indent=1, default=str))
    assert all(code == 0 for code in figures["exit_codes"].values()), figures["exit_codes"]
    lost = figures["losses"]
    # Transitions arrive: the replay's counter holds what the actors handed to their sockets, none dropped or lost.
    assert lost["sent"] > 0 and lost["received"] == lost["sent"] and lost["unaccounted"] == 0
    assert lost["actor_dropped"] == 0 and lost["replay_rejected_batches"] == 0 and figures["received_per_s"] > 0
    # CURVE: every identity's own key was accepted, nothing refused anywhere.
    assert lost["curve_handshakes_refused"] == 0 and not lost["gateway_rejected"] and lost["actor_rejected"] == 0
    # Weights: every simulated actor took at least one version; leases and telemetry: in the gateway's /status.
    assert lost["identities_without_weights"] == 0 and figures["policy_lag"]["versions_per_actor_min"] >= 1
    assert lost["identities_without_lease"] == 0
    assert figures["leases"]["holders_at_window_start"] == sorted(names)
    assert figures["leases"]["actors_up_at_window_start"] == 4 and figures["policy_lag"]["samples"] > 0
    assert figures["publishing"]["bytes_per_publish"] > 100_000  # the Mario network's tensors
    assert figures["metrics_render"]["bytes"] > 0 and figures["metrics_render"]["max_s"] > 0
    for service in ("gateway", "replay", "learner"):
        assert SERVICE_KEYS <= set(figures[service]) and figures[service]["rss_peak_bytes"] > 0, service
        assert figures[service]["cpu_cores"] > 0, service
    # The suite's results: every field in the JSON, one table line per step.
    ctx = BenchContext(suite="load", out_dir=tmp_path / "out", runs=1, warmup=0)
    json_path, md_path = write_results(load.assemble([figures], compose_memory_limits()), ctx, "flywheel bench load")
    step = json.loads(json_path.read_text())["extra"]["steps"][0]
    assert STEP_KEYS <= set(step), STEP_KEYS - set(step)
    for key, wanted in NESTED.items():
        assert wanted <= set(step[key]), (key, wanted - set(step[key]))
    assert "| 4 |" in md_path.read_text()
