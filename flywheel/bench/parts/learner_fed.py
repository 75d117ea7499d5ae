"""Learner cases fed by a real replay of recorded Mario frames, over shared memory and TCP, beside the bare loop."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import zmq

from flywheel.bench.parts.learner_loops import (
    CASES,
    ROUNDS,
    BareLoop,
    Case,
    interleaved,
    service_seconds,
    start_learner,
)
from flywheel.bench.parts.replay_sampling import filled_service
from flywheel.bench.peers.replay_data import mario_frames
from flywheel.bench.peers.replay_harness import ReplayService, cpu_split
from flywheel.bench.runner import BenchContext, BenchError, Row, median
from flywheel.services.learner.core import AMP_DTYPES, CoreConfig
from flywheel.services.learner.loop import LearnerLoop

FED_OPTIONS = {
    "fed": "also run the learner service fed by a real replay of recorded Mario frames, over shared memory and "
           "over TCP, each beside the bare loop in the same runs (1/0, default 1 on a CPU, 0 on a GPU)",
    "fed_fill": "Mario transitions that replay holds (default 1000000, ~7.5 GiB resident; quick 20000)",
    "fed_cases": "comma-separated subset of nature32, nature512 for the fed rows (default both; quick nature32)",
    "fed_updates": "updates per measured run of each fed loop (default: on a CPU 40 at batch 32 and 6 at batch "
                   "512, whose updates take ~1 s each; on a GPU as --opt updates; quick a quarter)",
    "frames": "distinct Mario frames recorded from the emulator for the fed replay's data (default 2000, quick 300)",
}
FED_KEYS = ("nature32", "nature512")
CPU_UPDATES = {"nature32": 40, "nature512": 6}
TRANSPORTS = (("shm", "shared memory"), ("tcp", "TCP"))


def fed_cases(ctx: BenchContext) -> list[Case]:
    """The Nature-CNN cases ``--opt fed_cases`` names (default both; --quick batch 32 only)."""
    spec = ctx.option("fed_cases", "nature32" if ctx.quick else ",".join(FED_KEYS))
    keys = [key.strip() for key in spec.split(",") if key.strip()]
    unknown = sorted(set(keys) - set(FED_KEYS))
    if unknown or not keys:
        raise BenchError(f"--opt fed_cases={spec!r}: expected a comma-separated subset of {', '.join(FED_KEYS)}")
    return [case for case in CASES if case.key in keys]


def fed_rows(ctx: BenchContext, device: torch.device, config: CoreConfig, threads: int, zctx: zmq.Context,
             logs: Path, gpu_updates: int) -> tuple[list[Row], list[str]]:
    """Rows of every fed case: one replay holding ``fed_fill`` Mario transitions feeds a learner service over
    shared memory and one over TCP, interleaved with the bare loop of the same case in every run."""
    cases = fed_cases(ctx)
    fill = ctx.option_int("fed_fill", 20_000 if ctx.quick else 1_000_000)
    if fill < 1_000:
        raise BenchError(f"--opt fed_fill={fill}: the replay samples from 1,000 transitions on")
    rows: list[Row] = []
    notes: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-learner-fed-"))
    try:
        ctx.progress("recording Mario frames for the fed replay's data")
        frames, source = mario_frames(ctx.option_int("frames", 300 if ctx.quick else 2000), ctx.out_dir, ctx.seed)
        frames_file = work / "frames.npy"
        np.save(frames_file, frames, allow_pickle=False)
        replay = filled_service(ctx, logs, "fed", fill, frames_file, cpu_split()[1])
        try:
            notes.append(f"Fed cases: one `flywheel replay` holding {fill:,} Mario transitions ({source}, 16 streams "
                         f"per actor, 3-step rows, filled as the replay suite fills it; resident "
                         f"{replay.rss() / 2**30:.2f} GiB) feeds two real learner services, sample_transport shm and "
                         "tcp (4 requests in flight), which run in turns with the bare loop of the same case in "
                         "this process, every run; ratios are the median of per-run ratios. The replay is not "
                         "pinned: it shares the machine's cores with the learner, as one host running both would.")
            for case in cases:
                case_rows, case_notes = _fed_case(ctx, case, device, config, threads, zctx, replay, fill,
                                                  gpu_updates)
                rows += case_rows
                notes += case_notes
        finally:
            replay.close(kill=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows, notes


def _fed_case(ctx: BenchContext, case: Case, device: torch.device, config: CoreConfig, threads: int,
              zctx: zmq.Context, replay: ReplayService, fill: int, gpu_updates: int) -> tuple[list[Row], list[str]]:
    gpu = device.type == "cuda"
    n = ctx.option_int("fed_updates", gpu_updates if gpu else CPU_UPDATES[case.key])
    if ctx.quick and "fed_updates" not in ctx.options:
        n = max(2, n // 4)
    rounds = min(ROUNDS, n)  # chunks of at least one update per loop
    label = case.label + (f", {torch.cuda.get_device_name(0)} {config.precision}" if gpu
                          else f", CPU {threads} thread(s)")
    ctx.progress(f"{label}: learner services over shm and tcp fed by the {fill:,}-transition replay, bare loop "
                 f"beside them: {n} updates per loop and run, {ctx.warmup} warm-up + {ctx.runs} runs")
    bare = BareLoop(case, device, AMP_DTYPES.get(config.precision), ctx.seed)
    services: dict[str, LearnerLoop] = {}
    waits = {transport: [0.0, 0.0] for transport, _ in TRANSPORTS}  # this run: elapsed, waiting for data
    runs: dict[str, list[float]] = {name: [] for name in ("bare", *waits)}
    wait_runs: dict[str, list[float]] = {transport: [] for transport in waits}

    def learner_chunk(transport: str) -> Callable[[int], float]:
        def chunk(k: int) -> float:
            elapsed, waited = service_seconds(services[transport], k)
            waits[transport][0] += elapsed
            waits[transport][1] += waited
            return elapsed
        return chunk

    try:
        for transport, _ in TRANSPORTS:
            services[transport] = start_learner(case, config, device, replay.sample_tcp, zctx, threads, ctx.seed,
                                                transport)
        loops = {"bare": bare.seconds, **{transport: learner_chunk(transport) for transport in services}}
        for i in range(ctx.warmup + ctx.runs):
            for spent in waits.values():
                spent[:] = [0.0, 0.0]
            rates = interleaved(loops, n, rounds)
            shares = {t: 100 * waited / max(elapsed, 1e-9) for t, (elapsed, waited) in waits.items()}
            ctx.progress(f"{label}: run {i + 1}/{ctx.warmup + ctx.runs}{'' if i >= ctx.warmup else ' (warm-up)'}: "
                         f"bare {rates['bare']:.2f}, " + ", ".join(
                             f"learner over {t} {rates[t]:.2f} (data wait {shares[t]:.0f}%)" for t in services)
                         + " updates/s")
            if i >= ctx.warmup:
                for name in runs:
                    runs[name].append(rates[name])
                for transport in wait_runs:
                    wait_runs[transport].append(shares[transport])
        counts = {t: service.sampler.counters.as_dict() for t, service in services.items()}
        paths = {t: service.sampler.path for t, service in services.items()}
    finally:
        for service in services.values():
            service.close()
    rows: list[Row] = []
    notes: list[str] = []
    for transport, name in TRANSPORTS:
        if paths[transport] != transport or counts[transport][f"{transport}_batches_total"] == 0:
            raise BenchError(f"{label}: the learner asked for {transport} but its batches came over "
                             f"{paths[transport]} ({counts[transport]})")
        case_label = f"{label}, fed over {name} by a replay of {fill:,} Mario"
        paired = [u / b for u, b in zip(runs[transport], runs["bare"], strict=True)]  # same run, same load
        rows += [
            Row(case_label, "updates/s, learner service vs bare loop", "1/s", median(runs[transport]),
                peer=median(runs["bare"]), peer_name="bare PyTorch loop", flywheel_runs=runs[transport],
                peer_runs=runs["bare"]),
            Row(case_label, "learner ÷ bare loop, median of paired runs", "x", median(paired), flywheel_runs=paired),
            Row(case_label, "time waiting for data", "%", median(wait_runs[transport]), higher_is_better=False,
                flywheel_runs=wait_runs[transport]),
        ]
        c = counts[transport]
        notes.append(f"{case_label}: batches came {c['shm_batches_total']:.0f} through shared memory, "
                     f"{c['tcp_batches_total']:.0f} over TCP ({c['compact_batches_total']:.0f} of them compact).")
    few = " (a batch-512 update takes about a second on a CPU, so few)" if case.batch >= 512 and not gpu else ""
    notes.append(f"{label}: {n} updates per loop and run in {rounds} alternating chunks{few}.")
    return rows, notes

