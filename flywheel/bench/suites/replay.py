"""Replay benchmark: inserts, samples over loopback, memory at 1M Mario transitions, checkpoint pauses, vs peers.

Flywheel runs as ``flywheel replay`` child processes fed by a sender process over real sockets and read by a
ReplayClient in another process; cpprb runs in-process (its own process) on the same shapes, and DeepMind
Reverb (server process + gRPC client) when ``.venv-reverb`` exists (see peers/reverb_peer.py). Every comparison
is measured in turns (the same machine load) on the same fill, each side's processes pinned to the same cores.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from flywheel.bench.parts.plots import pyplot, save_figure
from flywheel.bench.parts.replay_rows import (
    BATCH,
    CPPRB_MARIO_BYTES,
    SECTIONS,
    checkpoint_rows,
    common_fill,
    core_budgets,
    parse_sections,
    plot_label,
    reverb_insert_rows,
)
from flywheel.bench.parts.replay_sampling import (
    MARIO_ROWS,
    PACKED_BYTES_PER_FRAME,
    SAMPLING_NOTES,
    filled_service,
    sampling_group,
    sampling_groups,
)
from flywheel.bench.peers.replay_data import mario_frames
from flywheel.bench.peers.replay_harness import (
    SPAWN,
    CpprbPeer,
    OptionalPeer,
    ReplayService,
    Sender,
    cpu_split,
    insert_rate,
    reverb_maker,
    sample_run,
)
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median

DESCRIPTION = ("replay: insert rate (Mario, CartPole, one core), 512-batch Mario sampling (shm, TCP; async and "
               "synchronous priority updates) on the same fill and cores as cpprb and Reverb, RSS at 1M Mario, "
               "checkpoint pauses and write times")
OPTIONS = {
    "transitions": "Mario transitions stored for the memory, sampling and big checkpoint cases "
                   "(default 1000000, quick 30000)",
    "sample_fill": "Mario transitions both Flywheel and cpprb hold for the big sampling comparison (default: "
                   "transitions, or the largest fill both hold in memory at once, which the notes then say)",
    "cores": "core budgets for sampling, comma-separated (default 1,2, capped to the CPUs here): every process "
             "of a side (Flywheel: replay + client; cpprb; Reverb: server + client) is pinned to the same N cores; "
             "the group at the insert fill (with Reverb) uses the largest",
    "seconds": "seconds per rate measurement (default 6, quick 2)",
    "frames": "distinct Mario frames recorded from the emulator for the data (default 2000, quick 300)",
    "reverb": "run the Reverb peer when .venv-reverb in the repository (or REVERB_PYTHON) exists: 1/0 (default 1)",
    "reverb_max_fill": "most items Reverb is filled with (default 1000000, quick 10000; it inserts ~3-5k items/s): "
                       "a case with a larger fill shows Reverb's figure alone, without a ratio",
    "sections": "comma-separated subset of insert, memory, sample, checkpoint (default all): sample alone runs the "
                "big-fill sampling comparison with cpprb (filling the big buffer, whose memory row comes free); the "
                "insert-fill sampling group with Reverb runs with insert and sample, checkpoints with checkpoint",
}
REVERB_PYTHON = Path(__file__).resolve().parents[3] / ".venv-reverb" / "bin" / "python"
CARTPOLE_ROWS = 256
RESERVE_BYTES = 3 * 2**30  # sampling clients, shared-memory slots, this process and some page cache


def run(ctx: BenchContext) -> SuiteResult:
    quick = ctx.quick
    sections = parse_sections(ctx.option("sections", ",".join(SECTIONS)))
    big = ctx.option_int("transitions", 30_000 if quick else 1_000_000)
    seconds = ctx.option_float("seconds", 2.0 if quick else 6.0)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    budgets = core_budgets(ctx.option("cores", ",".join(str(n) for n in (1, 2) if n <= len(cpus))), cpus)
    replay_cpu, other_cpus = cpu_split()
    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-replay-"))
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    result = SuiteResult("replay", "Replay: inserts, sampling, memory, checkpoints")
    reverb_python = _reverb_python(ctx, result) if "insert" in sections else None
    if "insert" not in sections:
        result.notes.append("Reverb: not run (it is measured in the insert section).")
    try:
        ctx.progress("recording Mario frames for the data")
        frames, source = mario_frames(ctx.option_int("frames", 300 if quick else 2000), ctx.out_dir, ctx.seed)
        frames_file = work / "frames.npy"
        np.save(frames_file, frames, allow_pickle=False)
        result.notes.append(f"Mario data: {source}; 16 streams per actor, 3-step rows, episodes of 200-1000 steps, "
                            f"{MARIO_ROWS}-row messages; CartPole: {CARTPOLE_ROWS}-row messages.")
        cpprb_bytes_per = float(CPPRB_MARIO_BYTES)  # measured below at the insert fill when that runs
        if sections & {"insert", "checkpoint"}:
            cpprb_bytes_per = _inserts(ctx, result, work, frames_file, seconds, (replay_cpu, other_cpus), budgets,
                                       reverb_python, sections)
        if sections & {"memory", "sample", "checkpoint"}:
            _big_buffer(ctx, result, work, frames_file, big, seconds, budgets, cpus, other_cpus, cpprb_bytes_per,
                        sections)
        if sections != set(SECTIONS):
            result.notes.append(f"Sections run: {', '.join(s for s in SECTIONS if s in sections)} (--opt sections).")
        result.rows.sort(key=lambda row: next((i for i, s in enumerate(SECTIONS) if row.case.startswith(s)), 9))
        result.plots = _plot(ctx, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.notes += [
        "cpprb gets one in-order stream (its stack_compress/next_of need consecutive adds of one episode); Flywheel "
        "gets 16 interleaved streams, as actors send them. Each Flywheel run is followed by cpprb's (and Reverb's) "
        "run of the same case on the same fill, so all see the same machine load.",
        *(SAMPLING_NOTES if "sample" in sections else ()),
        "TorchRL: not measured. TorchRL 0.14's compiled extension does not load with torch 2.13, so its "
        "PrioritizedSampler (C++ sum tree) is unavailable here.",
        "The machine is shared with other work; rates are medians of runs, ratios side by side.",
    ]
    return result


def _reverb_python(ctx: BenchContext, result: SuiteResult) -> Path | None:
    python = Path(os.environ.get("REVERB_PYTHON", REVERB_PYTHON))
    if ctx.option_int("reverb", 1) == 0 or not python.exists():
        result.notes.append("Reverb: skipped (--opt reverb=0)." if python.exists() else
                            f"Reverb: skipped ({python} not found). Create it with `python3 -m venv .venv-reverb && "
                            ".venv-reverb/bin/pip install tensorflow==2.15.1 'dm-reverb[tensorflow]==0.14.0' psutil`.")
        return None
    result.notes.append("Reverb 0.14 (server process + gRPC client, in turns with the others): items hold the same "
                        "whole (4, 84, 84) stacks Flywheel receives; its sampling goes through its TF dataset "
                        "(batch 512, built per run) plus mutate_priorities.")
    return python


def _reverb_failed(result: SuiteResult, kind: str, why: str) -> None:
    result.notes.append(f"Reverb failed ({kind}); its {kind} rows are missing: {why}")


def _inserts(ctx: BenchContext, result: SuiteResult, work: Path, frames_file: Path, seconds: float,
             split: tuple[list[int], list[int]], budgets: list[list[int]], reverb_python: Path | None,
             sections: set[str]) -> float:
    """Insert rates, Flywheel, cpprb and Reverb in turns (the same load), replay/cpprb/server on the same core;
    at the Mario fill, the small checkpoint and the sampling group with Reverb (each when its section is asked
    for). Returns cpprb's resident bytes per Mario transition."""
    replay_cpu, other_cpus = split
    mario_capacity = 10_000 if ctx.quick else 50_000
    reverb_max = ctx.option_int("reverb_max_fill", 10_000 if ctx.quick else 1_000_000)
    cpprb_bytes_per = 0.0
    kinds = (("mario", MARIO_ROWS, mario_capacity, 20_000), ("cartpole", CARTPOLE_ROWS, 1_000_000, 100_000))
    for kind, rows, capacity, goal in kinds if "insert" in sections else kinds[:1]:
        service = ReplayService(work, f"insert-{kind}", capacity, cpus=replay_cpu, checkpoint_dir=str(work / kind))
        peer = CpprbPeer({"kind": kind, "frames": str(frames_file), "fill": capacity, "batch_rows": rows,
                          "cpus": replay_cpu, "tmp": str(work)})
        reverb_fill = min(capacity, reverb_max)
        if reverb_python is not None:
            ctx.progress(f"filling Reverb with {reverb_fill:,} {kind} items (a few thousand a second)")
        config = {"kind": kind, "frames": str(frames_file), "fill": reverb_fill, "server_cpus": replay_cpu,
                  "client_cpus": other_cpus}
        reverb = OptionalPeer(reverb_maker(reverb_python, config), partial(_reverb_failed, result, kind))
        try:
            if "insert" not in sections:  # only the small checkpoint: fill, no rates
                _fill(service, [kind, frames_file, rows, capacity + rows, 3600, other_cpus, ctx.seed], capacity)
                cpprb_bytes_per = peer.filled["rss_growth_bytes"] / capacity
                _small_checkpoint(ctx, result, service, peer, capacity)
                continue
            ctx.progress(f"insert {kind} over ipc and tcp, cpprb in-process{', Reverb' if reverb.peer else ''}: "
                         f"{ctx.warmup} warm-up + {ctx.runs} runs each")
            flywheel: dict[str, list[tuple[float, float]]] = {"ipc": [], "tcp": []}
            cpprb: list[dict[str, float]] = []
            reverb_runs: list[float] = []
            for i in range(ctx.warmup + ctx.runs):
                for transport, endpoint in (("ipc", service.transitions_ipc), ("tcp", service.transitions_tcp)):
                    args = {"endpoint": endpoint, "kind": kind, "frames_file": frames_file, "rows": rows,
                            "cpus": other_cpus, "seed": ctx.seed + i}
                    flywheel[transport].append(insert_rate(service, args, capacity if i == 0 else rows * 50,
                                                           seconds))
                cpprb.append(peer.ask(f"insert {seconds}"))
                if (got := reverb.ask(f"insert {seconds}")) is not None:
                    reverb_runs.append(got["insert_rate"])
            cpprb = cpprb[ctx.warmup:]
            for transport, measured in flywheel.items():
                measured = measured[ctx.warmup:]
                per_cpu, wall = [m[1] for m in measured], [m[0] for m in measured]
                peer_cpu = [c["insert_rate_cpu"] for c in cpprb] if transport == "ipc" else []
                peer_wall = [c["insert_rate"] for c in cpprb] if transport == "ipc" else []
                name = "cpprb (in-process, same core)" if transport == "ipc" else ""
                result.rows.append(Row(f"insert {kind} ({transport}), per CPU-second of the replay", "inserts",
                                       "transitions/s", median(per_cpu), median(peer_cpu) if peer_cpu else None, name,
                                       goal=f">= {goal:,} on one core", flywheel_runs=per_cpu, peer_runs=peer_cpu))
                result.rows.append(Row(f"insert {kind} ({transport}), wall clock, replay pinned to a shared core",
                                       "inserts", "transitions/s", median(wall),
                                       median(peer_wall) if peer_wall else None, name, flywheel_runs=wall,
                                       peer_runs=peer_wall))
            if reverb.peer is not None:
                tcp_wall = next(r for r in result.rows if r.case.startswith(f"insert {kind} (tcp), wall"))
                result.rows += reverb_insert_rows(kind, tcp_wall, reverb_runs[ctx.warmup:], reverb_fill, capacity)
            if kind == "mario":
                cpprb_bytes_per = peer.filled["rss_growth_bytes"] / capacity
                if "checkpoint" in sections:
                    _small_checkpoint(ctx, result, service, peer, capacity)
                if "sample" in sections:
                    sampling_group(ctx, result, service, peer, reverb, capacity, budgets[-1], seconds, reverb_fill)
        finally:
            reverb.close()
            peer.close()
            service.close(kill=True)
    return cpprb_bytes_per


