"""Reliability: kill -9 of every service in turn, several minutes of load against a slow learner, CURVE's cost.

Three cases, each on the real services as separate processes (``_cluster.Cluster``):

- ``faults``: a CartPole pipeline; an actor, the replay, the learner and the gateway are killed with SIGKILL in
  turn and restarted (``_faults.run_faults``, which fails on any broken expectation). Figures: how long until
  the gateway shows each one down, and how long after its restart each comes back and the pipeline recovers.
- ``load``: 8 actors at full speed against a deliberately slow learner for ``minutes`` (``_load``): resident
  memory of every process over time, queue gauges, and where the back-pressure is. Plots in the results folder.
- ``curve``: transition messages of 256 KiB (an actor's pixel batch) over TCP loopback with and without CURVE,
  interleaved, as MB/s: what encryption costs on the data path.
- ``fuzz``: Hypothesis inputs to every bound ZeroMQ socket and every HTTP route of a live gateway, replay and
  learner (``flywheel.testing.fuzz``): inputs tried, refusals counted against the codec's own verdict, 5xx
  answers, crashes, peak memory growth, and real traffic afterwards.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.bench.parts.plots import pyplot, save_figure
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.services.learner.sampling import batches_per_request
from flywheel.testing.cluster import ClusterError
from flywheel.testing.faults import fault_cluster, run_faults
from flywheel.testing.load import LoadRun, load_cluster, run_load, summarize

DESCRIPTION = ("kill -9 of each service and recovery times; 8 actors vs a slow learner (memory, queues); CURVE cost; "
               "a fuzz of every socket and route")
OPTIONS = {
    "cases": "comma-separated cases (default faults,load,curve,fuzz)",
    "examples": "fuzz: inputs per socket and HTTP requests (default 2000; --quick 200)",
    "minutes": "length of the load run (default 5; --quick 1)",
    "actors": "actors in the load run (default 8)",
    "tight": "load run with small in-flight bounds (true/false, default false: the defaults)",
}


def run(ctx: BenchContext) -> SuiteResult:
    cases = [c.strip() for c in ctx.option("cases", "faults,load,curve,fuzz").split(",") if c.strip()]
    unknown = set(cases) - {"faults", "load", "curve", "fuzz"}
    if unknown:
        raise BenchError(f"--opt cases: unknown {sorted(unknown)}; known: faults, load, curve, fuzz")
    result = SuiteResult(suite="reliability", title="Reliability: faults, load and CURVE on the real services",
                         method="one run of each case (kill -9 sequence, load run); CURVE: median of interleaved "
                                "runs")
    with tempfile.TemporaryDirectory(prefix="flywheel-reliability-") as tmp:
        if "faults" in cases:
            _faults(ctx, result, Path(tmp) / "faults")
        if "load" in cases:
            _load(ctx, result, Path(tmp) / "load")
        if "fuzz" in cases:
            _fuzz(ctx, result, Path(tmp) / "fuzz")
    if "curve" in cases:
        _curve(ctx, result)
    result.notes.append("Measured on a shared machine (other engineers' jobs running): times include Python and "
                        "PyTorch start-up under that load; ratios measured side by side are what count.")
    return result


def _faults(ctx: BenchContext, result: SuiteResult, workdir: Path) -> None:
    ctx.progress("faults: starting a CartPole pipeline, then kill -9 of each service in turn")
    cluster = fault_cluster(workdir)
    try:
        figures = run_faults(cluster, outage=6.0, progress=ctx.progress)
    except ClusterError as exc:
        raise BenchError(f"faults: {exc}") from None
    finally:
        codes = cluster.stop()
    result.extra["faults"] = {**figures, "exit_codes_after": codes}
    down = "gateway shows it down (stale_after_s 5, telemetry every 1 s)"
    for service in ("actor", "replay", "learner"):
        value = figures[f"{service}_down_after_s"]
        result.rows.append(Row(case=f"kill -9 {service}", metric=down, unit="s after the kill", flywheel=value,
                               higher_is_better=False, goal="<= 6 (5 s of silence + a sweep)", met=value <= 6.0))
    rows = [
        ("kill -9 actor", "restarted actor sending again", "actor_back_after_s", ""),
        ("kill -9 replay", "inserts again after its restart", "replay_inserts_after_s", ""),
        ("kill -9 replay", "learner updates again after its restart", "replay_updates_after_s",
         "well below request_timeout_s (60)"),
        ("kill -9 learner", "first weights of the resumed learner", "learner_first_version_after_s", ""),
        ("kill -9 learner", "every actor acting with them", "learner_actors_updated_after_s", ""),
        ("kill -9 gateway", "every instance up again after its restart", "gateway_all_up_after_s", ""),
        ("kill -9 gateway", "both leases granted again", "gateway_leases_after_s", ""),
    ]
    for case, metric, key, goal in rows:
        met = figures[key] < 60 if goal else None
        result.rows.append(Row(case=case, metric=metric, unit="s", flywheel=figures[key], higher_is_better=False,
                               goal=goal, met=met))
    result.rows.append(Row(case="kill -9 learner", metric="first version after resume minus last before the kill",
                           unit="versions", flywheel=figures["learner_first_version_after_resume"]
                           - figures["learner_last_version_before_kill"], goal="> 0 (actors refuse older)",
                           met=figures["learner_first_version_after_resume"]
                           > figures["learner_last_version_before_kill"]))
    result.notes.append(
        f"faults: the replay restored {figures['replay_restored_transitions']:.0f} transitions (its last "
        f"checkpoint, every 2 s); while it was away actor-0 (on_full=drop) dropped "
        f"{figures['outage_actor0_dropped']:.0f} transitions and actor-1 (on_full=block) was blocked "
        f"{figures['outage_actor1_blocked_s']:.1f} s, both still reporting; while the gateway was away the learner "
        f"published {figures['gateway_outage_new_versions']:.0f} new weight versions. Start-up of a Python + "
        "PyTorch process is most of every 'after its restart' figure.")


def _load(ctx: BenchContext, result: SuiteResult, workdir: Path) -> None:
    minutes = ctx.option_float("minutes", 1.0 if ctx.quick else 5.0)
    actors = ctx.option_int("actors", 8)
    tight = ctx.option("tight", "false").lower() in ("1", "true", "yes")
    ctx.progress(f"load: {actors} actors against a slow learner for {minutes:g} min")
    cluster = load_cluster(workdir, actors=actors, envs=16, tight=tight)
    try:
        load = run_load(cluster, minutes * 60, progress=lambda m: ctx.progress(f"load: {m}"))
    except ClusterError as exc:
        raise BenchError(f"load: {exc}") from None
    finally:
        codes = cluster.stop()
    figures = summarize(load)
    result.extra["load"] = {**figures, "exit_codes_after": codes, "samples": load.samples}
    case = f"load, {actors} actors x 16 CartPole, slow learner{', tight bounds' if tight else ''}"
    waiting_bound = 2 * 4 * batches_per_request(0, 512, (4,))  # the learner's own bound on staged batches
    rows: list[tuple[str, str, float, bool, str, bool | None]] = [
        ("worst RSS growth, 2nd half / 1st half of the run", "x", figures["rss_growth_worst"], False, "<= 1.15",
         figures["rss_growth_worst"] <= 1.15),
        ("largest total RSS", "MiB", figures["rss_total_max_mib"], False, "", None),
        ("transitions in flight actors -> replay, 1st half max", "transitions", figures["in_flight_first_half_max"],
         False, "", None),
        ("transitions in flight actors -> replay, 2nd half max", "transitions",
         figures["in_flight_second_half_max"], False, "bounded (not above the 1st half by much)",
         figures["in_flight_second_half_max"] <= 1.25 * figures["in_flight_first_half_max"] + 1000),
        ("replay pending sample requests, max", "requests", figures["replay_pending_max"], False, "<= 256",
         figures["replay_pending_max"] <= 256),
        ("learner batches waiting, max", "batches", figures["learner_batches_waiting_max"], False,
         f"<= {waiting_bound} (2 x 4 requests x {waiting_bound // 8} batches each)",
         figures["learner_batches_waiting_max"] <= waiting_bound),
        ("env steps", "per s", figures["env_steps_per_s"], True, "", None),
        ("replay inserts", "per s", figures["inserts_per_s"], True, "", None),
        ("learner updates (batch 512, 512-wide MLP, 1 thread)", "per s", figures["updates_per_s"], True, "", None),
        ("learner waiting for data", "share of time", figures["learner_data_wait_share"], False, "", None),
        ("replay rate limiter holding inserts", "share of time", figures["replay_insert_wait_share"], True, "", None),
        ("blocking actors blocked", "share of time", figures["actor_blocked_share"], True, "", None),
        ("dropping actors dropped", "transitions/s", figures["actor_dropped_per_s"], True, "", None),
    ]
    for metric, unit, value, higher, goal, met in rows:
        result.rows.append(Row(case=case, metric=metric, unit=unit, flywheel=value, higher_is_better=higher,
                               goal=goal, met=met))
    try:
        result.plots.append(_plot_load(ctx, load))
    except BenchError as exc:
        result.notes.append(f"load: no plot ({exc})")


def _fuzz(ctx: BenchContext, result: SuiteResult, workdir: Path) -> None:
    from flywheel.testing.fuzz import run_fuzz  # Hypothesis comes with the dev extra, as the bench installs it

    examples = ctx.option_int("examples", 200 if ctx.quick else 2000)
    ctx.progress(f"fuzz: {examples} inputs to each socket and {examples} HTTP requests on live services")
    try:
        figures = run_fuzz(workdir, examples=examples, http_examples=examples, seed=ctx.seed,
                           progress=lambda m: ctx.progress(f"fuzz: {m}"))
    except ClusterError as exc:
        raise BenchError(f"fuzz: a service died: {exc}") from None
    result.extra["fuzz"] = figures.as_dict()
    for name, tried in sorted(figures.inputs.items()):
        expected = figures.expected_refused.get(name, 0)
        counted = figures.counted_refused.get(name)
        cut = figures.cut.get(name, 0)
        result.rows.append(Row(case=f"fuzz: {name} socket", metric=f"inputs tried ({cut} cut by libzmq for a part "
                               f"over the cap; of the rest {expected} refused by the codec"
                               f"{'' if counted is None else f', {counted:.0f} counted by the service'})",
                               unit="messages", flywheel=tried, goal="every codec refusal counted" if counted
                               is not None else "", met=None if counted is None else counted >= expected))
    result.rows.append(Row(case="fuzz: HTTP routes", metric=f"requests over {len(figures.http_requests)} "
                           "method/route pairs", unit="requests", flywheel=sum(figures.http_requests.values())))
    result.rows.append(Row(case="fuzz: HTTP routes", metric="5xx answers", unit="answers",
                           flywheel=len(figures.http_5xx), higher_is_better=False, goal="0",
                           met=not figures.http_5xx))
    result.rows.append(Row(case="fuzz: every service", metric="crashes", unit="processes", flywheel=0.0,
                           higher_is_better=False, goal="0", met=True))
    for name, growth in sorted(figures.rss_peak_growth_mib.items()):
        result.rows.append(Row(case=f"fuzz: {name}", metric="peak resident memory growth", unit="MiB",
                               flywheel=growth, higher_is_better=False))
    result.notes.append(f"fuzz: {figures.seconds:.0f} s; afterwards {figures.after['probe_rows_received']:.0f} "
                        f"probe transitions arrived and the learner made {figures.after['learner_updates_after']:.0f} "
                        "more updates; HTTP status counts " + json.dumps(dict(figures.http_status), sort_keys=True))


def _plot_load(ctx: BenchContext, load: LoadRun) -> str:
    plt = pyplot()
    fig, (mem, pressure) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name in load.names:
        points = load.series(f"rss.{name}")
        mem.plot([t for t, _ in points], [v / 2**20 for _, v in points], label=name, lw=1)
    mem.set_xlabel("seconds")
    mem.set_ylabel("resident MiB (process + children)")
    mem.set_title("memory per process")
    mem.legend(fontsize=6, ncol=2)

    def rate(key: str) -> tuple[list[float], list[float]]:
        pts = load.series(key)
        return [b[0] for b in pts[1:]], [(b[1] - a[1]) / max(b[0] - a[0], 1e-9) for a, b in zip(pts, pts[1:],
                                                                                                   strict=False)]
    blocked_t, blocked = rate("actor.blocked_s")
    wait_t, wait = rate("replay.insert_wait_s")
    data_t, data = rate("learner.data_wait_s")
    pressure.plot(blocked_t, blocked, label="actors blocked (actor-seconds/s)")
    pressure.plot(wait_t, wait, label="replay limiter holding inserts (share)")
    pressure.plot(data_t, data, label="learner waiting for data (share)")
    flight = load.series("actor.sent")
    received = dict(load.series("replay.received"))
    ax2 = pressure.twinx()
    ax2.plot([t for t, _ in flight], [v - received.get(t, 0.0) for t, v in flight], "k:", label="in flight")
    ax2.set_ylabel("transitions in flight (dotted)")
    pressure.set_xlabel("seconds")
    pressure.set_title("where the back-pressure is")
    pressure.legend(fontsize=7, loc="center right")
    return save_figure(fig, ctx.plot_path("load"))


def _curve(ctx: BenchContext, result: SuiteResult) -> None:
    import zmq

    from flywheel import proto, security

    ctx.progress("curve: 256 KiB transition messages over TCP loopback, plain and CURVE interleaved")
    rows = (256 << 10) // (2 * 4 * 84 * 84)  # pixel transitions, obs and next_obs: up to an actor's 256 KiB cap
    obs = np.random.default_rng(ctx.seed).integers(0, 255, (rows, 4, 84, 84), dtype=np.uint8)
    batch = proto.TransitionBatch(actor="bench", weight_version=1, seq=0, obs=obs, action=np.zeros(rows, np.int64),
                                  reward=np.zeros(rows, np.float32), discount=np.ones(rows, np.float32),
                                  next_obs=obs)
    frames = proto.encode(batch)
    size = sum(memoryview(f).nbytes for f in frames)
    count = 200 if ctx.quick else 2000
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    keys = security.CurveKeys(server_public, server_secret, client_public, client_secret,
                              frozenset({client_public}))
    measured: dict[str, list[float]] = {"plain": [], "curve": []}
    for _ in range(ctx.warmup + ctx.runs):
        for mode in ("plain", "curve"):
            measured[mode].append(_throughput(keys if mode == "curve" else None, frames, count) * size / 1e6)
    plain, encrypted = (measured[m][ctx.warmup:] for m in ("plain", "curve"))
    result.rows.append(Row(case=f"{size >> 10} KiB transition messages, TCP loopback", metric="throughput",
                           unit="MB/s", flywheel=median(encrypted), peer=median(plain), peer_name="plain TCP",
                           flywheel_runs=encrypted, peer_runs=plain,
                           goal="CURVE off by default; on between hosts, costs this ratio"))
    result.extra["curve"] = {"message_bytes": size, "messages": count, **measured}


def _throughput(keys: Any, frames: list[Any], count: int) -> float:
    """Messages per second from a PUSH to a PULL over TCP loopback, with CURVE when ``keys`` are given."""
    import threading

    import zmq

    from flywheel import security
    from flywheel.transport import bind, connect, make_socket

    ctx = zmq.Context()
    before = security.active()
    security.configure(keys)
    try:
        pull = make_socket(ctx, zmq.PULL, rcvhwm=16)
        bind(pull, "tcp://127.0.0.1:*", "bench", "-")
        endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
        push = make_socket(ctx, zmq.PUSH, sndhwm=16)
        connect(push, endpoint)
    finally:
        security.configure(before)
    done = threading.Event()

    def drain() -> None:
        for _ in range(count):
            pull.recv_multipart(copy=False)
        done.set()

    push.send_multipart(frames, copy=False)  # the connection is up (and the handshake done) before the clock
    pull.recv_multipart()
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    began = time.perf_counter()
    for _ in range(count):
        push.send_multipart(frames, copy=False)
    if not done.wait(300):
        raise BenchError("curve: the receiver did not get every message in 300 s")
    seconds = time.perf_counter() - began
    push.close(0)
    pull.close(0)
    ctx.term()
    return count / seconds
