"""What the learner's telemetry carries on the wire: the same keys as before typed declarations, with live values."""

from __future__ import annotations

import pytest
import torch

from flywheel.metrics_spec import (
    SERVICE_PARTS,
    Counters,
    GpuGauges,
    ProcessCounters,
    ProcessGauges,
    ReplayClientCounters,
)

# The learner's telemetry keys as the services and dashboards have always read them (its own counts, its sampling
# client's and its greedy evaluations'): renaming one is a change of the product (Prometheus names, Grafana
# queries), never a side effect of a refactor.
LEARNER_COUNTERS = {
    "updates_total", "samples_total", "weights_published_total", "messages_rejected_total", "skipped_updates_total",
    "data_wait_seconds_total", "checkpoints_total", "control_rejected_total", "demo_samples_total",
    "sample_batches_total", "shm_batches_total", "tcp_batches_total", "compact_batches_total", "packed_batches_total",
    "requests_resent_total", "replay_reconnects_total", "replies_unrequested_total", "priority_updates_dropped_total",
    "greedy_evaluations_total", "greedy_evaluation_failures_total", "pretrain_updates_total", "resets_total",
    "weights_fanout_bytes_total", "weights_publishes_deferred_total",
}
LEARNER_GAUGES = {
    "loss", "td_error_mean", "q_mean", "updates_per_second", "samples_per_second", "data_wait_ratio",
    "weight_version", "beta", "lr", "paused", "requests_in_flight", "batches_waiting", "update_step", "replay_size",
    "publish_interval_updates", "publish_interval_seconds", "weights_subscribers", "weights_min_interval_seconds",
}
# Reported only when there is a value: the margin loss once a demonstration row was trained on, the GPU's numbers
# on CUDA, the greedy evaluations' once one finished.
LATER_GAUGES = {"margin_loss", "eval_greedy_return", "eval_greedy_version", "best_greedy_return",
                "best_weight_version", "eval_episodes", "eval_success_rate", "eval_progress_mean",
                "eval_progress_median"}
GPU_GAUGES = {"gpu_memory_allocated_bytes", "gpu_memory_reserved_bytes", "gpu_memory_peak_bytes",
              "gpu_utilization_ratio", "achieved_tflops"}
PROCESS = {d.name for d in ProcessCounters.declared()}
PROCESS_GAUGES = {d.name for d in ProcessGauges.declared()}
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]  # the CUDA case runs where there is a GPU


def test_the_declarations_are_the_learners_wire_keys() -> None:
    parts = SERVICE_PARTS["learner"]
    sent = {d.name for cls in parts for d in cls.declared() if d.sent}
    assert {d.name for cls in parts if issubclass(cls, Counters) for d in cls.declared() if d.sent} == \
        LEARNER_COUNTERS
    assert sent - LEARNER_COUNTERS == LEARNER_GAUGES | LATER_GAUGES | GPU_GAUGES
    assert {d.name for d in ReplayClientCounters.declared() if not d.sent} == {"bad_replies", "priority_updates"}
    assert {d.name for d in GpuGauges.declared()} < GPU_GAUGES


@pytest.mark.parametrize("device", DEVICES)
def test_a_learner_reports_its_counts_under_the_same_keys(harness, device: str) -> None:
    h = harness(device)
    h.loop.counters.pretrain_updates_total = 7.0  # what services/learner/main.py sets after pretraining
    h.loop.counters.resets_total = 0.0  # what the loop sets when shrink-and-perturb is scheduled
    h.loop.start()
    h.send_control("set_lr", lr="fast")  # refused: counted in three counters
    h.drive(lambda: h.counter("updates_total") >= 10 and h.counter("messages_rejected_total") == 1)
    last = h.reports[-1]
    labelled = {k for k in last.counters if "{" in k}
    assert labelled == {'rejected_total{where="control",reason="bad_args"}'}
    assert set(last.counters) - labelled == LEARNER_COUNTERS | PROCESS
    gpu = GPU_GAUGES - {"gpu_utilization_ratio"} if device == "cuda" else set()  # NVML may be missing
    assert LEARNER_GAUGES | PROCESS_GAUGES | gpu <= set(last.gauges) <= LEARNER_GAUGES | PROCESS_GAUGES | gpu | {
        "gpu_utilization_ratio"}
    c = last.counters
    assert c['rejected_total{where="control",reason="bad_args"}'] == 1 and c["control_rejected_total"] == 1
    assert c["pretrain_updates_total"] == 7.0 and c["samples_total"] == 32 * c["updates_total"] >= 320
    assert c["sample_batches_total"] == c["tcp_batches_total"] + c["shm_batches_total"] > 0
    assert c["tcp_batches_total"] > 0 and c["shm_batches_total"] == 0  # the fake replay offers no shared memory
    assert c["weights_published_total"] >= 2 and c["skipped_updates_total"] == c["checkpoints_total"] == 0
    assert (c["greedy_evaluations_total"], c["greedy_evaluation_failures_total"]) == (0, 0)  # every 300 s
    assert h.loop.sampler.counters.sample_batches_total >= c["sample_batches_total"]  # the typed counts it came from
    assert h.loop.counters.samples_total >= c["samples_total"]
    g = last.gauges
    assert g["lr"] == pytest.approx(1e-3) and g["paused"] == 0 and g["update_step"] == c["updates_total"]
    assert g["weight_version"] >= 2 and g["publish_interval_updates"] == 5 and 0 <= g["data_wait_ratio"] <= 1
    # the harness's one weights SUB, sent every version under the default budget (one subscriber: not shaped)
    assert g["weights_subscribers"] == 1 and c["weights_publishes_deferred_total"] == 0
    assert c["weights_fanout_bytes_total"] > 0 and 0 <= g["weights_min_interval_seconds"] < 0.01
    assert set(h.loop.last_gauges) == set(g) - PROCESS_GAUGES  # what the CLI's progress line reads
    if device == "cuda":
        assert g["gpu_memory_allocated_bytes"] > 0 and g["achieved_tflops"] > 0