def _fill(service: ReplayService, sender_args: list[Any], count: int) -> None:
    """Send ``sender_args`` (Sender's after the endpoint) and wait until the replay holds ``count`` transitions."""
    Sender(service.transitions_ipc, *sender_args).join(3600)
    service.wait(lambda: service.counters.get("transitions_received_total", 0) >= count, 60,
                 f"{count:,} inserted transitions")


def _checkpoint_once(service: ReplayService) -> None:
    service.poll()
    before = service.counters.get("checkpoints_total", 0)
    service.command("checkpoint", tag="bench")
    service.wait(lambda: service.counters.get("checkpoints_total", 0) > before, 3600, "the checkpoint")


def _small_checkpoint(ctx: BenchContext, result: SuiteResult, service: ReplayService, peer: CpprbPeer,
                      fill: int) -> None:
    """A checkpoint of the insert case's full Mario buffer on both sides: what blocks, and the whole write."""
    ctx.progress(f"checkpoint of {fill:,} Mario transitions: Flywheel (forked writer) and cpprb (save_transitions)")
    _checkpoint_once(service)
    saved = peer.ask("checkpoint")
    gauges = service.gauges
    pause, write = gauges.get("checkpoint_max_pause_seconds", 0.0), gauges.get("checkpoint_duration_seconds", 0.0)
    result.rows += checkpoint_rows(fill, pause, write, saved["checkpoint_s"])
    result.extra["checkpoint_small"] = {"transitions": fill, "flywheel_pause_s": pause, "flywheel_write_s": write,
                                        "cpprb_save_s": saved["checkpoint_s"]}
    result.notes.append(f"Checkpoint of {fill:,}: Flywheel's loop stops only for fork(); a child writes .npy files "
                        "with CRCs while sampling and inserts go on. cpprb's save_transitions unpacks every stack and "
                        "writes a compressed npz, and its buffer can do nothing else meanwhile.")


