"""The four services as separate processes on loopback with CartPole, observed through the gateway."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from pipeline_helpers import clean_env, get_json, get_text, metric_values, start, wait_until

from flywheel.testing.reported import GATEWAY_HTTP, GATEWAY_UP, LEARNER_WEIGHTS, REPLAY_TCP, reported

pytestmark = pytest.mark.system


def test_four_services_train_cartpole_end_to_end(tmp_path: Path) -> None:
    any_port = "tcp://127.0.0.1:0"  # every server binds a port the kernel picks and says which in its start line

    def env(service: str, **values: str) -> dict[str, str]:
        return clean_env(**{f"FLYWHEEL_{service.upper()}_{k}": v for k, v in values.items()})

    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = [tmp_path / f"{name}.log" for name in ("gateway", "replay", "learner", "actor", "actor-b")]
    try:
        procs["gateway"] = start(["gateway"], env("gateway", TELEMETRY_ENDPOINT=any_port, CONTROL_ENDPOINT=any_port,
                                                  LEASE_ENDPOINT=any_port, HTTP_PORT="0", HTTP_HOST="127.0.0.1"),
                                 logs[0])
        telemetry, control, lease = reported(logs[0], GATEWAY_UP)
        (url,) = reported(logs[0], GATEWAY_HTTP)
        common = {"TELEMETRY_ENDPOINT": telemetry, "CONTROL_ENDPOINT": control}
        procs["replay"] = start(["replay"], env("replay", **common, TRANSITIONS_BIND=any_port, SAMPLE_BIND=any_port,
                                                MIN_SIZE_TO_SAMPLE="200", CAPACITY="20000",
                                                CHECKPOINT_DIR=str(tmp_path / "replay")), logs[1])
        transitions, sample = reported(logs[1], REPLAY_TCP)
        procs["learner"] = start(["learner"], env("learner", **common, ENV_ID="CartPole-v1", SAMPLE_ENDPOINT=sample,
                                                  WEIGHTS_BIND=any_port, BATCH_SIZE="32", PUBLISH_INTERVAL_UPDATES="5",
                                                  TORCH_THREADS="1", CHECKPOINT_DIR=str(tmp_path / "learner")),
                                 logs[2])
        (weights,) = reported(logs[2], LEARNER_WEIGHTS, timeout=120)
        assert not any(e.endswith(":0") for e in (telemetry, control, lease, transitions, sample, weights))
        actor = env("actor", **common, ENV_ID="CartPole-v1", NUM_ENVS="4", TRANSITIONS_ENDPOINT=transitions,
                    WEIGHTS_ENDPOINT=weights, LEASE_ENDPOINT=lease)
        procs["actor"] = start(["actor"], actor, logs[3])
        procs["actor-b"] = start(["actor"], actor, logs[4])

        def trained() -> dict | None:
            status = get_json(f"{url}/status")
            if status is None:
                return None
            services = status["services"]
            actors = [i for i in services.get("actor", {}).get("instances", []) if i["up"]]
            replay = services.get("replay", {}).get("totals", {})
            learner = services.get("learner", {}).get("totals", {})
            ok = (len(actors) == 2
                  and all(a["counters"].get("env_steps_total", 0) > 0 for a in actors)
                  and all(a["counters"].get("transitions_sent_total", 0) > 0 for a in actors)
                  and all(a["gauges"].get("weight_version", 0) > 0 for a in actors)
                  and replay.get("transitions_received_total", 0) > 0 and replay.get("samples_total", 0) > 0
                  and learner.get("updates_total", 0) > 20)
            return status if ok else None

        status = wait_until(trained, 120, "actors, replay and learner to make progress", logs)
        assert {"actor", "replay", "learner"} <= set(status["services"])
        epsilons = sorted(i["gauges"]["epsilon"] for i in status["services"]["actor"]["instances"])
        assert epsilons[0] < epsilons[1]  # two leases: actor 0 explores at 0.4, actor 1 at 0.4 ** 8

        text = get_text(f"{url}/metrics")
        steps = metric_values(text, "flywheel_actor_env_steps_total")
        assert len(steps) == 2 and all(v > 0 for v in steps.values())
        assert all('service="actor"' in labels for labels in steps)
        assert sum(metric_values(text, "flywheel_replay_transitions_received_total").values()) > 0
        assert sum(metric_values(text, "flywheel_replay_samples_total").values()) > 0
        assert sum(metric_values(text, "flywheel_learner_updates_total").values()) > 0
        # learner and replay share this host: batches come through the replay's shared memory
        assert sum(metric_values(text, "flywheel_learner_shm_batches_total").values()) > 0
        assert all(v > 0 for v in metric_values(text, "flywheel_actor_weight_version").values())
    finally:
        for name in ("actor", "actor-b", "learner", "replay", "gateway"):
            if name in procs and procs[name].poll() is None:
                procs[name].send_signal(signal.SIGTERM)
                try:
                    procs[name].wait(timeout=30)
                except subprocess.TimeoutExpired:
                    procs[name].kill()
                    procs[name].wait()
    codes = {name: p.returncode for name, p in procs.items()}
    assert all(code == 0 for code in codes.values()), codes
    assert (tmp_path / "learner" / "learner.safetensors").exists()
    assert (tmp_path / "replay" / "replay" / "manifest.json").exists()
