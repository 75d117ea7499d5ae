"""Replay benchmark: inserts, samples over loopback, memory at 1M Mario transitions, checkpoint pauses, vs peers.

Flywheel runs as ``flywheel replay`` child processes fed by a sender process over real sockets and read by a
ReplayClient in another process; cpprb runs in-process (its own process, one core) on the same shapes, and
DeepMind Reverb (server process + gRPC client) when ``.venv-reverb`` exists (see peers/reverb_peer.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.bench.peers.replay_data import mario_frames
from flywheel.bench.peers.replay_harness import SPAWN, ReplayService, Sender, cpu_split, insert_rate, sample_run
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.bench.suites._harness import pyplot, save_figure

DESCRIPTION = ("replay: insert rate (Mario, CartPole, one core), 512-batch Mario sampling over loopback (shm, TCP), "
               "RSS at 1M Mario, checkpoint pauses; vs cpprb and Reverb")
OPTIONS = {
    "transitions": "Mario transitions stored for the memory, sampling and big checkpoint cases "
                   "(default 1000000, quick 30000)",
    "seconds": "seconds per rate measurement (default 6, quick 2)",
    "frames": "distinct Mario frames recorded from the emulator for the data (default 2000, quick 300)",
    "reverb": "run the Reverb peer when /work/main/.venv-reverb (or REVERB_PYTHON) exists: 1/0 (default 1)",
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
        _big_buffer(ctx, result, work, frames_file, big, seconds, other_cpus)
        _peers(ctx, result, work, frames_file, big, seconds, replay_cpu)
        result.plots = _plot(ctx, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.notes.append("TorchRL: not measured. TorchRL 0.14's compiled extension does not load with torch 2.13, so "
                        "its PrioritizedSampler (C++ sum tree) is unavailable here.")
    result.notes.append("The machine is shared with other work; rates are medians of runs, ratios side by side.")
    return result


def _inserts(ctx: BenchContext, result: SuiteResult, work: Path, frames_file: Path, seconds: float,
             replay_cpu: list[int], other_cpus: list[int]) -> None:
    for kind, rows, capacity, goal in (("mario", MARIO_ROWS, 50_000, 20_000), ("cartpole", CARTPOLE_ROWS, 1_000_000,
                                                                                100_000)):
        service = ReplayService(work, f"insert-{kind}", capacity, cpus=replay_cpu)
        try:
            for transport, endpoint in (("ipc", service.transitions_ipc), ("tcp", service.transitions_tcp)):
                ctx.progress(f"insert {kind} over {transport}: {ctx.warmup} warm-up + {ctx.runs} runs")
                args = {"endpoint": endpoint, "kind": kind, "frames_file": frames_file, "rows": rows,
                        "cpus": other_cpus, "seed": ctx.seed}
                measured = [insert_rate(service, args, capacity if i == 0 else rows * 50, seconds)
                            for i in range(ctx.warmup + ctx.runs)][ctx.warmup:]
                per_cpu = [m[1] for m in measured]
                wall = [m[0] for m in measured]
                result.rows.append(Row(f"insert {kind} ({transport}), per CPU-second of the replay", "inserts",
                                       "transitions/s", median(per_cpu), goal=f">= {goal:,} on one core",
                                       flywheel_runs=per_cpu))
                result.rows.append(Row(f"insert {kind} ({transport}), wall clock, replay pinned to a shared core",
                                       "inserts", "transitions/s", median(wall), flywheel_runs=wall))
            service.poll()
            if kind == "mario":
                result.extra["insert_frames_per_transition"] = service.gauges.get("frames_per_transition")
        finally:
            service.close(kill=True)


def _big_buffer(ctx: BenchContext, result: SuiteResult, work: Path, frames_file: Path, big: int, seconds: float,
                other_cpus: list[int]) -> None:
    service = ReplayService(work, "big", big, checkpoint_dir=str(work / "ckpt"))
    try:
        ctx.progress(f"filling the replay with {big:,} Mario transitions")
        sender = Sender(service.transitions_ipc, "mario", frames_file, MARIO_ROWS, int(big * 1.01), 7200, other_cpus,
                        ctx.seed)
        service.wait(lambda: _progress(ctx, service, big), 7200, f"{big:,} stored transitions")
        sender.join(60)
        rss = service.rss()
        gauges = dict(service.gauges)
        result.extra["big"] = {"transitions": big, "rss_bytes": rss, "gauges": gauges}
        result.rows.append(Row(f"memory, {big:,} Mario transitions (84x84, stack 4)", "resident", "GiB",
                               rss / 2**30, higher_is_better=False, goal="<= 8 GiB" if big >= 1_000_000 else ""))
        result.notes.append(f"Frames stored per transition at {big:,}: {gauges.get('frames_per_transition', 0):.3f} "
                            "(whole stacks would be 8).")
        for transport in ("shm", "tcp"):
            ctx.progress(f"sampling {BATCH}-batches over {transport}: {ctx.warmup} warm-up + {ctx.runs} runs")
            runs = [sample_run(service.sample_tcp, transport, BATCH, seconds, other_cpus)["rate"]
                    for _ in range(ctx.warmup + ctx.runs)][ctx.warmup:]
            result.rows.append(Row(f"sample 512 Mario ({transport}, client in another process, + priority update)",
                                   "batches", "batches/s", median(runs), goal=">= 100" if transport == "shm" else "",
                                   flywheel_runs=runs))
        _checkpoint(ctx, result, service, seconds, other_cpus, big)
    finally:
        service.close(kill=True)


def _progress(ctx: BenchContext, service: ReplayService, big: int) -> bool:
    size = service.gauges.get("size_transitions", 0)
    if int(size) // max(1, big // 10) != getattr(_progress, "last", -1):
        _progress.last = int(size) // max(1, big // 10)  # type: ignore[attr-defined]
        ctx.progress(f"  {int(size):,} stored, resident {service.rss() / 2**30:.2f} GiB")
    return size >= big


def _checkpoint(ctx: BenchContext, result: SuiteResult, service: ReplayService, seconds: float,
                other_cpus: list[int], big: int) -> None:
    """Checkpoint the big buffer while a client samples; the pause the client sees against its usual gap."""
    ctx.progress(f"checkpoint of {big:,} transitions while sampling")
    out: dict[str, Any] = {}
    stop = SPAWN.Event()
    sampler = threading.Thread(target=lambda: out.update(sample_run(service.sample_tcp, "shm", BATCH, 3600,
                                                                    other_cpus, stop)))
    sampler.start()
    time.sleep(seconds)
    service.poll()
    before = service.counters.get("checkpoints_total", 0)
    began = time.monotonic()
    service.command("checkpoint", tag="bench")
    service.wait(lambda: service.counters.get("checkpoints_total", 0) > before, 3600, "the checkpoint")
    ended = time.monotonic()
    time.sleep(1.0)
    stop.set()
    sampler.join()
    gauges = service.gauges
    arrivals = np.array(out.get("arrivals", []))
    gaps = np.diff(arrivals) if arrivals.size > 1 else np.zeros(1)
    during = gaps[(arrivals[1:] >= began) & (arrivals[1:] <= ended)] if arrivals.size > 1 else gaps
    result.extra["checkpoint"] = {"duration_s": gauges.get("checkpoint_duration_seconds"),
                                  "gaps_during": during.tolist()}
    result.rows.append(Row(f"checkpoint {big:,} Mario: longest loop pause (fork)", "pause", "ms",
                           1e3 * gauges.get("checkpoint_max_pause_seconds", 0.0), higher_is_better=False))
    result.rows.append(Row(f"checkpoint {big:,} Mario: longest gap between batches at the client", "gap", "ms",
                           1e3 * float(during.max() if during.size else 0.0), higher_is_better=False,
                           goal=f"usual gap {1e3 * float(np.median(gaps)):.0f} ms"))
    duration = gauges.get("checkpoint_duration_seconds", 0.0)
    result.notes.append(f"Checkpoint of {big:,} transitions written in {duration:.1f} s by a forked child while "
                        f"{len(during)} batches were served; longest loop turn during it "
                        f"{1e3 * gauges.get('checkpoint_max_loop_turn_seconds', 0):.0f} ms.")


def _peers(ctx: BenchContext, result: SuiteResult, work: Path, frames_file: Path, big: int, seconds: float,
           replay_cpu: list[int]) -> None:
    ctx.progress(f"cpprb PrioritizedReplayBuffer (stack_compress, next_of) with {big:,} Mario transitions")
    cpprb = _run_json([sys.executable, "-m", "flywheel.bench.peers.cpprb_peer", json.dumps(
        {"kind": "mario", "frames": str(frames_file), "fill": big, "batch_rows": MARIO_ROWS, "seconds": seconds,
         "cpus": replay_cpu})])
    small = 5_000 if ctx.quick else 50_000
    ctx.progress(f"cpprb checkpoint (save_transitions) of {small:,} Mario transitions")
    cpprb_small = _run_json([sys.executable, "-m", "flywheel.bench.peers.cpprb_peer", json.dumps(
        {"kind": "mario", "frames": str(frames_file), "fill": small, "batch_rows": MARIO_ROWS, "seconds": 0.5,
         "cpus": replay_cpu, "checkpoint": True, "tmp": str(work)})])
    cartpole = _run_json([sys.executable, "-m", "flywheel.bench.peers.cpprb_peer", json.dumps(
        {"kind": "cartpole", "fill": 1_000_000, "batch_rows": CARTPOLE_ROWS, "cpus": replay_cpu})])
    result.extra["cpprb"] = {"big": cpprb, "small": cpprb_small, "cartpole": cartpole}
    peers = {"insert mario (ipc), per CPU": ("cpprb (in-process), per CPU-second", cpprb["insert_rate_cpu"]),
             "insert mario (ipc), wall": ("cpprb (in-process)", cpprb["insert_rate"]),
             "insert cartpole (ipc), per CPU": ("cpprb (in-process), per CPU-second", cartpole["insert_rate_cpu"]),
             "insert cartpole (ipc), wall": ("cpprb (in-process)", cartpole["insert_rate"]),
             "memory": ("cpprb (stack_compress)", cpprb["rss_growth_bytes"] / 2**30),
             "sample 512 Mario (shm": ("cpprb (in-process)", cpprb["sample_rate"]),
             "sample 512 Mario (tcp": ("cpprb (in-process)", cpprb["sample_rate"])}
    for row in result.rows:
        for prefix, (name, value) in peers.items():
            if row.case.startswith(prefix):
                row.peer, row.peer_name = value, name
    result.rows.append(Row(f"checkpoint {small:,} Mario: traffic stopped", "pause", "ms",
                           _small_flywheel_pause(ctx, work, frames_file, small), peer=1e3 * cpprb_small["checkpoint_s"],
                           peer_name="cpprb save_transitions (blocks)", higher_is_better=False))
    result.notes.append("cpprb gets one in-order stream (its stack_compress/next_of need consecutive adds of one "
                        "episode); Flywheel gets 16 interleaved streams, as actors send them.")
    _reverb(ctx, result, frames_file, seconds)


def _small_flywheel_pause(ctx: BenchContext, work: Path, frames_file: Path, small: int) -> float:
    _, other = cpu_split()
    service = ReplayService(work, "small", small, checkpoint_dir=str(work / "ckpt-small"))
    try:
        sender = Sender(service.transitions_ipc, "mario", frames_file, MARIO_ROWS, int(small * 1.01), 3600, other)
        service.wait(lambda: service.gauges.get("size_transitions", 0) >= small, 3600, f"{small:,} transitions")
        sender.join(60)
        service.command("checkpoint")
        service.wait(lambda: service.counters.get("checkpoints_total", 0) >= 1, 600, "the checkpoint")
        return 1e3 * service.gauges.get("checkpoint_max_pause_seconds", 0.0)
    finally:
        service.close(kill=True)


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
    from flywheel.bench.peers.replay_harness import _free_port

    mario = _run_json([str(python), str(script), json.dumps({"kind": "mario", "frames": str(frames_file),
                                                              "fill": fill, "seconds": seconds, "port": _free_port()})])
    cartpole = _run_json([str(python), str(script), json.dumps({"kind": "cartpole", "fill": fill * 4,
                                                                 "seconds": seconds, "port": _free_port()})])
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
