"""Sampling in turns for the replay benchmark: a filled Mario replay, Flywheel's samplers against cpprb and Reverb."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flywheel.bench.parts.replay_rows import BATCH, WHOLE_BATCH_BYTES, sampling_rows
from flywheel.bench.peers.learner_path import learner_path_run
from flywheel.bench.peers.replay_harness import CpprbPeer, OptionalPeer, ReplayService, Sender, sample_run
from flywheel.bench.peers.zmq_ceiling import zmq_ceiling_run
from flywheel.bench.runner import BenchContext, SuiteResult

MARIO_ROWS = 128  # rows per Mario transition message, as an actor with 16 envs sends them
# Flywheel's samplers, each run in turns with the peers: (key, transport, requests in flight, client): "bare" is a
# ReplayClient poll/update/release loop (replay_harness), "learner" the learner service's data path (learner_path),
# "learner_plain" the same with sample_packed=false (the replay's frames unpacked, as before frame packing).
FLYWHEEL_SAMPLERS = (("shm", "shm", 4, "bare"), ("shm_sync", "shm", 1, "bare"), ("tcp", "tcp", 4, "bare"),
                     ("learner_shm", "shm", 4, "learner"), ("learner_tcp", "tcp", 4, "learner"),
                     ("learner_tcp_plain", "tcp", 4, "learner_plain"))
RUN_FIELDS = ("rate", "rate_per_cpu", "wall_s", "cpu_s", "shm", "tcp")
PACKED_BYTES_PER_FRAME = 84 * 84 // 4 + 4  # frame_packing=lz4: a quarter-frame slot and its size, per Mario frame
SAMPLING_NOTES = (
    "Sampling: each side's processes (Flywheel: replay + client; cpprb: its one process; Reverb: server + "
    "client) are pinned, every thread, to the same cores; per CPU-second rows count user + system time of all "
    "of them over the measured window (psutil). cpprb's update_priorities is synchronous; Flywheel's "
    "synchronous row keeps one request in flight and sends each update before the next request, so every "
    "batch is drawn after the previous one's priorities are applied, as in cpprb; the async rows keep 4 in "
    "flight, as a learner does. The replay runs its default 2 gather threads (on a 1-core budget they share "
    "it).",
    "The sampled replay keeps its frames LZ4-packed as well (frame_packing=lz4, a quarter-frame slot each): "
    "the bare tcp row and the learner's tcp row get packed frames (ReplayClient unpacks them with "
    "cramjam into one buffer, then gathers the stacks); the learner's 'unpacked frames' row asks for plain "
    "frames from the same replay (sample_packed=false), as the TCP path ran before packing. Shared-memory "
    "rows never touch the packed copy.",
    "Learner data path rows: the learner service's own sampling code (open_feeder in "
    "services/learner/transport.py, built from LearnerSettings: batch 512, requests_in_flight 4, "
    "sample_transport shm or tcp, CPU device, Mario's "
    "(4, 84, 84) network shape) in one pinned process: ReplayClient, the Feeder's I/O thread, core.check_batch "
    "and the CPU stager (on a CPU the tensors are views of the shared-memory slot, leased until the batch's "
    "priorities go back; TCP batches come compact and are rebuilt with one gather). Ready batches are taken "
    "from the feeder as the update loop takes them and random priorities go back at once through "
    "Feeder.done: no training, so these rows measure the learner's "
    "sampling path alone (the bare rows use a ReplayClient poll/release loop).",
    "ZeroMQ alone: a ROUTER answering each request with one prebuilt buffer of a whole 512-batch's obs and "
    "next_obs (28.9 MB) and a DEALER receiving it without a copy, 4 in flight, pinned like the others "
    "(flywheel/bench/peers/zmq_ceiling.py): no sampling, encoding or decoding, so no TCP sampler over this "
    "socket pair on these cores moves whole batches faster.",
)


def sampling_group(ctx: BenchContext, result: SuiteResult, service: ReplayService, cpprb: CpprbPeer | None,
                   reverb: OptionalPeer | None, fill: int, cpus: list[int], seconds: float,
                   reverb_fill: int | None = None, goal: str = "", packed: bool = False) -> None:
    """512-batches with priority updates from ``fill`` stored: Flywheel's samplers, cpprb and Reverb in turns,
    every side pinned to ``cpus``. ``packed``: the replay keeps frames LZ4-packed, and the learner's path also
    runs asking for plain frames (before and after). Without ``cpprb``: the TCP samplers and their ceiling only."""
    with_reverb = reverb is not None and reverb.peer is not None
    what = ("shm async and synchronous, tcp, the learner's data path over shm and tcp, cpprb"
            f"{', Reverb' if with_reverb else ''}") if cpprb is not None else "tcp: bare, the learner's data path"
    ctx.progress(f"sampling 512-batches of {fill:,} on {len(cpus)} core(s) per side ({what}): "
                 f"{ctx.warmup} warm-up + {ctx.runs} runs each")
    service.pin(cpus)
    if cpprb is not None:
        cpprb.pin(cpus)
    if reverb is not None:
        reverb.pin(cpus)
    samplers = [sampler for sampler in FLYWHEEL_SAMPLERS if (packed or sampler[3] != "learner_plain")
                and (cpprb is not None or sampler[1] == "tcp")]
    keys = [key for key, *_ in samplers] + ["zmq_tcp", "cpprb", "reverb"]
    runs: dict[str, list[dict[str, float]]] = {key: [] for key in keys}
    for _ in range(ctx.warmup + ctx.runs):
        for key, transport, inflight, client in samplers:
            if client == "bare":
                got = sample_run(service.sample_tcp, transport, BATCH, seconds, cpus, inflight=inflight,
                                 side_pids=(service.proc.pid,))
            else:
                got = learner_path_run(service.sample_tcp, transport, BATCH, seconds, cpus, inflight=inflight,
                                       side_pids=(service.proc.pid,), packed=client == "learner")
            runs[key].append({k: got[k] for k in RUN_FIELDS})
        runs["zmq_tcp"].append(zmq_ceiling_run(WHOLE_BATCH_BYTES, seconds, cpus))  # the TCP rows' ceiling
        if cpprb is not None:
            runs["cpprb"].append(cpprb.ask(f"sample {seconds}"))
        if reverb is not None and (answer := reverb.ask(f"sample {seconds}")) is not None:
            runs["reverb"].append(answer)
    runs = {key: values[ctx.warmup:] for key, values in runs.items()}
    if reverb is None or reverb.peer is None:
        runs["reverb"] = []
    result.rows += sampling_rows(fill, cpus, runs, goal, reverb_fill, packed)
    result.extra.setdefault("sampling", []).append({"fill": fill, "cpus": cpus, "runs": runs})


def sampling_groups(ctx: BenchContext, result: SuiteResult, service: ReplayService, frames_file: Path, fill: int,
                    budgets: list[list[int]], seconds: float) -> dict[str, Any]:
    """cpprb filled with ``fill`` Mario transitions, sampled in turns with ``service`` on every core budget;
    returns cpprb's fill answer (its memory)."""
    ctx.progress(f"filling cpprb with {fill:,} Mario transitions (the same fill as Flywheel's)")
    peer = CpprbPeer({"kind": "mario", "frames": str(frames_file), "fill": fill, "batch_rows": MARIO_ROWS,
                      "cpus": budgets[0]})
    try:
        for cpus in budgets:
            sampling_group(ctx, result, service, peer, None, fill, cpus, seconds,
                           goal=">= 100" if cpus is budgets[-1] else "", packed=True)
    finally:
        peer.close()
    return peer.filled


