"""The replay suite's pure parts (core budgets, the common fill, rows without unfair ratios), its CPU-seconds
accounting and pinning on real processes, and its peer and sampling harness against real processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from flywheel.bench.parts.replay_rows import (
    SAMPLING_VARIANTS,
    ZMQ_ALONE,
    checkpoint_rows,
    common_fill,
    core_budgets,
    parse_sections,
    plot_label,
    rate_rows,
    reverb_insert_rows,
    sampling_rows,
)
from flywheel.bench.peers.cpu_clock import SideClock, cpu_seconds, pin_process, rates, thread_affinities
from flywheel.bench.peers.learner_path import learner_path_run
from flywheel.bench.peers.replay_harness import CpprbPeer, OptionalPeer, PeerProcess, ReplayService, Sender, sample_run
from flywheel.bench.peers.zmq_ceiling import zmq_ceiling_run
from flywheel.bench.runner import BenchError, SuiteResult, markdown_table

GIB = 2**30
CPUS = sorted(os.sched_getaffinity(0))


def _run(rate: float, per_cpu: float) -> dict[str, float]:
    return {"rate": rate, "rate_per_cpu": per_cpu}


def test_core_budgets_take_the_last_cores_and_refuse_what_the_machine_lacks() -> None:
    assert core_budgets("1,2", [0, 1, 2, 3]) == [[3], [2, 3]]
    assert core_budgets("2, 1,2", [4, 5]) == [[5], [4, 5]]
    for bad in ("3", "x", "0", ""):
        with pytest.raises(BenchError, match="cores="):
            core_budgets(bad, [0, 1])


def test_common_fill_keeps_the_target_when_cpprb_fits_beside_flywheel() -> None:
    # 1M Mario: Flywheel 7.49 GiB resident, cpprb ~12.9 KB per transition, 3 GiB kept free.
    assert common_fill(1_000_000, 20 * GIB, 7.49 * GIB, 8_040, 12_900, 3 * GIB) == 1_000_000


def test_common_fill_falls_back_to_the_largest_pair_that_fits_once_the_big_buffer_is_gone() -> None:
    fill = common_fill(1_000_000, 14 * GIB, 7.49 * GIB, 8_040, 12_900, 3 * GIB)
    assert fill % 10_000 == 0 and 900_000 < fill < 1_000_000
    assert fill * (8_040 + 12_900) <= (14 + 7.49 - 3) * GIB < (fill + 10_000) * (8_040 + 12_900)
    assert common_fill(1_000_000, 1 * GIB, 0.5 * GIB, 8_040, 12_900, 3 * GIB) == 0


def test_rate_rows_give_wall_and_cpu_second_rows_with_the_peer_beside_each() -> None:
    ours = [_run(200, 100), _run(180, 90), _run(220, 95)]
    theirs = [_run(100, 100), _run(110, 110), _run(90, 90)]
    wall, cpu = rate_rows("sample x", "batches", "batches/s", ours, theirs, "cpprb", "every process", goal=">= 100")
    assert (wall.flywheel, wall.peer, wall.ratio, wall.goal) == (200, 100, 2.0, ">= 100")
    assert cpu.case == "sample x, per CPU-second of every process" and cpu.unit == "batches per CPU-s"
    assert (cpu.flywheel, cpu.peer, cpu.ratio, cpu.goal) == (95, 100, 0.95, "")
    assert cpu.flywheel_runs == [100, 90, 95] and cpu.peer_runs == [100, 110, 90]
    alone = rate_rows("insert y", "inserts", "transitions/s", ours, [], "nobody", "the replay")
    assert all(row.peer is None and row.ratio is None and row.peer_name == "" for row in alone)


def test_sampling_rows_compare_every_variant_with_cpprb_and_reverb_only_on_the_same_fill() -> None:
    runs = {"shm": [_run(200, 120)], "shm_sync": [_run(150, 110)], "tcp": [_run(60, 40)], "cpprb": [_run(100, 100)],
            "reverb": [_run(20, 10)]}
    rows = sampling_rows(50_000, [1], runs, goal=">= 100", reverb_fill=50_000)
    assert len(rows) == 8 and all(row.ratio is not None for row in rows)
    assert all("of 50,000 stored, 1 core per side" in row.case for row in rows)
    sync = [row for row in rows if "synchronous" in row.case]
    assert [row.ratio for row in sync] == [1.5, 1.1] and all(row.peer_name.startswith("cpprb") for row in sync)
    assert [row.goal for row in rows if row.goal] == [">= 100"]  # only the shm async row, per second
    grpc = [row for row in rows if "(Reverb: gRPC)" in row.case]
    assert [row.ratio for row in grpc] == [3.0, 4.0]  # Flywheel's TCP against Reverb
    assert plot_label(grpc[1]) == "sample 50,000, cores=1: tcp, async, per CPU-s vs Reverb"

    rows = sampling_rows(1_000_000, [0, 1], runs, reverb_fill=30_000)
    lone = [row for row in rows if row.peer_name.startswith("Reverb")]
    assert len(lone) == 2 and all(math.isnan(row.flywheel) and row.ratio is None for row in lone)
    assert "Reverb alone on 30,000 items (not the same fill: no ratio)" in lone[0].case
    assert "2 cores per side" in rows[0].case
    table = markdown_table(SuiteResult("replay", "t", rows=lone))
    assert "| batches (batches/s) | – | Reverb" in table and "| 20.0 | – |" in table


def test_learner_data_path_rows_sit_beside_cpprb_with_their_goals_judged_only_at_1m_on_the_whole_budget() -> None:
    runs = {"shm": [_run(200, 120)], "learner_shm": [_run(150, 110)], "learner_tcp": [_run(130, 60)],
            "cpprb": [_run(100, 100)]}
    assert {key for key, _ in SAMPLING_VARIANTS} >= {"learner_shm", "learner_tcp"}
    rows = sampling_rows(1_000_000, [0, 1], runs, goal=">= 100")
    learner = [row for row in rows if "the learner service's data path" in row.case]
    assert len(learner) == 4 and all(row.peer == 100 and "no training" in row.case for row in learner)
    shm_wall, shm_cpu, tcp_wall, tcp_cpu = learner
    assert "over shm" in shm_cpu.case and shm_cpu.case.endswith("per CPU-second of every process of its side")
    assert (shm_cpu.ratio, shm_cpu.goal, shm_cpu.met) == (1.1, ">= 1.0x cpprb at 1,000,000 stored", True)
    assert (tcp_wall.flywheel, tcp_wall.goal, tcp_wall.met) == (130, ">= 126 batches/s (2x 63) at 1,000,000 stored",
                                                                True)
    assert shm_wall.goal == tcp_cpu.goal == "" and shm_wall.met is tcp_cpu.met is None
    assert plot_label(shm_cpu) == "sample 1,000,000, cores=2: learner path over shm, per CPU-s vs cpprb"

    slow = {"learner_shm": [_run(90, 90)], "learner_tcp": [_run(100, 50)], "cpprb": [_run(100, 100)]}
    assert [row.met for row in sampling_rows(1_000_000, [1], slow, goal=">= 100") if row.goal] == [False, False]
    small = sampling_rows(30_000, [1], slow, goal=">= 100")  # not the goal's fill: shown, not judged
    assert [row.met for row in small if row.goal] == [None, None]
    assert not [row for row in sampling_rows(1_000_000, [1], slow) if row.goal]  # a smaller core budget


def test_a_packing_replay_labels_its_tcp_rows_and_sets_packed_beside_unpacked_frames() -> None:
    runs = {"learner_tcp": [_run(130, 80)], "learner_tcp_plain": [_run(100, 64)], "cpprb": [_run(100, 100)]}
    rows = sampling_rows(1_000_000, [0, 1], runs, goal=">= 100", packed=True)
    packed = [row for row in rows if "over tcp, LZ4-packed frames (its ReplayClient" in row.case]
    plain = [row for row in rows if "over tcp, unpacked frames (its ReplayClient" in row.case]
    assert len(packed) == len(plain) == 2 and packed[0].met is True and plain[0].goal == ""
    versus = [row for row in rows if row.peer_name == "the same path, unpacked frames"]
    assert [(row.flywheel, row.peer, row.ratio) for row in versus] == [(130, 100, 1.3), (80, 64, 1.25)]
    assert plot_label(versus[0]) == ("sample 1,000,000, cores=2: the learner's data path over tcp, LZ4-packed "
                                     "against unpacked frames vs the same path, unpacked frames")
    unpacked = sampling_rows(1_000_000, [0, 1], {"learner_tcp": [_run(130, 80)]})  # a replay that does not pack
    assert "over tcp (its ReplayClient" in unpacked[0].case


@pytest.mark.system
def test_the_learner_tcp_rows_sit_beside_the_ceiling_zeromq_alone_measures_for_real() -> None:
    runs = {"learner_tcp": [_run(100, 50)], "zmq_tcp": [_run(125, 80)], "cpprb": [_run(100, 100)]}
    rows = sampling_rows(1_000_000, [0, 1], runs)
    ceiling = [row for row in rows if "the socket pair's ceiling" in row.case]
    assert [(row.flywheel, row.peer) for row in ceiling] == [(125, None), (80, None)]
    against = [row for row in rows if row.peer_name == ZMQ_ALONE]
    assert [row.ratio for row in against] == [0.8, 0.625]
    assert plot_label(against[0]) == ("sample 1,000,000, cores=2: the learner's data path over tcp against ZeroMQ "
                                      "alone over TCP, whole batches vs ZeroMQ alone over TCP, whole batches")
    got = zmq_ceiling_run(1 << 20, 1.0, CPUS)  # real processes and sockets: 1 MB replies for a second
    assert got["tcp"] >= 10 and got["shm"] == 0 and got["rate"] > 0 and got["rate_per_cpu"] > 0


def test_sections_are_a_subset_of_the_suite_parts() -> None:
    assert parse_sections("sample") == {"sample"}
    assert parse_sections(" insert,memory , sample,checkpoint") == {"insert", "memory", "sample", "checkpoint"}
    for bad in ("", "samples", "sample,reverb", " , "):
        with pytest.raises(BenchError, match="sections="):
            parse_sections(bad)


def test_plot_labels_keep_what_tells_rows_apart() -> None:
    rows = sampling_rows(30_000, [0, 1], {"shm": [_run(2, 1)], "shm_sync": [_run(2, 1)], "cpprb": [_run(1, 1)]})
    assert [plot_label(row) for row in rows] == [
        "sample 30,000, cores=2: shm, async vs cpprb", "sample 30,000, cores=2: shm, async, per CPU-s vs cpprb",
        "sample 30,000, cores=2: shm, sync vs cpprb", "sample 30,000, cores=2: shm, sync, per CPU-s vs cpprb"]


def test_checkpoint_rows_give_pause_and_write_for_each_side_and_no_ratio() -> None:
    rows = checkpoint_rows(50_000, 0.0074, 3.2, 21.9)
    assert len(rows) == 4 and all(row.ratio is None for row in rows)
    flywheel, cpprb = rows[:2], rows[2:]
    assert [(r.metric, round(r.flywheel, 1), r.peer) for r in flywheel] == [("pause", 7.4, None), ("write", 3200, None)]
    assert all(math.isnan(r.flywheel) and r.peer == pytest.approx(21_900) for r in cpprb)
    assert [r.metric for r in cpprb] == ["pause", "write"] and "blocked" in cpprb[0].case
    assert len(checkpoint_rows(1_000_000, 0.016, 60.0)) == 2
    assert "| – | cpprb save_transitions | 21,900 | – |" in markdown_table(SuiteResult("replay", "t", rows=rows))


def test_reverb_insert_rows_show_a_ratio_only_on_the_same_fill() -> None:
    flywheel = rate_rows("insert mario (tcp), wall clock", "inserts", "transitions/s", [_run(20_000, 1)], [], "",
                         "x")[0]
    same = reverb_insert_rows("mario", flywheel, [4_000.0, 5_000.0], 50_000, 50_000)
    assert len(same) == 1 and same[0].ratio == pytest.approx(20_000 / 4_500)
    other = reverb_insert_rows("cartpole", flywheel, [4_000.0], 10_000, 1_000_000)
    assert other[0].ratio is None and "10,000 items, Flywheel 1,000,000" in other[0].case


def test_rates_refuse_an_empty_interval() -> None:
    assert rates(10, 2.0, 4.0) == {"rate": 5.0, "rate_per_cpu": 2.5, "wall_s": 2.0, "cpu_s": 4.0}
    with pytest.raises(ValueError, match="positive"):
        rates(10, 0.0, 1.0)


@pytest.mark.system
def test_cpu_seconds_add_up_every_process_of_a_side() -> None:
    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        own = psutil.Process().cpu_times()
        clock = SideClock([os.getpid(), child.pid])
        clock.start()
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:  # this process spins too
            pass
        got = clock.rates(100)
        now = psutil.Process().cpu_times()
        mine = now.user + now.system - own.user - own.system
        assert got["cpu_s"] > mine + 0.1  # the child's seconds are in it
        assert got["cpu_s"] <= got["wall_s"] * len(CPUS) + 0.3
        assert got["rate_per_cpu"] == pytest.approx(100 / got["cpu_s"]) and got["rate"] < 100
    finally:
        child.kill()
        child.wait()
    with pytest.raises(psutil.NoSuchProcess):  # a process that is gone has no seconds to give
        cpu_seconds([child.pid])


@pytest.mark.system
def test_pin_process_moves_every_thread_not_only_the_main_one() -> None:
    code = ("import threading, time, sys\n"
            "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert len(thread_affinities(child.pid)) == 4
        pin_process(child.pid, CPUS[-1:])
        assert thread_affinities(child.pid) == [set(CPUS[-1:])] * 4
    finally:
        child.kill()
        child.wait()
    with pytest.raises(psutil.NoSuchProcess):
        pin_process(child.pid, CPUS)


# A peer speaking the harness's protocol (fill line with its pids, one JSON answer per command) in a real process,
# without cpprb: peers belong to the benchmark command, not to CI, and every `flywheel bench replay` runs cpprb's.
LINE_PEER = """
import json, os, sys, time
from flywheel.bench.peers.cpu_clock import SideClock
config = json.loads(sys.argv[1])
if "fill" not in config:
    raise KeyError("fill")
