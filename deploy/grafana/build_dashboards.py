"""Writes the Grafana dashboards in deploy/grafana/dashboards/ from the panel lists below.

Edit the lists and run ``python deploy/grafana/build_dashboards.py``; a test checks the JSON files match.
Every expression must return data against a running system; the end-to-end test in
tests/gateway/test_gateway_prometheus_e2e.py runs each one against a real Prometheus scraping a real pipeline.
Queries use fixed ``[1m]`` windows (not ``$__rate_interval``) so the same text runs in Prometheus directly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "flywheel-prometheus"}
OUT = Path(__file__).resolve().parent / "dashboards"

# (title, unit, [(expr, legend)], description); a panel is 12 wide unless "wide"
Panel = tuple[str, str, list[tuple[str, str]], str]


def _labelled(metric: str, label: str) -> str:
    """Each actor's ``metric`` with ``label`` from its flywheel_actor_info: the env's own name for the measure."""
    return f"{metric} * on (instance) group_left ({label}) flywheel_actor_info"


OVERVIEW: list[Panel] = [
    ("Instances up, by service", "short", [
        ("sum by (service) (flywheel_up)", "{{service}} up"),
        ("sum by (service) (1 - flywheel_up)", "{{service}} down"),
    ], "flywheel_up is 0 once an instance has been silent for stale_after_s (5 s); it is dropped after 300 s."),
    ("Env steps/s per actor", "ops", [
        ("rate(flywheel_actor_env_steps_total[1m])", "{{instance}}"),
        ("sum(rate(flywheel_actor_env_steps_total[1m]))", "total"),
    ], "Environment steps per second, each actor and all together."),
    ("Transitions/s", "ops", [
        ("sum(rate(flywheel_actor_transitions_sent_total[1m]))", "sent by actors"),
        ("sum(rate(flywheel_replay_transitions_received_total[1m]))", "inserted into replay"),
        ("sum(rate(flywheel_actor_transitions_dropped_total[1m]))", "dropped by actors (replay full)"),
        ("sum(rate(flywheel_replay_transitions_rejected_total[1m]))", "rejected by replay"),
    ], "Drops happen only with on_full=drop; rejected transitions failed the codec's checks."),
    ("Replay size", "short", [
        ("flywheel_replay_size_transitions", "{{instance}} size"),
        ("flywheel_replay_capacity_transitions", "{{instance}} capacity"),
    ], "Transitions held by replay, and its capacity."),
    ("Replay insert and sample rates", "ops", [
        ("rate(flywheel_replay_transitions_received_total[1m])", "inserts/s {{instance}}"),
        ("rate(flywheel_replay_samples_total[1m])", "samples/s {{instance}}"),
        ("rate(flywheel_replay_sample_requests_dropped_total[1m])", "sample requests dropped/s {{instance}}"),
    ], "Transitions inserted and sampled per second."),
    ("Replay rate limiter", "percentunit", [
        ("rate(flywheel_replay_rate_limiter_sample_wait_seconds_total[1m])", "samplers waiting {{instance}}"),
        ("rate(flywheel_replay_rate_limiter_insert_wait_seconds_total[1m])", "inserts waiting {{instance}}"),
    ], "Share of time sample requests (learner) or inserts (actors) wait for the samples-per-insert limit."),
    ("Learner updates/s", "ops", [
        ("rate(flywheel_learner_updates_total[1m])", "{{instance}}"),
    ], "Gradient updates per second."),
    ("Learner waiting for data", "percentunit", [
        ("flywheel_learner_data_wait_ratio", "{{instance}} (last report)"),
        ("rate(flywheel_learner_data_wait_seconds_total[1m])", "{{instance}} (1 min)"),
    ], "Share of the learner's time spent waiting for sampled batches; high means starved for data."),
    ("Weight versions", "short", [
        ("flywheel_learner_weight_version", "learner {{instance}}"),
        ("flywheel_actor_weight_version", "actor {{instance}}"),
    ], "The learner publishes versioned weights; actors show the version they act with."),
    ("Policy lag per actor", "short", [
        ("flywheel_actor_policy_lag_versions", "{{instance}}"),
        ("max(flywheel_learner_weight_version) - on() group_right() flywheel_actor_weight_version",
         "{{instance}} (learner version - actor version)"),
    ], "Versions between the newest weights and the ones each actor acts with."),
    ("Weight age per actor", "s", [
        ("flywheel_actor_weight_age_seconds", "{{instance}}"),
    ], "Seconds since each actor loaded new weights."),
    ("Refused messages/s", "ops", [
        ("sum by (service) (rate({__name__=~\"flywheel_(actor|replay|learner)_messages_rejected_total\"}[1m]))",
         "{{service}}"),
        ("sum by (socket, fault) (rate(flywheel_gateway_messages_rejected_total[1m]))", "gateway {{socket}} {{fault}}"),
    ], "Malformed, oversized or wrong-kind messages refused by each service (services never crash on them)."),
]

LEARNING: list[Panel] = [
    ("Episode return", "short", [
        ("flywheel_actor_episode_return_mean", "{{instance}}"),
        ("avg(flywheel_actor_episode_return_mean)", "mean over actors"),
    ], "Mean return of each actor's last 100 episodes (exploring)."),
    ("Greedy evaluation return", "short", [
        ("flywheel_actor_eval_return_mean", "{{instance}}"),
    ], "Return of the greedy (epsilon 0) evaluation episodes some actors run beside their exploring ones."),
    ("Evaluation success rate", "percentunit", [
        ("flywheel_learner_eval_success_rate", "{{instance}}"),
    ], "The learner's evaluations of its weights under the preset's protocol (e.g. epsilon 0.05 after 0-30 no-ops "
       "from the level start), for envs that declare a success measure: share of episodes that reached the env's "
       "goal (its name: eval_success_label of flywheel_learner_info)."),
    ("Evaluation progress and return", "short", [
        ("flywheel_learner_eval_progress_mean", "progress mean {{instance}}"),
        ("flywheel_learner_eval_progress_median", "progress median {{instance}}"),
        ("flywheel_learner_eval_greedy_return", "return {{instance}}"),
    ], "The same evaluations: mean and median of the env's progress measure (its name: eval_progress_label of "
       "flywheel_learner_info, e.g. furthest x) and mean return."),
    ("Episode progress", "short", [
        (_labelled("flywheel_actor_episode_progress_mean", "progress_label"), "{{progress_label}} mean {{instance}}"),
        (_labelled("flywheel_actor_episode_progress_max", "progress_label"), "{{progress_label}} max {{instance}}"),
        (f"avg by (progress_label) ({_labelled('flywheel_actor_episode_progress_mean', 'progress_label')})",
         "{{progress_label}} mean over actors"),
        (f"max by (progress_label) ({_labelled('flywheel_actor_episode_progress_max', 'progress_label')})",
         "{{progress_label}} max over actors"),
        (_labelled("flywheel_actor_restarted_progress_mean", "progress_label"),
         "{{progress_label}} mean, restarted episodes {{instance}}"),
    ], "Envs that declare a progress measure (flywheel.envs.measures; legends name it as the env does, e.g. furthest "
       "x): the furthest each of an actor's last 100 level-start episodes got, mean and max, and apart from them the "
       "mean of its last 100 episodes restarted at a kept start state (the start-state curriculum)."),
    ("Episode success rate", "percentunit", [
        (_labelled("flywheel_actor_episode_success_rate", "success_label"), "{{success_label}} {{instance}}"),
        (f"avg by (success_label) ({_labelled('flywheel_actor_episode_success_rate', 'success_label')})",
         "{{success_label}} mean over actors"),
        (_labelled("flywheel_actor_restarted_success_rate", "success_label"),
         "{{success_label}}, restarted episodes {{instance}}"),
    ], "Envs that declare a success measure (e.g. the flag): share of each actor's last 100 level-start episodes "
       "that reached the goal, and of its last 100 restarted ones."),
    ("Episodes/s and length", "short", [
        ("sum(rate(flywheel_actor_episodes_total[1m]))", "episodes/s"),
        ("flywheel_actor_episode_length_mean", "length {{instance}}"),
    ], "Finished episodes per second, and their mean length in steps."),
    ("Loss", "short", [
        ("flywheel_learner_loss", "{{instance}}"),
    ], "Mean training loss since the previous report."),
    ("TD error", "short", [
        ("flywheel_learner_td_error_mean", "{{instance}}"),
    ], "Mean absolute TD error of the sampled batches (what the priorities follow)."),
    ("Q values", "short", [
        ("flywheel_learner_q_mean", "{{instance}}"),
    ], "Mean Q value of the actions taken in the sampled batches."),
    ("Epsilon per actor", "short", [
        ("flywheel_actor_epsilon", "{{instance}}"),
    ], "Ape-X exploration: actor i of N uses 0.4^(1 + 7 i / (N - 1)) unless set by control."),
    ("Learning rate and importance-sampling beta", "short", [
        ("flywheel_learner_lr", "lr {{instance}}"),
        ("flywheel_learner_beta", "beta {{instance}}"),
    ], "Current learning rate (control: set_lr) and the prioritized-replay beta."),
]

HARDWARE: list[Panel] = [
    ("CPU per instance", "short", [
        ("sum by (service, instance) (rate({__name__=~\"flywheel_.+_process_cpu_seconds_total\"}[1m]))",
         "{{service}} {{instance}}"),
        ("sum by (service, instance) (rate({__name__=~\"flywheel_.+_process_children_cpu_seconds_total\"}[1m]))",
         "{{service}} {{instance}} child processes"),
    ], "CPU cores used by each process (user + system) and by its child processes (env workers, checkpoint "
       "writers), from every service's telemetry."),
    ("CPU per service", "short", [
        ("sum by (service) (rate({__name__=~\"flywheel_.+_process_cpu_seconds_total\"}[1m]))"
         " + sum by (service) (rate({__name__=~\"flywheel_.+_process_children_cpu_seconds_total\"}[1m]))",
         "{{service}}"),
    ], "CPU cores used by all instances of each service, child processes included."),
    ("Resident memory per instance", "bytes", [
        ("{__name__=~\"flywheel_.+_process_resident_memory_bytes\"}", "{{service}} {{instance}}"),
        ("{__name__=~\"flywheel_.+_process_children_resident_memory_bytes\"}",
         "{{service}} {{instance}} child processes"),
    ], "Resident set size of each process, and of its child processes (pages shared with the parent count twice)."),
    ("Replay storage", "bytes", [
        ("flywheel_replay_memory_bytes", "{{instance}}"),
    ], "Bytes of replay's preallocated storage."),
    ("Actor time split", "percentunit", [
        ("sum by (instance) (rate(flywheel_actor_env_seconds_total[1m]))", "env {{instance}}"),
        ("sum by (instance) (rate(flywheel_actor_inference_seconds_total[1m]))", "inference {{instance}}"),
        ("sum by (instance) (rate(flywheel_actor_send_blocked_seconds_total[1m]))", "blocked on replay {{instance}}"),
    ], "Share of each actor's wall time stepping environments, running the network, and blocked sending."),
    ("Threads per instance", "short", [
        ("{__name__=~\"flywheel_.+_process_threads\"}", "{{service}} {{instance}}"),
    ], "Operating-system threads of each process."),
    ("Learner device", "short", [
        ("count by (device, precision) (flywheel_learner_info)", "{{device}} {{precision}}"),
    ], "Where the learner trains; the GPU panels show data only when this is a cuda device."),
    ("GPU utilization (learner)", "percentunit", [
        ("flywheel_learner_gpu_utilization_ratio", "{{instance}}"),
    ], "GPU only: share of time the learner's GPU was busy (NVML)."),
    ("GPU memory (learner)", "bytes", [
        ("flywheel_learner_gpu_memory_allocated_bytes", "allocated {{instance}}"),
        ("flywheel_learner_gpu_memory_reserved_bytes", "reserved {{instance}}"),
    ], "GPU only: memory PyTorch has allocated and reserved on the learner's GPU."),
]

DASHBOARDS = {
    "flywheel-overview": ("Flywheel overview", "System: throughput, replay, learner, weights, policy lag", OVERVIEW),
    "flywheel-learning": ("Flywheel learning",
                          "Returns, the env's progress and success, loss, TD error, Q values, epsilon", LEARNING),
    "flywheel-hardware": ("Flywheel hardware", "CPU, memory and GPU of every instance", HARDWARE),
}


def panel(pid: int, spec: Panel, x: int, y: int) -> dict[str, Any]:
    title, unit, targets, description = spec
    return {
        "id": pid, "type": "timeseries", "title": title, "description": description, "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 0}}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
                     "range": True} for i, (expr, legend) in enumerate(targets)],
    }


def dashboard(uid: str, title: str, description: str, panels: list[Panel]) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["flywheel"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "editable": False, "graphTooltip": 1, "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "links": [{"type": "dashboards", "tags": ["flywheel"], "title": "Flywheel", "asDropdown": False,
                   "includeVars": False, "keepTime": True}],
        "templating": {"list": []}, "annotations": {"list": []},
        "panels": [panel(i + 1, spec, 12 * (i % 2), 8 * (i // 2)) for i, spec in enumerate(panels)],
    }


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{uid}.json": json.dumps(dashboard(uid, *spec), indent=2) + "\n" for uid, spec in DASHBOARDS.items()}


def main() -> int:
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
