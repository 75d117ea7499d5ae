"""Pure parts of the replay benchmark: core budgets, the common fill, and the rows built from measured runs."""

from __future__ import annotations

import math
import re

from flywheel.bench.runner import BenchError, Row, median

BATCH = 512
SECTIONS = ("insert", "memory", "sample", "checkpoint")
CPPRB_MARIO_BYTES = 12_900  # cpprb's resident bytes per Mario transition (stack_compress, next_of), measured
# Flywheel's sampling variants, each measured in turns with the peers: (key, how it samples).
_LEARNER = ("(its ReplayClient, Feeder thread and CPU staging, 4 requests in flight; random priorities back at once: "
            "sampling only, no training)")
SAMPLING_VARIANTS = (
    ("shm", "shm, async priority updates (4 requests in flight)"),
    ("shm_sync", "shm, synchronous priority updates (1 in flight: update sent before the next request)"),
    ("tcp", "tcp, async priority updates (4 requests in flight)"),
    ("learner_shm", f"the learner service's data path over shm {_LEARNER}"),
    ("learner_tcp", f"the learner service's data path over tcp{{packed}} {_LEARNER}"),
    ("learner_tcp_plain", f"the learner service's data path over tcp, unpacked frames {_LEARNER}"),
)
CPPRB_SAMPLER = "cpprb (in-process, synchronous update_priorities)"
WHOLE_BATCH_BYTES = 2 * BATCH * 4 * 84 * 84  # a 512-batch's obs and next_obs, stacked Mario frames (28.9 MB)
ZMQ_ALONE = "ZeroMQ alone over TCP, whole batches"
# issue 16, at 1M Mario stored on the whole core budget: the learner's shared-memory path at least cpprb's
# batches per CPU-second, its TCP path at least twice the 63 batches/s it took before
LEARNER_SHM_CPU_GOAL, LEARNER_TCP_GOAL, GOAL_FILL = 1.0, 126.0, 1_000_000


def parse_sections(spec: str) -> set[str]:
    """``"sample, memory"`` -> {"sample", "memory"}; refuses names outside SECTIONS and an empty list."""
    chosen = {part.strip() for part in spec.split(",") if part.strip()}
    unknown = sorted(chosen - set(SECTIONS))
    if unknown or not chosen:
        raise BenchError(f"--opt sections={spec!r}: expected a comma-separated subset of {', '.join(SECTIONS)}")
    return chosen


def core_budgets(spec: str, cpus: list[int]) -> list[list[int]]:
    """``"1,2"`` -> the last core, then the last two (cores each side's processes share); sorted, distinct."""
    try:
        counts = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise BenchError(f"--opt cores={spec!r}: expected core counts such as 1,2") from None
    if not counts or counts[0] < 1:
        raise BenchError(f"--opt cores={spec!r}: expected core counts of at least 1")
    if counts[-1] > len(cpus):
        raise BenchError(f"--opt cores={spec!r}: only {len(cpus)} CPUs are available to this process")
    return [cpus[-count:] for count in counts]


def cores_text(cpus: list[int]) -> str:
    return f"{len(cpus)} core{'s' if len(cpus) > 1 else ''} per side"


