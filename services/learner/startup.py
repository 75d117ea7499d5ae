"""Learner start-up: the core from settings (device, threads, seed, precision, compile), resume or fresh start with the
weight version to publish from, and pretraining on demonstrations; errors are one logged line."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import torch

from flywheel.demos.format import DemoFileError
from flywheel.settings import MAX_TORCH_THREADS, shared_values

from .checkpoint import CheckpointError, checkpoint_path, load_checkpoint, reserved_version
from .core import CoreConfig, LearnerCore
from .pretrain import pretrain_from_settings
from .settings import LearnerSettings

log = logging.getLogger("flywheel.learner")


def _spec_shape(settings: LearnerSettings, spec: Any) -> tuple[tuple[int, ...], int]:
    if spec is None:
        from flywheel.envs import env_spec  # imported late: env packages are heavy

        spec = env_spec(settings.env_id)
    return tuple(int(d) for d in spec.obs_shape), int(spec.n_actions)


CGROUP = Path("/sys/fs/cgroup")


def cpu_quota(quota: str, period: str) -> int | None:
    """Whole cores a cgroup CPU quota allows (1.5 cores: 2), None when it sets none ("max" in v2, -1 in v1)."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


def _container_quota(cgroup: Path) -> int | None:
    try:  # cgroup v2: cpu.max holds "QUOTA PERIOD" in microseconds, or "max PERIOD"
        quota, _, period = (cgroup / "cpu.max").read_text().strip().partition(" ")
        return cpu_quota(quota, period)
    except OSError:
        pass
    try:  # cgroup v1
        return cpu_quota((cgroup / "cpu" / "cpu.cfs_quota_us").read_text(),
                         (cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except OSError:
        return None


def usable_cores(cgroup: Path = CGROUP) -> int:
    """Threads for a learner whose torch_threads is 0 and that no `flywheel run` sized: its container's CPU quota
    (docker --cpus, a Kubernetes CPU limit: the pod's budget is the learner's own) within its CPU affinity; with no
    quota (Compose as shipped: the host is shared with the replay and the actors) every core it may run on but one;
    at least 1, at most MAX_TORCH_THREADS. On a 2-core host: 1, as the presets had it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    quota = _container_quota(cgroup)
    return max(1, min(MAX_TORCH_THREADS, min(cores, quota) if quota else cores - 1))


def pick_device(choice: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no GPU; use --device cpu or auto")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def resolve_precision(choice: str, device: torch.device) -> str:
    """'auto' -> bf16 on a GPU with bf16 support, fp16 on an older GPU, fp32 on CPU."""
    if choice != "auto":
        return choice
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def resolve_compile_mode(mode: str, device: torch.device) -> str:
    """``auto``: CUDA graphs (reduce-overhead) on a GPU, where launching kernels bounds the update; else default."""
    if mode != "auto":
        return mode
    return "reduce-overhead" if device.type == "cuda" else "default"


def core_config(settings: LearnerSettings, device: torch.device) -> CoreConfig:
    """The update rule's hyper-parameters from settings, with auto precision and compile resolved for ``device``."""
    compile_on = settings.compile == "on" or (settings.compile == "auto" and device.type == "cuda")
    return CoreConfig(**{**shared_values(settings, CoreConfig),
                         "precision": resolve_precision(settings.precision, device), "compile": compile_on,
                         "compile_mode": resolve_compile_mode(settings.compile_mode, device),
                         "channels_last": settings.channels_last == "on" or (
                             settings.channels_last == "auto" and (device.type == "cuda" or compile_on))})


def build_core(settings: LearnerSettings, obs_shape: tuple[int, ...], n_actions: int,
               device: torch.device) -> LearnerCore:
    """Threads (on a CPU, 0 = every core this container may use: flywheel run sizes them itself), seed, then the
    core."""
    if device.type == "cpu" or settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads or usable_cores())
    if settings.seed is not None:
        torch.manual_seed(settings.seed)
    return LearnerCore(obs_shape, n_actions, core_config(settings, device), device)


def resume_wanted(settings: LearnerSettings) -> bool:
    """resume true/false as set; auto: resume when checkpoint_dir holds a checkpoint, saying which in one line."""
    if settings.resume != "auto":
        return bool(settings.resume)
    if not settings.checkpoint_dir:
        log.info("learner: resume=auto without --checkpoint-dir: starting fresh")
        return False
    path = checkpoint_path(settings.checkpoint_dir)
    if path.exists():
        log.info("learner: resume=auto: resuming from the checkpoint %s", path)
        return True
    log.info("learner: resume=auto: no checkpoint at %s yet, starting fresh", path)
    return False


def _start_version(settings: LearnerSettings, core: LearnerCore, resume: bool) -> int:
    """Load the checkpoint when resuming; the weight version published last (checkpointed or reserved), so the
    next one is above anything an earlier learner may have published. Raises CheckpointError."""
    if resume:
        assert settings.checkpoint_dir is not None  # the settings validator guarantees it
        info = load_checkpoint(settings.checkpoint_dir, core)
        start_version = max(info.weight_version, reserved_version(settings.checkpoint_dir))
        log.info("learner: resumed from %s at update %d, weight version %d; publishing from version %d on",
                 info.path, info.updates, info.weight_version, start_version + 1)
        if settings.pretrain_updates:
            log.info("learner: resuming, so the %d pretraining updates are not run again", settings.pretrain_updates)
        return start_version
    if settings.checkpoint_dir is None:
        return 0
    start_version = reserved_version(settings.checkpoint_dir)  # a learner that died before its first checkpoint
    if start_version:
        log.info("learner: no checkpoint to resume, but an earlier learner published up to weight version %d "
                 "in %s; publishing from version %d on", start_version, settings.checkpoint_dir, start_version + 1)
    return start_version


def start_core(settings: LearnerSettings, spec: Any = None) -> tuple[LearnerCore, int, int, bool] | None:
    """The core, resumed or fresh (and pretrained when asked), with the weight version to publish from, the
    pretraining updates run and whether it resumed; None after one logged line when something is wrong."""
    try:
        obs_shape, n_actions = _spec_shape(settings, spec)
        device = pick_device(settings.device)
        core = build_core(settings, obs_shape, n_actions, device)  # ValueError: settings that do not fit the env
    except (KeyError, ValueError, RuntimeError, ImportError) as exc:
        log.error("learner: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    core.env_id = settings.env_id  # type: ignore[attr-defined]  # noted in checkpoints (flywheel.policy reads it)
    resume = resume_wanted(settings)
    try:
        start_version = _start_version(settings, core, resume)
    except CheckpointError as exc:
        log.error("learner: %s", exc)
        return None
    pretrained = 0
    if settings.pretrain_updates and not resume:
        assert settings.demos_path is not None  # the settings validator guarantees it
        try:
            pretrained = pretrain_from_settings(
                core, settings.demos_path, settings.pretrain_updates, settings.batch_size,
                loss=settings.pretrain_loss, margin=settings.demo_margin, margin_weight=settings.demo_loss_weight,
                workers=settings.demos_load_workers, seed=settings.seed).updates
        except (DemoFileError, ValueError) as exc:
            log.error("learner: cannot pretrain on %s: %s", settings.demos_path, str(exc).splitlines()[0])
            return None
    return core, start_version, pretrained, resume


def log_start(settings: LearnerSettings, core: LearnerCore, weights_endpoint: str) -> None:
    compiled = f", compiled ({core.config.compile_mode})" if core.config.compile else ""
    log.info("learner: device %s (%d threads, %s%s), network %s, %s head, batch %d x %d accumulated, "
             "samples from %s, weights on %s, telemetry to %s, control from %s", core.device, torch.get_num_threads(),
             core.config.precision, compiled, core.name, settings.head,
             settings.batch_size, settings.grad_accum_steps, settings.sample_endpoint, weights_endpoint,
             settings.telemetry_endpoint, settings.control_endpoint)
