"""Learner updates/s: a bare PyTorch loop vs the real learner fed by a real replay process, side by side; GPU goal.

Alternating, in this process with the same torch threads: a bare loop (same QNetwork, batch, fused Adam, clipping
and double-DQN Huber loss on tensors in memory), the learner core on in-memory batches, and the learner service
fed over TCP by a real ``flywheel replay`` process; the fed cases (_learner_fed.py) feed it recorded Mario from a
big replay over shared memory and TCP. docs/LEARNER.md describes the cases and goals.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import torch
import zmq

from flywheel import proto
from flywheel.bench.parts.learner_fed import FED_OPTIONS, fed_rows
from flywheel.bench.parts.learner_grid import GRID_OPTIONS, run_grid
from flywheel.bench.parts.learner_loops import (
    ADAM_EPS,
    CASES,
    CLIP,
    LR,
    ROUNDS,
    BareLoop,
    Case,
    interleaved,
    random_batch,
    service_seconds,
    start_learner,
    sync_device,
)
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.processes import launch
from flywheel.services.learner.core import AMP_DTYPES, CoreConfig, LearnerCore
from flywheel.services.learner.metrics import bf16_peak_tflops, flops_per_update, network_passes
from flywheel.services.learner.staging import Batch, DeviceBatch
from flywheel.services.learner.startup import resolve_compile_mode
from flywheel.testing.reported import REPLAY_TCP, reported

DESCRIPTION = "learner fed by a real replay vs a bare PyTorch loop (updates/s, data wait); GPU Nature CNN b512 goal"
OPTIONS = {
    "device": "cpu, cuda or auto (default auto: cuda when torch sees a GPU)",
    "threads": "torch CPU threads for every loop (default: usable cores - 1, leaving one for the replay process)",
    "cases": "comma-separated subset of mlp128, mlp512, nature32, nature512, or none (default: all but nature512 "
             "on CPU)",
    "updates": "updates per measured run (default: per case)",
    "precision": "GPU autocast dtype: bf16, fp16 or fp32 (default bf16)",
    "compile": "torch.compile the learner's loss on the GPU (1/0, default 1)",
    "compile_mode": "torch.compile mode (default auto, as the learner: 'reduce-overhead', i.e. CUDA graphs, on a GPU)",
    "host_staging": "GPU: pinned (a pinned ring buffer, the default) or direct (copies from the batch's own memory)",
    "peak_tflops": "the GPU's dense bf16 peak in TFLOPS for the share-of-peak row (default: from its name)",
    "cpu_variants": "on a CPU, also time the Nature-CNN update eager / channels-last / inductor / 64 and 42 "
                    "inputs side by side (1/0, default 1; --quick 0)",
    **FED_OPTIONS,
    **GRID_OPTIONS,
}
GPU_GOAL = 300.0
GPU_UPDATES = 300
RATIO_GOAL = 0.95


class ReplayProcess:
    """``flywheel replay`` as a child process on loopback ports the kernel picks, filled with random transitions."""

    def __init__(self, case: Case, workdir: Path) -> None:
        self.log = log_path = workdir / f"replay-{case.key}.log"
        log_path.unlink(missing_ok=True)
        args = ["--capacity", str(2 * case.fill), "--min-size-to-sample", str(case.fill),
                "--transitions-bind", "tcp://127.0.0.1:0", "--sample-bind", "tcp://127.0.0.1:0",
                "--telemetry-endpoint", "inproc://no-gateway", "--control-endpoint", "inproc://no-gateway-control"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
        # its own session, hence its own scheduling group (Linux autogroup), as a separate service has: on a
        # shared machine the replay then competes with other programs, not with the learner it feeds
        self.proc = launch(["replay", *args], env, log_path, new_session=True)
        try:  # its start line says which ports it bound
            self.transitions_endpoint, self.sample_endpoint = reported(log_path, REPLAY_TCP, 120, error=BenchError)
        except BenchError:
            self.close()
            raise

    def fill(self, ctx: zmq.Context, case: Case, timeout_s: float = 180.0) -> None:
        """Push ``case.fill`` transitions, then wait until the replay answers a sample request."""
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self.transitions_endpoint)
        rng = np.random.default_rng(1)
        chunk = 100 if len(case.obs_shape) == 3 else 1000
        for seq in range(0, case.fill, chunk):
            data = random_batch(case, rng, min(chunk, case.fill - seq))
            msg = proto.TransitionBatch(actor="bench", weight_version=0, seq=seq, **data)
            if not push.poll(int(timeout_s * 1000), zmq.POLLOUT):
                raise BenchError(f"replay took no transitions in {timeout_s:.0f} s (see {self.log.name})")
            push.send_multipart(proto.encode(msg), copy=False)
        probe = ctx.socket(zmq.DEALER)
        probe.setsockopt(zmq.LINGER, 0)
        probe.connect(self.sample_endpoint)
        probe.send_multipart(proto.encode(proto.SampleRequest(request_id=1, batch_size=1, beta=0.4)))
        ready = probe.poll(int(timeout_s * 1000))
        push.close()
        probe.close()
        if not ready or self.proc.poll() is not None:
            raise BenchError(f"replay did not become ready to sample in {timeout_s:.0f} s (see {self.log.name})")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _core_seconds(core: LearnerCore, batch: Batch | DeviceBatch, n: int) -> float:
    sync_device(core.device)
    start = time.perf_counter()
    for _ in range(n):
        result = core.update(batch)
        if core.device.type == "cpu":
            result.priorities()
    sync_device(core.device)
    return time.perf_counter() - start


def _sample_batch(case: Case, seed: int) -> proto.SampleBatch:
    rng = np.random.default_rng(seed)
    data = random_batch(case, rng, case.batch)
    return proto.SampleBatch(request_id=0, replay_size=case.fill, obs=data["obs"], action=data["action"],
                             reward=data["reward"], discount=data["discount"], next_obs=data["next_obs"],
                             index=np.arange(case.batch, dtype=np.int64),
                             weight=rng.uniform(0.1, 1.0, case.batch).astype(np.float32))


def _run_case(ctx: BenchContext, case: Case, device: torch.device, config: CoreConfig, threads: int,
              workdir: Path, zctx: zmq.Context) -> tuple[list[Row], list[str]]:
    gpu = device.type == "cuda"
    n = ctx.option_int("updates", GPU_UPDATES if gpu else case.updates)
    if ctx.quick:
        n = max(2, n // 6)
    label = case.label + (f", {torch.cuda.get_device_name(0)} {config.precision}"
                          f"{' compiled' if config.compile else ''}" if gpu else f", CPU {threads} thread(s)")
    ctx.progress(f"{label}: starting a replay with {case.fill} transitions")
    replay = ReplayProcess(case, workdir)
    service = None
    try:
        replay.fill(zctx, case)
        bare = BareLoop(case, device, AMP_DTYPES.get(config.precision), ctx.seed)
        # over TCP, the harder path (auto would take shared memory here); the fed cases (_learner_fed) do both
        service = start_learner(case, config, device, replay.sample_endpoint, zctx, threads, ctx.seed)
        torch.manual_seed(ctx.seed)
        core = LearnerCore(case.obs_shape, case.n_actions, config, device)
        host_batch = _sample_batch(case, ctx.seed)
        device_batch = core.stager.stage(host_batch)
        bare_runs, learner_runs, wait_runs, core_runs, resident_runs = [], [], [], [], []
        waits: list[tuple[float, float]] = []  # (elapsed, waiting for data) of each learner chunk
        cpu = [0.0, 0.0, 0.0]  # CPU seconds of the update loop, of this process's other threads, of the replay
        run_cpu = {"bare": 0.0, "learner": 0.0}  # this run's CPU seconds: bare loop thread, whole learner process
        bare_cpu_runs: list[float] = []
        learner_cpu_runs: list[float] = []
        replay_proc = psutil.Process(replay.proc.pid)

        def bare_chunk(k: int) -> float:
            start = time.thread_time()
            elapsed = bare.seconds(k)
            run_cpu["bare"] += time.thread_time() - start
            return elapsed

        def service_chunk(k: int) -> float:
            main0, proc0, rep0 = time.thread_time(), time.process_time(), sum(replay_proc.cpu_times()[:2])
            waits.append(service_seconds(service, k))
            main = time.thread_time() - main0
            cpu[0] += main
            cpu[1] += time.process_time() - proc0 - main
            run_cpu["learner"] += time.process_time() - proc0  # all its threads: update loop, sampling, ZeroMQ
            cpu[2] += sum(replay_proc.cpu_times()[:2]) - rep0
            return waits[-1][0]

        loops: dict[str, Callable[[int], float]] = {
            "bare": bare_chunk, "learner": service_chunk, "core": lambda k: _core_seconds(core, host_batch, k)}
        if gpu:
            loops["resident"] = lambda k: _core_seconds(core, device_batch, k)
        for i in range(ctx.warmup + ctx.runs):
            kept = i >= ctx.warmup
            waits.clear()
            run_cpu.update(bare=0.0, learner=0.0)
            rates = interleaved(loops, n, ROUNDS)
            done = max(1, n // ROUNDS) * ROUNDS  # updates per loop in this run (_interleaved)
            b, u, c = rates["bare"], rates["learner"], rates["core"]
            r = rates.get("resident", c)
            w = sum(x[1] for x in waits) / sum(x[0] for x in waits)
            ctx.progress(f"{label}: run {i + 1}/{ctx.warmup + ctx.runs}{'' if kept else ' (warm-up)'}: bare "
                         f"{b:.1f}, learner+replay {u:.1f} (data wait {100 * w:.0f}%), core {c:.1f} updates/s")
            if kept:
                bare_runs.append(b)
                bare_cpu_runs.append(done / max(run_cpu["bare"], 1e-9))
                learner_cpu_runs.append(done / max(run_cpu["learner"], 1e-9))
                learner_runs.append(u)
                wait_runs.append(100 * w)
                core_runs.append(c)
                resident_runs.append(r)
    finally:
        if service is not None:
            service.close()
        replay.close()
    main_cpu = max(cpu[0], 1e-9)
    bare_median, bare_name = median(bare_runs), "bare PyTorch loop"
    paired = [u / b for u, b in zip(learner_runs, bare_runs, strict=True)]  # same run, same machine load
    cpu_paired = [u / b for u, b in zip(learner_cpu_runs, bare_cpu_runs, strict=True)]
    rows = [
        Row(label, "updates/s, learner + replay over TCP", "1/s", median(learner_runs), peer=bare_median,
            peer_name=bare_name, peer_runs=bare_runs, flywheel_runs=learner_runs),
        Row(label, "learner + replay ÷ bare loop, median of paired runs", "x", median(paired),
            goal="" if gpu else f">= {RATIO_GOAL:.2f}", flywheel_runs=paired,
            met=None if gpu else median(paired) >= RATIO_GOAL),
        Row(label, "updates per CPU-second: learner process (all threads) vs bare loop thread", "1/s",
            median(learner_cpu_runs), peer=median(bare_cpu_runs), peer_name=bare_name,
            flywheel_runs=learner_cpu_runs, peer_runs=bare_cpu_runs),
        Row(label, "learner + replay ÷ bare loop per CPU-second (a dedicated core), median of paired runs", "x",
            median(cpu_paired), goal="" if gpu else f">= {RATIO_GOAL:.2f}", flywheel_runs=cpu_paired,
            met=None if gpu else median(cpu_paired) >= RATIO_GOAL),
        Row(label, "updates/s, learner core on in-memory host batches", "1/s", median(core_runs), peer=bare_median,
            peer_name=bare_name, peer_runs=bare_runs, flywheel_runs=core_runs),
        Row(label, "time waiting for data", "%", median(wait_runs), higher_is_better=False, flywheel_runs=wait_runs),
        Row(label, "CPU of the learner's sampling + ZeroMQ threads, per update-loop CPU", "%",
            100 * cpu[1] / main_cpu, higher_is_better=False),
        Row(label, "CPU of the replay process, per update-loop CPU", "%", 100 * cpu[2] / main_cpu,
            higher_is_better=False),
    ]
    notes = []
    if gpu:
        resident = median(resident_runs)
        rows.append(Row(label, "updates/s, device-resident batch", "1/s", resident, peer=bare_median,
                        peer_name=bare_name, peer_runs=bare_runs,
                        goal=f">= {GPU_GOAL:.0f} updates/s" if case.key == "nature512" else "",
                        flywheel_runs=resident_runs, met=resident >= GPU_GOAL if case.key == "nature512" else None))
        passes, flops = network_passes(core), flops_per_update(core, case.batch)
        name = torch.cuda.get_device_name(0)
        peak = ctx.option_float("peak_tflops", 0.0) or bf16_peak_tflops(name)
        achieved = flops * resident / 1e12
        rows.append(Row(label, "achieved TFLOPS (device-resident)", "TFLOPS", achieved, peer=peak,
                        peer_name=f"{name} dense bf16 peak" if peak else ""))
        notes.append(f"{label}: {flops / 1e9:.1f} GFLOP per update ({passes} network passes of "
                     f"{flops / passes / case.batch / 1e6:.1f} MFLOP per sample); {achieved:.1f} TFLOPS"
                     + (f" = {100 * achieved / peak:.1f}% of the {peak:.0f} TFLOPS bf16 peak" if peak else ""))
    return rows, notes


def _plot(ctx: BenchContext, rows: list[Row]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paired = [r for r in rows if "median of paired runs" in r.metric]
    if not paired:
        return []
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(paired)))
    y = np.arange(len(paired))
    for i, row in enumerate(paired):  # every run's ratio as a dot, the median as a bar
        ax.scatter(row.flywheel_runs, [i] * len(row.flywheel_runs), color="black", s=12, zorder=3)
    ax.barh(y, [r.flywheel for r in paired], 0.5, color="tab:orange")
    ax.axvline(RATIO_GOAL, color="tab:red", linestyle="--")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_yticks(y, [r.case for r in paired])
    ax.set_xlim(0, max(1.3, max(max(r.flywheel_runs, default=0) for r in paired) + 0.05))
    ax.set_xlabel("updates/s: learner fed by a replay ÷ bare loop, same run")
    ax.set_title(f"bar: median, dots: runs, dashed: goal {RATIO_GOAL:.2f}", fontsize=9)
    fig.tight_layout()
    path = ctx.plot_path("updates")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


def run(ctx: BenchContext) -> SuiteResult:
    choice = ctx.option("device", "auto")
    if choice not in ("auto", "cpu", "cuda"):
        raise BenchError(f"--opt device={choice!r}: expected cpu, cuda or auto")
    if choice == "cuda" and not torch.cuda.is_available():
        raise BenchError("--opt device=cuda but torch sees no GPU on this machine")
    device = torch.device("cuda" if choice != "cpu" and torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = ctx.option_int("threads", max(1, cores - 1))
    grid = ctx.option("grid", "0") == "1"  # the batch x threads grid; the other cases then default to off
    default_cases = "none" if grid else "mlp128,mlp512,nature32,nature512" if gpu else "mlp128,mlp512,nature32"
    keys = [k.strip() for k in ctx.option("cases", default_cases).split(",") if k.strip() not in ("", "none")]
    unknown = sorted(set(keys) - {c.key for c in CASES})
    if unknown:
        raise BenchError(f"--opt cases: unknown {', '.join(unknown)}; choose from {', '.join(c.key for c in CASES)}")
    if ctx.quick and "cases" not in ctx.options and not grid:
        keys = ["mlp128", "nature32"] if not gpu else ["mlp128", "nature512"]
    precision = ctx.option("precision", "bf16") if gpu else "fp32"
    if precision not in ("bf16", "fp16", "fp32"):
        raise BenchError(f"--opt precision={precision!r}: expected bf16, fp16 or fp32")
    host_staging = ctx.option("host_staging", "pinned")
    if host_staging not in ("pinned", "direct"):
        raise BenchError(f"--opt host_staging={host_staging!r}: expected pinned or direct")
    config = CoreConfig(lr=LR, adam_eps=ADAM_EPS, grad_clip_norm=CLIP, precision=precision, host_staging=host_staging,
                        compile=gpu and ctx.option("compile", "1") == "1",
                        compile_mode=resolve_compile_mode(ctx.option("compile_mode", "auto"), device))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows: list[Row] = []
    sections: list[str] = []
    notes = [f"Device: {torch.cuda.get_device_name(0) if gpu else 'CPU'}; torch threads {threads} of {cores} "
             "usable cores for every loop; the replay is a separate process in its own session (as a separate "
             "service is), the learner's sampling thread runs in this process. Loops alternate in "
             f"{ROUNDS} chunks per run; ratios are the median of per-run ratios."]
    zctx = zmq.Context()
    try:
        logs = ctx.out_dir / "learner-logs"  # the replay processes' output, kept for when something fails
        logs.mkdir(parents=True, exist_ok=True)
        for case in (c for c in CASES if c.key in keys):
            case_rows, case_notes = _run_case(ctx, case, device, config, threads, logs, zctx)
            rows += case_rows
            notes += case_notes
        if ctx.option("fed", "0" if gpu or grid else "1") == "1":
            case_rows, case_notes = fed_rows(ctx, device, config, threads, zctx, logs, GPU_UPDATES)
            rows += case_rows
            notes += case_notes
        if not gpu and ctx.option("cpu_variants", "0" if ctx.quick or grid else "1") == "1":
            from flywheel.bench.parts.learner_cpu import cpu_variant_rows

            torch.set_num_threads(1)  # as the pixel preset runs the learner: one core, the other for the actor
            variant_rows, variant_notes = cpu_variant_rows(ctx.runs, 40, ctx.progress)
            rows += variant_rows
            notes += ["CPU variants (one torch thread, the real LearnerCore on in-memory batches):", *variant_notes]
        if grid:
            if not rows:  # the grid alone: the note on this process's loops describes nothing that ran
                notes.clear()
            grid_rows, grid_notes, grid_section = run_grid(ctx)
            rows += grid_rows
            notes += grid_notes
            sections.append(grid_section)
    finally:
        zctx.term()
        torch.set_num_threads(previous_threads)
    if not gpu:
        notes.append("No GPU was present: the GPU goal (>= 300 updates/s, Nature CNN, batch 512, double + "
                     "dueling, bf16, torch.compile) was not measured; on a machine with one run "
                     "`flywheel bench learner --opt device=cuda`.")
    return SuiteResult(suite="learner", title="Learner: updates/s against a bare PyTorch loop", rows=rows,
                       notes=notes, plots=_plot(ctx, rows), sections=sections)
