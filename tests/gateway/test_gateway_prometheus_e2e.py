"""End to end: a real Prometheus scrapes the gateway of a running `flywheel run` pipeline on loopback.

The pipeline trains Super Mario Bros 1-1 with 60-step episodes, two actors of two envs each (set
FLYWHEEL_E2E_ENV=CartPole-v1, or any id, to run it on another environment).

Every PromQL expression of every Grafana dashboard (read from the JSON files, nothing hand-listed) must return
at least one series, with three explicit exceptions decided from what the system itself reports:

- expressions reading ``*_gpu_*`` metrics must return data exactly when the learner reports a ``cuda`` device
  (on a CPU machine they must return nothing: no fake zeros);
- expressions reading the actors' episode measures (``flywheel_actor_episode_progress_*``,
  ``flywheel_actor_episode_success_*``) or the learner's evaluated progress and success
  (``flywheel_learner_eval_success_rate``, ``..._eval_progress_*``) must return data exactly when the actors' env
  declares measures (their ``flywheel_actor_info`` carries a ``progress_label``: Super Mario Bros does);
- expressions reading the measures of restarted episodes (``flywheel_actor_restarted_*``) may return data only when
  an actor reports restarted episodes (the start-state curriculum; ``flywheel_actor_restarted_return_mean``).

Then control goes through the whole system: pause reaches every actor, including one that joins afterwards;
the replay ratio, publish interval, learning rate and exploration changes show up in Prometheus.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import AUTH, TOKEN, http_get, wait_for
from prometheus_helpers import Prometheus, dashboard_queries, metric_names, wait_all

from flywheel.testing.ports import free_port_block

pytestmark = pytest.mark.system

PROGRESS_METRICS = ("flywheel_actor_episode_progress_", "flywheel_actor_episode_success_",
                    "flywheel_learner_eval_success_rate", "flywheel_learner_eval_progress_")
RESTARTED_METRICS = "flywheel_actor_restarted_"
ENV_ID = os.environ.get("FLYWHEEL_E2E_ENV", "SuperMarioBros-1-1-v0")  # the main job; any env id works
PIXEL = ENV_ID.startswith("SuperMarioBros")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(PYTHONUNBUFFERED="1", FLYWHEEL_GATEWAY_CONTROL_TOKEN=TOKEN, **extra)
    return env


def _status(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=2) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def _trained(url: str) -> bool:
    """Learner updates, two weight versions, finished episodes on every actor and a greedy evaluation."""
    status = _status(url)
    if status is None:
        return False
    services = status["services"]
    learners = services.get("learner", {}).get("instances", [])
    actors = [a for a in services.get("actor", {}).get("instances", []) if a["up"]]
    return (bool(learners) and learners[0]["counters"].get("updates_total", 0) > 0
            and learners[0]["gauges"].get("weight_version", 0) >= 2 and len(actors) == 2
            and all(a["counters"].get("episodes_total", 0) > 0 for a in actors)
            and any("eval_return_mean" in a["gauges"] for a in actors)
            and "eval_greedy_return" in learners[0]["gauges"]
            and (not PIXEL or all("episode_progress_mean" in a["gauges"] for a in actors)))


def _post(url: str, command: str, body: dict[str, Any] | None = None, target: str | None = None) -> dict[str, Any]:
    query = f"?target={target}" if target else ""
    req = urllib.request.Request(f"{url}/control/{command}{query}", data=json.dumps(body or {}).encode(),
                                 headers={**AUTH, "Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 202
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{command} {body} -> {exc.code}: {exc.read().decode()}") from None


@pytest.fixture
def pipeline(tmp_path: Path):
    base = free_port_block(8)
    http, prom_port = base + 6, base + 7
    log = tmp_path / "run.log"
    settings = ["replay.min_size_to_sample=200", "replay.capacity=20000", "learner.publish_interval_updates=5",
                "learner.best_eval_interval_s=5", "learner.best_eval_episodes=2",  # the learner's evaluation panels
                "learner.best_eval_max_steps=100"]
    env_id = ENV_ID
    if PIXEL and "?" not in env_id:
        env_id += "?max_episode_steps=60"  # short episodes, so distances are reported within the test
    args = [sys.executable, "-m", "flywheel", "run", "--env", env_id, "--actors", "2", "--envs-per-actor",
            "2" if PIXEL else "4", "--base-port", str(base), "--http-port", str(http), "--checkpoint-dir",
            str(tmp_path / "ckpt"), "--progress-interval", "5"]
    for item in settings:
        args += ["--set", item]
    with open(log, "wb") as out:
        run = subprocess.Popen(args, env=_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    (tmp_path / "prom").mkdir()
    prom = Prometheus(tmp_path / "prom", f"127.0.0.1:{http}", prom_port)
    extra: list[subprocess.Popen[bytes]] = []
    try:
        yield {"url": f"http://127.0.0.1:{http}", "prom": prom, "log": log, "base": base, "tmp": tmp_path,
               "extra": extra, "env_id": env_id}
    finally:
        for proc in extra:
            proc.send_signal(signal.SIGTERM)
        prom.stop()
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=90)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
        for proc in extra:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def test_every_dashboard_query_returns_data_and_control_reaches_every_instance(pipeline) -> None:
    url, prom, log = pipeline["url"], pipeline["prom"], pipeline["log"]
    logs = [log, *sorted((pipeline["tmp"] / "ckpt" / "logs").glob("*.log"))]
    try:
        wait_for(lambda: _trained(url), timeout=120, what="the pipeline to train and report")
    except AssertionError:
        raise AssertionError("\n".join(f"--- {p.name}\n{_tail(p)}" for p in logs)) from None
    wait_for(prom.ready, timeout=30, what="prometheus ready")

    # /metrics of the running system is clean under promtool's lint
    status, metrics_text = http_get(f"{url}/metrics")
    assert status == 200
    lint = subprocess.run(["promtool", "check", "metrics"], input=metrics_text, capture_output=True, text=True,
                          timeout=30)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout + lint.stderr

    # Prometheus scrapes the gateway, keeping our instance labels (honor_labels)
    wait_for(lambda: prom.query('up{job="flywheel"} == 1'), timeout=30, what="the gateway scraped")
    assert {r["metric"]["instance"] for r in prom.query('flywheel_up{service="actor"}')} == {"actor-0", "actor-1"}

    gpu = bool(prom.query('flywheel_learner_info{device=~"cuda.*"}'))
    measured = bool(prom.query('flywheel_actor_info{progress_label!=""}'))  # the env declares its measures
    assert measured == PIXEL  # Super Mario Bros does; CartPole does not
    restarted = bool(prom.query("flywheel_actor_restarted_return_mean"))  # the start-state curriculum restarted some
    queries = dashboard_queries()
    assert len(queries) >= 30
    required, absent, unless_restarted = {}, {}, {}
    for board, title, expr in queries:
        names = metric_names(expr)
        key = f"{board} / {title}: {expr}"
        if not restarted and any(n.startswith(RESTARTED_METRICS) for n in names):
            unless_restarted[key] = expr
            continue
        needed = (gpu or not any("_gpu_" in n for n in names)) and (
            measured or not any(n.startswith(PROGRESS_METRICS) for n in names))
        (required if needed else absent)[key] = expr
    scoped = {e for _, _, e in queries if any("_gpu_" in n or n.startswith(PROGRESS_METRICS)
                                             for n in metric_names(e))}
    assert len(scoped) >= 4 and set(absent.values()) == {e for e in scoped if e not in required.values()}

    missing = wait_all({key: (lambda e=expr: prom.query(e)) for key, expr in required.items()}, timeout=45)
    assert not missing, "dashboard queries without data:\n" + "\n".join(missing)
    for key, expr in absent.items():  # honest: GPU panels are empty on a CPU learner, measures without measures
        assert prom.query(expr) == [], f"{key} returned data although the system has no GPU / no env measures"
    for key, expr in unless_restarted.items():  # restarted episodes' measures only once some are reported
        assert prom.query(expr) == [] or prom.query("flywheel_actor_restarted_return_mean"), (
            f"{key} returned data although no actor reports restarted episodes")

    # the alert rules load and evaluate; a healthy pipeline fires none
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == 9 and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError"))
                                                                         for r in rules]
    firing = [a for a in prom.api("alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, firing

    _control_reaches_every_instance(pipeline)


def _control_reaches_every_instance(pipeline: dict[str, Any]) -> None:
    url, prom, base = pipeline["url"], pipeline["prom"], pipeline["base"]
    _post(url, "pause", target="actor")
    _post(url, "set_exploration", {"epsilon": 0.05}, target="actor-1")
    _post(url, "set_replay_ratio", {"samples_per_insert": 6})
    _post(url, "set_publish_interval", {"updates": 7})
    _post(url, "set_lr", {"lr": 0.0003})
    # an actor that joins after the commands were sent learns the retained state too
    local = "tcp://127.0.0.1:{}".format
    late_env = _env(**{f"FLYWHEEL_ACTOR_{k}": v for k, v in {
        "INSTANCE": "actor-late", "ENV_ID": pipeline["env_id"], "NUM_ENVS": "2",
        "TRANSITIONS_ENDPOINT": local(base), "WEIGHTS_ENDPOINT": local(base + 2),
        "TELEMETRY_ENDPOINT": local(base + 3), "CONTROL_ENDPOINT": local(base + 4),
        "LEASE_ENDPOINT": local(base + 5)}.items()})
    late_log = pipeline["tmp"] / "actor-late.log"
    with open(late_log, "wb") as out:
        pipeline["extra"].append(subprocess.Popen([sys.executable, "-m", "flywheel", "actor"], env=late_env,
                                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    checks = {
        "every actor paused, the late one too":
            lambda: prom.query('count(flywheel_actor_paused{instance=~"actor-0|actor-1|actor-late"} == 1) == 3'),
        "actor-1 epsilon 0.05": lambda: prom.query('flywheel_actor_epsilon{instance="actor-1"} == 0.05'),
        "replay samples per insert 6": lambda: prom.query("flywheel_replay_samples_per_insert == 6"),
        "learner publishes every 7 updates": lambda: prom.query("flywheel_learner_publish_interval_updates == 7"),
        "learner lr 0.0003": lambda: prom.query("flywheel_learner_lr == 0.0003"),
    }
    missing = wait_all(checks, timeout=60)
    assert not missing, f"control did not arrive: {sorted(missing)}\n{_tail(late_log)}"
    _post(url, "resume", target="actor")
    missing = wait_all({"actors resumed": lambda: prom.query("count(flywheel_actor_paused == 0) == 3")}, timeout=30)
    assert not missing
    state = _status(url)
    assert state is not None
    assert {c["command"] for c in state["control"]["recent"]} >= {"pause", "resume", "set_replay_ratio",
                                                                  "set_publish_interval", "set_lr"}