def common_fill(target: int, available_bytes: float, flywheel_resident_bytes: float, flywheel_bytes_per: float,
                cpprb_bytes_per: float, reserve_bytes: float, step: int = 10_000) -> int:
    """Transitions both Flywheel and cpprb hold at once for the sampling comparison.

    Called with Flywheel's ``target``-transition buffer resident: ``target`` when cpprb's ``target`` fits in
    what is still available (less ``reserve_bytes`` for clients, segments and the rest); otherwise the largest
    multiple of ``step`` for which a fresh pair fits once the big buffer is gone. 0 when not even ``step`` fits.
    """
    if target * cpprb_bytes_per + reserve_bytes <= available_bytes:
        return target
    room = available_bytes + flywheel_resident_bytes - reserve_bytes
    per_pair = flywheel_bytes_per + cpprb_bytes_per
    if room <= 0 or per_pair <= 0:
        return 0
    return min(target, int(room / per_pair) // step * step)


def _values(runs: list[dict[str, float]], key: str) -> list[float]:
    return [float(run[key]) for run in runs]


def rate_rows(case: str, metric: str, unit: str, runs: list[dict[str, float]], peer_runs: list[dict[str, float]],
              peer_name: str, cpu_of: str, goal: str = "") -> list[Row]:
    """Two rows for one measured case: per second (wall clock) and per CPU-second (user + system of
    ``cpu_of``), each with the peer's median beside it when ``peer_runs`` is not empty."""
    rows = []
    for key, suffix, row_unit, row_goal in (("rate", "", unit, goal),
                                            ("rate_per_cpu", f", per CPU-second of {cpu_of}",
                                             f"{metric} per CPU-s", "")):
        ours, theirs = _values(runs, key), _values(peer_runs, key)
        rows.append(Row(f"{case}{suffix}", metric, row_unit, median(ours), median(theirs) if theirs else None,
                        peer_name if theirs else "", goal=row_goal, flywheel_runs=ours, peer_runs=theirs))
    return rows


def peer_only_row(case: str, metric: str, unit: str, peer_runs: list[float], peer_name: str) -> Row:
    """A peer's figure with no Flywheel figure beside it, so no ratio (the case says why)."""
    return Row(case, metric, unit, math.nan, median(peer_runs), peer_name, peer_runs=list(peer_runs))


def sampling_rows(fill: int, cpus: list[int], runs: dict[str, list[dict[str, float]]], goal: str = "",
                  reverb_fill: int | None = None, packed: bool = False) -> list[Row]:
    """Rows of one sampling group: Flywheel's variants against cpprb (same fill, same cores, in turns), and
    Reverb against Flywheel's TCP variant when ``runs`` has Reverb's: with a ratio only when Reverb held
    ``fill`` too (``reverb_fill``), else Reverb's figures alone and the reason. ``packed``: the replay kept its
    frames LZ4-packed (frame_packing=lz4), so its TCP rows carried packed frames."""
    where = f"sample {BATCH} Mario of {fill:,} stored, {cores_text(cpus)}"
    rows: list[Row] = []
    for key, how in SAMPLING_VARIANTS:
        if runs.get(key):
            how = how.format(packed=", LZ4-packed frames" if packed else "")
            pair = rate_rows(f"{where}: {how}", "batches", "batches/s", runs[key], runs.get("cpprb", []),
                             CPPRB_SAMPLER, "every process of its side", goal if key == "shm" else "")
            if goal:  # the group on the whole core budget
                _learner_goal(key, pair, fill)
            rows += pair
    if runs.get("zmq_tcp"):
        rows += rate_rows(f"{where}: ZeroMQ alone over TCP, {WHOLE_BATCH_BYTES / 1e6:.1f} MB replies from one "
                          "prebuilt buffer, 4 in flight (no sampling, no decoding): the socket pair's ceiling",
                          "batches", "batches/s", runs["zmq_tcp"], [], "", "both processes")
        if runs.get("learner_tcp"):
            how = " (LZ4-packed frames)" if packed else ""
            rows += rate_rows(f"{where}: the learner's data path over tcp{how} against {ZMQ_ALONE}",
                              "batches", "batches/s", runs["learner_tcp"], runs["zmq_tcp"], ZMQ_ALONE,
                              "every process of its side")
    if runs.get("learner_tcp") and runs.get("learner_tcp_plain"):
        rows += rate_rows(f"{where}: the learner's data path over tcp, LZ4-packed against unpacked frames",
                          "batches", "batches/s", runs["learner_tcp"], runs["learner_tcp_plain"],
                          "the same path, unpacked frames", "every process of its side")
    reverb = runs.get("reverb", [])
    if not reverb:
        return rows
    name = "Reverb (gRPC, its TF dataset + mutate_priorities)"
    case = f"{where}: tcp (Reverb: gRPC), async priority updates"
    if reverb_fill == fill and runs.get("tcp"):
        return rows + rate_rows(case, "batches", "batches/s", runs["tcp"], reverb, name, "every process of its side")
    why = f"Reverb alone on {reverb_fill or 0:,} items (not the same fill: no ratio)"
    return rows + [peer_only_row(f"{where}: {why}", "batches", "batches/s", _values(reverb, "rate"), name),
                   peer_only_row(f"{where}: {why}, per CPU-second of every process of its side", "batches",
                                 "batches per CPU-s", _values(reverb, "rate_per_cpu"), name)]


def _learner_goal(key: str, pair: list[Row], fill: int) -> None:
    """The learner data path's goals on its (per second, per CPU-second) rows; judged only at GOAL_FILL."""
    wall, cpu = pair
    judged = fill >= GOAL_FILL
    if key == "learner_shm":
        cpu.goal = f">= {LEARNER_SHM_CPU_GOAL:.1f}x cpprb at {GOAL_FILL:,} stored"
        cpu.met = (cpu.ratio is not None and cpu.ratio >= LEARNER_SHM_CPU_GOAL) if judged else None
    elif key == "learner_tcp":
        wall.goal = f">= {LEARNER_TCP_GOAL:.0f} batches/s (2x 63) at {GOAL_FILL:,} stored"
        wall.met = wall.flywheel >= LEARNER_TCP_GOAL if judged else None


def checkpoint_rows(fill: int, flywheel_pause_s: float, flywheel_write_s: float,
                    cpprb_save_s: float | None = None) -> list[Row]:
    """A checkpoint of ``fill`` Mario transitions, one row per side and figure, no ratio: Flywheel's loop stops
    for the fork and a child writes; cpprb's ``save_transitions`` blocks its buffer for the whole write."""
    rows = [Row(f"checkpoint {fill:,} Mario, Flywheel (forked writer): sampling and inserts blocked", "pause",
                "ms", 1e3 * flywheel_pause_s, higher_is_better=False),
            Row(f"checkpoint {fill:,} Mario, Flywheel (forked writer): total write, traffic going on", "write",
                "ms", 1e3 * flywheel_write_s, higher_is_better=False)]
    if cpprb_save_s is not None:
        name = "cpprb save_transitions"
        rows += [Row(f"checkpoint {fill:,} Mario, cpprb: sampling and inserts blocked (the whole save)", "pause",
                     "ms", math.nan, 1e3 * cpprb_save_s, name, higher_is_better=False),
                 Row(f"checkpoint {fill:,} Mario, cpprb: total write", "write", "ms", math.nan, 1e3 * cpprb_save_s,
                     name, higher_is_better=False)]
    return rows


def reverb_insert_rows(kind: str, flywheel_tcp_wall: Row, reverb_runs: list[float], reverb_fill: int,
                       case_fill: int) -> list[Row]:
    """Reverb's insert rate beside Flywheel's wall-clock TCP rate (server and replay on the same core, writer
    and sender on the others): a ratio when Reverb held the same fill, else Reverb's figure alone."""
    name = f"Reverb ({reverb_fill:,} items, in turns)"
    if reverb_fill == case_fill:
        return [Row(f"insert {kind} (gRPC vs TCP), wall clock, server pinned to the replay's core", "inserts",
                    flywheel_tcp_wall.unit, flywheel_tcp_wall.flywheel, median(reverb_runs), name,
                    flywheel_runs=flywheel_tcp_wall.flywheel_runs, peer_runs=list(reverb_runs))]
    why = f"Reverb alone on {reverb_fill:,} items, Flywheel {case_fill:,} (not the same fill: no ratio)"
    return [peer_only_row(f"insert {kind} (gRPC), wall clock: {why}", "inserts", flywheel_tcp_wall.unit,
                          reverb_runs, name)]


_SHORTER = ((r"sample 512 Mario of ([\d,]+) stored, (\d+) cores? per side: ", r"sample \1, cores=\2: "),
            (r" priority updates( \([^)]*\))?", ""), (r"synchronous", "sync"),
            (r", per CPU-second of .*$", ", per CPU-s"), (r", wall clock.*$", ", wall"),
            (r" \(84x84, stack 4\)", ""), (r"Mario transitions", "Mario"), (r" \(Reverb: gRPC\)", ""),
            (r"the learner service's data path", "learner path"), (r" \(its ReplayClient[^)]*\)", ""))


def plot_label(row: Row) -> str:
    """A short label of a compared row for the ratio plot: the case without its explanations, and the peer."""
    case = row.case
    for pattern, replacement in _SHORTER:
        case = re.sub(pattern, replacement, case)
    return f"{case} vs {row.peer_name.split(' (')[0]}"
