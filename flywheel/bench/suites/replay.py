"""Replay benchmark: inserts, samples over loopback, memory at 1M Mario transitions, checkpoint pauses, vs peers.

Flywheel runs as ``flywheel replay`` child processes fed by a sender process over real sockets and read by a
ReplayClient in another process; cpprb runs in-process (its own process, one core) on the same shapes, and
DeepMind Reverb (server process + gRPC client) when ``.venv-reverb`` exists (see peers/reverb_peer.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.bench.peers.replay_data import mario_frames
from flywheel.bench.peers.replay_harness import (
    SPAWN,
    CpprbPeer,
    ReplayService,
    Sender,
    cpu_split,
    insert_rate,
    sample_run,
)
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.bench.suites._plots import pyplot, save_figure

DESCRIPTION = ("replay: insert rate (Mario, CartPole, one core), 512-batch Mario sampling over loopback (shm, TCP), "
               "RSS at 1M Mario, checkpoint pauses; vs cpprb and Reverb")
OPTIONS = {
    "transitions": "Mario transitions stored for the memory, sampling and big checkpoint cases "
                   "(default 1000000, quick 30000)",
    "seconds": "seconds per rate measurement (default 6, quick 2)",
    "frames": "distinct Mario frames recorded from the emulator for the data (default 2000, quick 300)",
    "reverb": "run the Reverb peer when .venv-reverb in the repository (or REVERB_PYTHON) exists: 1/0 (default 1)",
    "reverb_fill": "items Reverb is filled with (default 30000, quick 3000): it inserts ~3k Mario items/s",
}
REVERB_PYTHON = Path(__file__).resolve().parents[3] / ".venv-reverb" / "bin" / "python"
MARIO_ROWS, CARTPOLE_ROWS, BATCH = 128, 256, 512


def run(ctx: BenchContext) -> SuiteResult:
    quick = ctx.quick
    big = ctx.option_int("transitions", 30_000 if quick else 1_000_000)
    seconds = ctx.option_float("seconds", 2.0 if quick else 6.0)
    replay_cpu, other_cpus = cpu_split()
    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-replay-"))
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    result = SuiteResult("replay", "Replay: inserts, sampling, memory, checkpoints")
    try:
        ctx.progress("recording Mario frames for the data")
        frames, source = mario_frames(ctx.option_int("frames", 300 if quick else 2000), ctx.out_dir, ctx.seed)
        frames_file = work / "frames.npy"
        np.save(frames_file, frames, allow_pickle=False)
        result.notes.append(f"Mario data: {source}; 16 streams per actor, 3-step rows, episodes of 200-1000 steps, "
                            f"{MARIO_ROWS}-row messages; CartPole: {CARTPOLE_ROWS}-row messages.")
        _inserts(ctx, result, work, frames_file, seconds, replay_cpu, other_cpus)
        _big_buffer(ctx, result, work, frames_file, big, seconds, replay_cpu, other_cpus)
        _peers(ctx, result, frames_file, seconds)
        result.plots = _plot(ctx, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.notes.append("TorchRL: not measured. TorchRL 0.14's compiled extension does not load with torch 2.13, so "
                        "its PrioritizedSampler (C++ sum tree) is unavailable here.")
    result.notes.append("The machine is shared with other work; rates are medians of runs, ratios side by side.")
    return result


def _inserts(ctx: BenchContext, result: SuiteResult, work: Path, frames_file: Path, seconds: float,
             replay_cpu: list[int], other_cpus: list[int]) -> None:
    """Insert rates, Flywheel and cpprb measured in turns (the same load for both), both on the same core."""
    mario_capacity = 10_000 if ctx.quick else 50_000
    for kind, rows, capacity, goal in (("mario", MARIO_ROWS, mario_capacity, 20_000),
                                       ("cartpole", CARTPOLE_ROWS, 1_000_000, 100_000)):
        service = ReplayService(work, f"insert-{kind}", capacity, cpus=replay_cpu, checkpoint_dir=str(work / kind))
        peer = CpprbPeer({"kind": kind, "frames": str(frames_file), "fill": capacity, "batch_rows": rows,
                          "cpus": replay_cpu, "tmp": str(work)})
        try:
            ctx.progress(f"insert {kind} over ipc and tcp, and cpprb in-process: {ctx.warmup} warm-up + "
                         f"{ctx.runs} runs each")
            flywheel: dict[str, list[tuple[float, float]]] = {"ipc": [], "tcp": []}
            cpprb: list[dict[str, float]] = []
            for i in range(ctx.warmup + ctx.runs):
                for transport, endpoint in (("ipc", service.transitions_ipc), ("tcp", service.transitions_tcp)):
                    args = {"endpoint": endpoint, "kind": kind, "frames_file": frames_file, "rows": rows,
                            "cpus": other_cpus, "seed": ctx.seed + i}
                    flywheel[transport].append(insert_rate(service, args, capacity if i == 0 else rows * 50,
                                                           seconds))
                cpprb.append(peer.ask(f"insert {seconds}"))
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
            if kind == "mario":
                ctx.progress(f"checkpoint of {capacity:,} Mario transitions: Flywheel (fork) and cpprb (blocking)")
                _checkpoint_once(service)
                saved = peer.ask("checkpoint")
                result.rows.append(Row(f"checkpoint {capacity:,} Mario: traffic stopped", "pause", "ms",
                                       1e3 * service.gauges.get("checkpoint_max_pause_seconds", 0.0),
                                       1e3 * saved["checkpoint_s"], "cpprb save_transitions (blocks)",
                                       higher_is_better=False))
        finally:
            peer.close()
            service.close(kill=True)


def _checkpoint_once(service: ReplayService) -> None:
    service.poll()
    before = service.counters.get("checkpoints_total", 0)
    service.command("checkpoint", tag="bench")
    service.wait(lambda: service.counters.get("checkpoints_total", 0) > before, 3600, "the checkpoint")


def _big_buffer(ctx: BenchContext, result: SuiteResult, work: Path, frames_file: Path, big: int, seconds: float,
                replay_cpu: list[int], other_cpus: list[int]) -> None:
    service = ReplayService(work, "big", big, checkpoint_dir=str(work / "ckpt"))
    try:
        # 12% more than the capacity: the frame ring wraps once, so every page it will ever use is resident.
        target = int(big * 1.12)
        ctx.progress(f"inserting {target:,} Mario transitions into a {big:,}-transition replay")
        sender = Sender(service.transitions_ipc, "mario", frames_file, MARIO_ROWS, target + MARIO_ROWS, 7200,
                        other_cpus, ctx.seed)
        service.wait(lambda: _progress(ctx, service, target), 7200, f"{target:,} inserted transitions")
        sender.join(60)
        service.wait(lambda: True, 5, "telemetry")
        rss = service.rss()
        gauges = dict(service.gauges)
        result.extra["big"] = {"transitions": big, "rss_bytes": rss, "gauges": gauges}
        result.rows.append(Row(f"memory, {big:,} Mario transitions (84x84, stack 4)", "resident", "GiB",
                               rss / 2**30, higher_is_better=False, goal="<= 8 GiB" if big >= 1_000_000 else ""))
        result.notes.append(f"Frames stored per transition at {big:,}: {gauges.get('frames_per_transition', 0):.3f} "
                            "(whole stacks would be 8).")
        _sampling(ctx, result, service, frames_file, big, seconds, replay_cpu, other_cpus)
        _checkpoint(ctx, result, service, other_cpus, big)
    finally:
        service.close(kill=True)
    ctx.progress(f"cpprb PrioritizedReplayBuffer (stack_compress, next_of): memory with {big:,} Mario transitions")
    peer = CpprbPeer({"kind": "mario", "frames": str(frames_file), "fill": big, "batch_rows": MARIO_ROWS,
                      "cpus": replay_cpu})
    peer.close()
    result.extra["cpprb_memory"] = peer.filled
    row = next(r for r in result.rows if r.case.startswith("memory"))
    row.peer, row.peer_name = peer.filled["rss_growth_bytes"] / 2**30, "cpprb (stack_compress, next_of)"


def _sampling(ctx: BenchContext, result: SuiteResult, service: ReplayService, frames_file: Path, big: int,
              seconds: float, replay_cpu: list[int], other_cpus: list[int]) -> None:
    """512-batches with priority updates: Flywheel over shm and TCP and cpprb in-process, in turns."""
    fill = min(big, 200_000)
    ctx.progress(f"filling cpprb with {fill:,} transitions for sampling")
    peer = CpprbPeer({"kind": "mario", "frames": str(frames_file), "fill": fill, "batch_rows": MARIO_ROWS,
                      "cpus": replay_cpu})
    try:
        ctx.progress(f"sampling 512-batches (shm, tcp, cpprb): {ctx.warmup} warm-up + {ctx.runs} runs each")
        runs: dict[str, list[float]] = {"shm": [], "tcp": [], "cpprb": []}
        for _ in range(ctx.warmup + ctx.runs):
            for transport in ("shm", "tcp"):
                runs[transport].append(sample_run(service.sample_tcp, transport, BATCH, seconds, other_cpus)["rate"])
            runs["cpprb"].append(peer.ask(f"sample {seconds}")["sample_rate"])
        runs = {k: v[ctx.warmup:] for k, v in runs.items()}
    finally:
        peer.close()
    for transport in ("shm", "tcp"):
        result.rows.append(Row(f"sample 512 Mario ({transport}, client in another process, + priority update)",
                               "batches", "batches/s", median(runs[transport]), median(runs["cpprb"]),
                               f"cpprb (in-process, {fill:,} stored)", goal=">= 100" if transport == "shm" else "",
                               flywheel_runs=runs[transport], peer_runs=runs["cpprb"]))


def _progress(ctx: BenchContext, service: ReplayService, target: int) -> bool:
    count = service.counters.get("transitions_received_total", 0)
    step = int(count) // max(1, target // 10)
    if step != getattr(_progress, "last", -1):
        _progress.last = step  # type: ignore[attr-defined]
        ctx.progress(f"  {int(count):,} inserted, {int(service.gauges.get('size_transitions', 0)):,} stored, "
                     f"resident {service.rss() / 2**30:.2f} GiB")
    return count >= target


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
    result.extra["checkpoint"] = {"duration_s": gauges.get("checkpoint_duration_seconds"),
                                  "gaps_during_ms": (1e3 * during).tolist()}
    result.rows.append(Row(f"checkpoint {big:,} Mario: longest loop pause (fork)", "pause", "ms",
                           1e3 * gauges.get("checkpoint_max_pause_seconds", 0.0), higher_is_better=False))
    pct = np.percentile(1e3 * during, [50, 99]) if during.size else np.zeros(2)
    result.rows.append(Row(f"checkpoint {big:,} Mario: gap between batches at the client, p99 during it", "gap",
                           "ms", float(pct[1]), higher_is_better=False,
                           goal=f"p99 without a checkpoint {np.percentile(1e3 * usual, 99):.0f} ms"))
    duration = gauges.get("checkpoint_duration_seconds", 0.0)
    longest = 1e3 * float(during.max() if during.size else 0.0)
    turn = 1e3 * gauges.get("checkpoint_max_loop_turn_seconds", 0.0)
    result.notes.append(f"Checkpoint of {big:,} transitions: written in {duration:.1f} s by a forked child while "
                        f"{len(during)} batches were served (gap p50 {pct[0]:.0f} ms, usual "
                        f"{np.median(1e3 * usual):.0f} ms; longest {longest:.0f} ms); longest loop turn during it "
                        f"{turn:.0f} ms.")


def _peers(ctx: BenchContext, result: SuiteResult, frames_file: Path, seconds: float) -> None:
    result.notes.append("cpprb gets one in-order stream (its stack_compress/next_of need consecutive adds of one "
                        "episode); Flywheel gets 16 interleaved streams, as actors send them. Each Flywheel run is "
                        "followed by the cpprb run of the same case, so both see the same machine load.")
    _reverb(ctx, result, frames_file, seconds)


def _reverb(ctx: BenchContext, result: SuiteResult, frames_file: Path, seconds: float) -> None:
    import os

    python = Path(os.environ.get("REVERB_PYTHON", REVERB_PYTHON))
    if ctx.option_int("reverb", 1) == 0 or not python.exists():
        result.notes.append(f"Reverb: skipped ({python} not found). Create it with `python3 -m venv .venv-reverb && "
                            ".venv-reverb/bin/pip install tensorflow==2.15.1 'dm-reverb[tensorflow]==0.14.0'`.")
        return
    fill = ctx.option_int("reverb_fill", 3000 if ctx.quick else 30_000)
    script = Path(__file__).resolve().parents[1] / "peers" / "reverb_peer.py"
    ctx.progress(f"Reverb 0.14 (server process + gRPC client), {fill:,} Mario items")
    from flywheel.testing.ports import free_port

    mario = _run_json([str(python), str(script), json.dumps({"kind": "mario", "frames": str(frames_file),
                                                              "fill": fill, "seconds": seconds, "port": free_port()})])
    cartpole = _run_json([str(python), str(script), json.dumps({"kind": "cartpole", "fill": fill * 4,
                                                                 "seconds": seconds, "port": free_port()})])
    result.extra["reverb"] = {"mario": mario, "cartpole": cartpole, "fill": fill}
    for case, metric, value in (("insert mario (tcp), wall", "inserts", mario["insert_rate"]),
                                ("insert cartpole (tcp), wall", "inserts", cartpole["insert_rate"]),
                                ("sample 512 Mario (tcp", "batches", mario["sample_rate"])):
        flywheel = next(r for r in result.rows if r.case.startswith(case))
        result.rows.append(Row(flywheel.case.replace("(tcp", "(gRPC vs TCP"), metric, flywheel.unit,
                               flywheel.flywheel, peer=value, peer_name=f"Reverb ({fill:,} items)",
                               flywheel_runs=flywheel.flywheel_runs))
    result.notes.append("Reverb items hold the same whole (4, 84, 84) stacks Flywheel receives; its sampling goes "
                        "through its TF dataset (batch 512) plus mutate_priorities.")


def _run_json(command: list[str]) -> dict[str, Any]:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=7200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise BenchError(f"peer {Path(command[1]).name if len(command) > 1 else command[0]} failed: "
                         f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return json.loads(lines[-1])


def _plot(ctx: BenchContext, result: SuiteResult) -> list[str]:
    plt = pyplot()
    rows = [r for r in result.rows if r.peer is not None and r.ratio is not None]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(rows)))
    ax.barh([f"{r.case} vs {r.peer_name}" for r in rows], [r.ratio for r in rows], color="#4a7")
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("Flywheel ÷ peer (above 1: Flywheel better)")
    ax.tick_params(axis="y", labelsize=7)
    return [save_figure(fig, ctx.plot_path("ratios"))]