def _big_buffer(ctx: BenchContext, result: SuiteResult, work: Path, frames_file: Path, big: int, seconds: float,
                budgets: list[list[int]], cpus: list[int], other_cpus: list[int], cpprb_bytes_per: float,
                sections: set[str]) -> None:
    """Memory at ``big``, sampling against cpprb on the same fill (``big`` when both fit at once) for every core
    budget, and a checkpoint of the big buffer while a client samples (sample and checkpoint when asked for;
    cpprb's memory at ``big`` comes from the sampling fill, or a fill of its own with memory)."""
    service = filled_service(ctx, work, "big", big, frames_file, other_cpus)
    cpprb_filled: dict[str, Any] | None = None
    fill = big
    try:
        rss, gauges = service.rss(), dict(service.gauges)
        result.extra["big"] = {"transitions": big, "rss_bytes": rss, "gauges": gauges}
        result.rows.append(Row(f"memory, {big:,} Mario transitions (84x84, stack 4)", "resident", "GiB",
                               rss / 2**30, higher_is_better=False, goal="<= 8 GiB" if big >= 1_000_000 else ""))
        result.notes.append(f"Frames stored per transition at {big:,}: {gauges.get('frames_per_transition', 0):.3f} "
                            "(whole stacks would be 8).")
        available = psutil.virtual_memory().available
        # sampling runs on a replay of its own that also keeps frames LZ4-packed (a quarter frame more each)
        packed_per = PACKED_BYTES_PER_FRAME * gauges.get("frames_per_transition", 1.0)
        if "sample" in sections:
            fill = ctx.option_int("sample_fill", 0) or common_fill(
                big, available - big * packed_per, rss, rss / big + packed_per, cpprb_bytes_per, RESERVE_BYTES)
        if not 0 < fill <= big:
            raise BenchError(f"sampling fill {fill:,}: must be 1..{big:,} (available memory "
                             f"{available / 2**30:.1f} GiB, cpprb ~{cpprb_bytes_per:,.0f} B per transition)")
        result.extra["sample_fill"] = {"fill": fill, "available_bytes": available, "cpprb_bytes_per": cpprb_bytes_per,
                                       "packed_bytes_per": packed_per}
        if fill < big:
            why = "(--opt sample_fill)" if "sample_fill" in ctx.options else (
                f"cpprb (~{cpprb_bytes_per:,.0f} B per transition) cannot hold {big:,} beside Flywheel's buffer "
                f"(with its packed frames) in the {available / 2**30:.1f} GiB available here")
            result.notes.append(f"Sampling uses {fill:,} stored transitions on both sides, not {big:,}: {why}.")
        if "checkpoint" in sections:
            service.pin(cpus)
            _checkpoint(ctx, result, service, other_cpus, big)
    finally:
        service.close(kill=True)
    if "sample" in sections:
        service = filled_service(ctx, work, "sampling", fill, frames_file, other_cpus, frame_packing="lz4")
        try:
            filled = sampling_groups(ctx, result, service, frames_file, fill, budgets, seconds)
            cpprb_filled = filled if fill == big else None
        finally:
            service.close(kill=True)
    if "sample" in sections and fill < big:  # the TCP rows once more at ``big``, where cpprb is not needed
        service = filled_service(ctx, work, "tcp", big, frames_file, other_cpus, frame_packing="lz4")
        try:
            sampling_group(ctx, result, service, None, None, big, budgets[-1], seconds, goal=">= 100", packed=True)
        finally:
            service.close(kill=True)
        result.notes.append(f"The TCP rows run once more on a replay of {big:,} (LZ4-packed frames, nothing else "
                            "resident), without cpprb: its fill does not fit beside it.")
    if cpprb_filled is None and "memory" not in sections:
        return
    if cpprb_filled is None:
        ctx.progress(f"cpprb PrioritizedReplayBuffer (stack_compress, next_of): memory with {big:,} Mario "
                     "transitions")
        peer = CpprbPeer({"kind": "mario", "frames": str(frames_file), "fill": big, "batch_rows": MARIO_ROWS,
                          "cpus": budgets[0]})
        peer.close()
        cpprb_filled = peer.filled
    result.extra["cpprb_memory"] = cpprb_filled
    row = next(r for r in result.rows if r.case.startswith("memory"))
    row.peer, row.peer_name = cpprb_filled["rss_growth_bytes"] / 2**30, "cpprb (stack_compress, next_of)"


