"""The learner's numbers between telemetry reports: a window of device metric sums, rates and GPU readings."""

from __future__ import annotations

import logging
import math
import time

import torch

from flywheel.metrics_spec import GpuGauges, TrainingGauges
from flywheel.nets import forward_macs

from .core import LearnerCore
from .sums import MetricSums

log = logging.getLogger("flywheel.learner")


class MetricsWindow:
    """Accumulates what happened since the last report and turns it into gauges (means and rates)."""

    def __init__(self) -> None:
        self.reset(time.monotonic())
        self.last_means = (math.nan, math.nan, math.nan)  # loss, TD error, Q of the last window with a batch
        self.last_margin = math.nan  # mean large-margin loss over the demonstration rows of the last window with any

    def reset(self, now: float) -> None:
        self.start = now
        self.wait_s = 0.0
        self.steps = 0
        self.samples = 0
        self.loss = self.td = self.q = 0.0
        self.batches = 0
        self.demo_rows = 0
        self.margin = 0.0

    def add_sums(self, sums: MetricSums) -> None:
        self.loss += sums.loss
        self.td += sums.td_error
        self.q += sums.q
        self.batches += sums.batches
        self.demo_rows += sums.demo_rows
        self.margin += sums.margin_loss

    def gauges(self, now: float, paused: bool) -> TrainingGauges:
        """Means over the window (the previous value when no batch was trained) and per-second rates."""
        elapsed = max(now - self.start, 1e-9)
        if self.batches:
            n = self.batches
            self.last_means = (self.loss / n, self.td / n, self.q / n)
        if self.demo_rows:
            self.last_margin = self.margin / self.demo_rows
        loss, td_error, q = self.last_means
        return TrainingGauges(
            loss=loss, td_error_mean=td_error, q_mean=q,
            margin_loss=self.last_margin,
            updates_per_second=self.steps / elapsed,
            samples_per_second=self.samples / elapsed,
            data_wait_ratio=0.0 if paused else min(1.0, self.wait_s / elapsed),
        )


class GpuProbe:
    """GPU utilisation (needs NVML through torch; disabled after the first failure) and memory, when on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.enabled = device.type == "cuda"
        self.device = device
        self._utilization = self.enabled

    def gauges(self) -> GpuGauges | None:
        """The GPU's memory and utilisation now; None when not on CUDA."""
        if not self.enabled:
            return None
        out = GpuGauges(
            gpu_memory_allocated_bytes=float(torch.cuda.memory_allocated(self.device)),
            gpu_memory_reserved_bytes=float(torch.cuda.memory_reserved(self.device)),
            gpu_memory_peak_bytes=float(torch.cuda.max_memory_allocated(self.device)),
        )
        if self._utilization:
            try:
                out.gpu_utilization_ratio = float(torch.cuda.utilization(self.device)) / 100.0
            except Exception as exc:  # NVML missing or unsupported (e.g. MIG): memory is still reported
                self._utilization = False
                log.info("learner: GPU utilisation not available (%s); reporting memory only", exc)
        return out


# Dense bf16 tensor-core peaks (TFLOPS, without sparsity) by a fragment of torch.cuda.get_device_name().
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.0}


def bf16_peak_tflops(device_name: str) -> float | None:
    """The GPU's dense bf16 peak when its name is known, else None."""
    for fragment, tflops in BF16_PEAK_TFLOPS.items():
        if fragment in device_name:
            return tflops
    return None


def network_passes(core: LearnerCore) -> int:
    """Forward-pass equivalents per sample and update: forward + backward (2x) on s, the target net on s', and the
    online net on s' (double DQN) or the target net on s (Munchausen)."""
    return 3 + 1 + (1 if core.config.double or core.config.munchausen else 0)


def flops_per_update(core: LearnerCore, batch_size: int) -> int:
    """Convolution and matmul FLOPs of one update (2 per multiply-accumulate), times grad_accum batches."""
    return 2 * forward_macs(core.online) * batch_size * network_passes(core) * core.config.grad_accum_steps