def filled_service(ctx: BenchContext, work: Path, name: str, capacity: int, frames_file: Path,
                   other_cpus: list[int], **settings: str) -> ReplayService:
    """A Mario replay of ``capacity`` (with ``settings``) fed 12% more than that: the frame ring wraps once, so
    every page it will ever use is resident."""
    service = ReplayService(work, name, capacity, cpus=None, checkpoint_dir=str(work / f"ckpt-{name}"), **settings)
    try:
        target = int(capacity * 1.12)
        ctx.progress(f"inserting {target:,} Mario transitions into a {capacity:,}-transition replay")
        sender = Sender(service.transitions_ipc, "mario", frames_file, MARIO_ROWS, target + MARIO_ROWS, 7200,
                        other_cpus, ctx.seed)
        reported: list[int] = []
        service.wait(lambda: _progress(ctx, service, target, reported), 7200, f"{target:,} inserted transitions")
        sender.join(60)
        service.wait(lambda: True, 5, "telemetry")
    except BaseException:
        service.close(kill=True)
        raise
    return service


def _progress(ctx: BenchContext, service: ReplayService, target: int, reported: list[int]) -> bool:
    """Whether ``target`` transitions are in; a progress line at each tenth (the tenths seen kept in ``reported``)."""
    count = service.counters.get("transitions_received_total", 0)
    step = int(count) // max(1, target // 10)
    if step not in reported:
        reported.append(step)
        ctx.progress(f"  {int(count):,} inserted, {int(service.gauges.get('size_transitions', 0)):,} stored, "
                     f"resident {service.rss() / 2**30:.2f} GiB")
    return count >= target