def _checkpoint(ctx: BenchContext, result: SuiteResult, service: ReplayService, other_cpus: list[int],
                big: int) -> None:
    """Checkpoint the big buffer while a client samples; the pause the client sees against its usual gap."""
    ctx.progress(f"checkpoint of {big:,} transitions while sampling")
    out: dict[str, Any] = {}
    stop = SPAWN.Event()
    sampler = threading.Thread(target=lambda: out.update(sample_run(service.sample_tcp, "shm", BATCH, 7200,
                                                                    other_cpus, stop)))
    sampler.start()
    time.sleep(10)
    began = time.monotonic()
    _checkpoint_once(service)
    ended = time.monotonic()
    time.sleep(1.0)
    stop.set()
    sampler.join()
    gauges = service.gauges
    arrivals = np.array(out.get("arrivals", []))
    gaps = np.diff(arrivals) if arrivals.size > 1 else np.zeros(1)
    inside = (arrivals[1:] >= began) & (arrivals[1:] <= ended) if arrivals.size > 1 else np.ones(1, bool)
    during, usual = gaps[inside], gaps[~inside] if (~inside).any() else gaps
    duration = gauges.get("checkpoint_duration_seconds", 0.0)
    result.extra["checkpoint"] = {"duration_s": duration, "gaps_during_ms": (1e3 * during).tolist()}
    result.rows += checkpoint_rows(big, gauges.get("checkpoint_max_pause_seconds", 0.0), duration)
    pct = np.percentile(1e3 * during, [50, 99]) if during.size else np.zeros(2)
    result.rows.append(Row(f"checkpoint {big:,} Mario, Flywheel: gap between batches at the client, p99 during it",
                           "gap", "ms", float(pct[1]), higher_is_better=False,
                           goal=f"p99 without a checkpoint {np.percentile(1e3 * usual, 99):.0f} ms"))
    longest = 1e3 * float(during.max() if during.size else 0.0)
    turn = 1e3 * gauges.get("checkpoint_max_loop_turn_seconds", 0.0)
    result.notes.append(f"Checkpoint of {big:,} transitions: written in {duration:.1f} s by a forked child while "
                        f"{len(during)} batches were served (gap p50 {pct[0]:.0f} ms, usual "
                        f"{np.median(1e3 * usual):.0f} ms; longest {longest:.0f} ms); longest loop turn during it "
                        f"{turn:.0f} ms. cpprb's save at this size is not measured: save_transitions unpacks every "
                        f"stack first (56 KB per transition, {big * 56_448 / 1e9:.0f} GB here).")


def _plot(ctx: BenchContext, result: SuiteResult) -> list[str]:
    plt = pyplot()
    rows = [r for r in result.rows if r.peer is not None and r.ratio is not None]
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.3 * len(rows)))
    ax.barh([plot_label(r) for r in rows], [r.ratio for r in rows], color="#4a7")
    ax.invert_yaxis()  # the table's order, top down
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("Flywheel ÷ peer (above 1: Flywheel better)")
    ax.tick_params(axis="y", labelsize=7)
    return [save_figure(fig, ctx.plot_path("ratios"))]