print(json.dumps({"stored": config["fill"], "pids": [os.getpid()]}), flush=True)
for line in sys.stdin:
    command, _, arg = line.strip().partition(" ")
    if command == "quit":
        break
    clock, count = SideClock([os.getpid()]), 0
    clock.start()
    while clock.elapsed() < float(arg):
        count += 1
    print(json.dumps(clock.rates(count)), flush=True)
"""


class LinePeer(PeerProcess):
    name = "line"

    def __init__(self, config: dict[str, object]) -> None:
        super().__init__([sys.executable, "-c", LINE_PEER, json.dumps(config)])


@pytest.mark.system
def test_a_peer_process_answers_in_turns_with_cpu_seconds_and_can_be_pinned() -> None:
    peer = LinePeer({"fill": 5_000})
    try:
        assert peer.pids == [peer.proc.pid] and peer.filled["stored"] == 5_000
        peer.pin(CPUS[-1:])
        assert all(cores == set(CPUS[-1:]) for cores in thread_affinities(peer.proc.pid))
        peer.pin(CPUS)
        sampled = peer.ask("spin 0.3")
        # the peer's own CPU-seconds, counted in clock ticks: some (a share of a core under load), never more than
        # one thread's wall time (a tick of slack)
        assert sampled["rate"] > 0 and 0.01 <= sampled["cpu_s"] <= sampled["wall_s"] + 0.02, sampled
        assert sampled["rate_per_cpu"] == pytest.approx(sampled["rate"] * sampled["wall_s"] / sampled["cpu_s"])
    finally:
        peer.close()
    assert peer.proc.returncode == 0


@pytest.mark.system
def test_a_failing_peer_is_a_one_line_error_and_an_optional_one_only_a_note() -> None:
    with pytest.raises(BenchError, match=r"line peer failed \(exit 1\): \[.KeyError: .fill..\]"):
        LinePeer({})
    # cpprb's peer fails the same way: without its "kind" (or without cpprb installed, as in CI)
    with pytest.raises(BenchError, match="cpprb peer failed .*(KeyError|ModuleNotFoundError)"):
        CpprbPeer({"fill": 10})
    notes: list[str] = []
    optional = OptionalPeer(lambda: LinePeer({}), notes.append)
    assert optional.peer is None and len(notes) == 1 and "KeyError" in notes[0]
    assert optional.ask("spin 1") is None and len(notes) == 1
    assert OptionalPeer(None, notes.append).ask("spin 1") is None and len(notes) == 1


@pytest.mark.timeout(300)
@pytest.mark.system
def test_synchronous_sampling_counts_the_replay_and_the_client(tmp_path: Path) -> None:
    """A real replay with CartPole rows, sampled through shared memory with one request in flight (the update
    sent before the next request): batches arrive, every update is applied, and a killed replay's segments and
    socket files are removed."""
    service = ReplayService(tmp_path, "sync", 5_000)
    try:
        sender = Sender(service.transitions_tcp, "cartpole", tmp_path / "unused.npy", 256, 4_096, 60, CPUS)
        service.wait(lambda: service.counters.get("transitions_received_total", 0) >= 4_096, 60, "inserts")
        sender.join(30)
        service.poll()
        before = service.counters.get("priority_updates_total", 0)
        got = sample_run(service.sample_tcp, "shm", 64, 1.5, CPUS, inflight=1, side_pids=(service.proc.pid,))
        assert got["rate"] > 5 and got["shm"] >= len(got["arrivals"]) > 0
        assert got["tcp"] <= 1  # only the reply that carried the shared-memory offer
        assert got["rate_per_cpu"] == pytest.approx(len(got["arrivals"]) / got["cpu_s"])
        service.wait(lambda: service.counters.get("priority_updates_total", 0) >= before + 64 * len(got["arrivals"]),
                     30, "the priority updates")
        assert list(Path("/dev/shm").glob(f"flywheel-replay-{service.proc.pid}-*"))
    finally:
        service.close(kill=True)
    assert not list(Path("/dev/shm").glob(f"flywheel-replay-{service.proc.pid}-*"))
    assert not list(Path("/tmp").glob(f"{Path(service.sock_prefix).name}-*"))


@pytest.mark.timeout(300)
@pytest.mark.system
def test_the_learner_data_path_samples_over_the_asked_path_and_its_priorities_are_applied(tmp_path: Path) -> None:
    """The learner service's own data path (ReplayClient + Feeder thread + CPU staging, built from LearnerSettings)
    in a pinned process against a real replay holding small Mario-shaped data: batches arrive through shared
    memory or as compact TCP batches, as asked, and every priority handed back reaches the replay."""
    frames = np.random.default_rng(0).integers(0, 256, (300, 84, 84), dtype=np.uint8)
    np.save(tmp_path / "frames.npy", frames, allow_pickle=False)
    service = ReplayService(tmp_path, "learner-path", 3_000)
    try:
        sender = Sender(service.transitions_tcp, "mario", tmp_path / "frames.npy", 128, 2_000, 60, CPUS)
        service.wait(lambda: service.counters.get("transitions_received_total", 0) >= 2_000, 60, "inserts")
        sender.join(30)
        for transport in ("shm", "tcp"):
            service.poll()
            before = service.counters.get("priority_updates_total", 0)
            got = learner_path_run(service.sample_tcp, transport, 64, 1.5, CPUS, side_pids=(service.proc.pid,))
            batches = got["rows"] // 64
            assert got["path"] == transport and got["faults"] == 0
            assert batches > 2 and got["rows"] == 64 * batches
            assert got["rate"] == pytest.approx(batches / got["wall_s"])
            assert got["rate_per_cpu"] == pytest.approx(batches / got["cpu_s"])
            if transport == "shm":
                # the first replies (up to the 2 x 4 requests outstanding) carry the offer inline, over TCP
                assert got["tcp"] <= 8 and got["shm"] >= batches - 8
            else:
                assert got["shm"] == 0 and got["compact"] == got["tcp"] >= batches  # distinct frames + indices
            # at least every measured batch's rows (the warm-up batches' priorities come too)
            target = before + got["rows"]
            service.wait(lambda t=target: service.counters.get("priority_updates_total", 0) >= t, 30,
                         "the priority updates")
    finally:
        service.close(kill=True)
