"""Load: 16, 64, 256 simulated actors (real sockets, messages, CURVE keys) against the real gateway, replay, learner."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel.bench.parts import load_services as _services
from flywheel.bench.parts.sim_actors import SimConfig
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult
from flywheel.presets import DEFAULT_ENV

DESCRIPTION = ("16, 64, 256 simulated actors (real protocol, CURVE) against the real services: CPU per 1k "
               "transitions/s, memory, weights publishing, policy lag, /metrics time, drops")
OPTIONS = {
    "actors": "simulated actor counts, one step each on fresh services (default 16,64,256)",
    "seconds": "measured seconds per step (default 60; --quick 15)",
    "warmup_s": "seconds from the generator's start to the window (at least until every lease; default 10; --quick 5)",
    "rate": "transitions per second per simulated actor (default 8)",
    "envs": "env slots per simulated actor: rows per step, streams whose frames the replay dedups (default 8)",
    "per_process": "simulated actors per generator process (default 64)",
    "set": f"';'-separated SERVICE.KEY=VALUE settings over the Mario preset (default {_services.DEFAULT_SETS})",
    "workdir": "keep the services' logs and keys in this folder (default: a temporary one)",
}


def sim_names(count: int) -> list[str]:
    """The simulated actors' instance names, which are also their CURVE key names (an actor's role)."""
    return [f"sim-actor-{i}" for i in range(count)]


def measure_step(workdir: Path, keys: Path, actors: int, *, rate: float, seconds: float, warmup_s: float,
                 envs: int = 8, per_process: int = 64, sets: dict[str, dict[str, str]] | None = None,
                 limits: dict[str, float] | None = None,
                 progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """One step: fresh services, ``actors`` simulated actors for ``warmup_s`` + ``seconds``, the raw figures."""
    if rate <= 0 or actors < 1 or envs < 1 or per_process < 1:
        raise BenchError("rate must be above 0, and actors, envs and per_process at least 1")
    sets = _services.parse_sets(_services.DEFAULT_SETS) if sets is None else sets
    cluster = _services.start_services(workdir, keys, sets)
    try:
        ep = cluster.endpoint
        cfg = SimConfig(names=tuple(sim_names(actors)), env_id=DEFAULT_ENV, transitions=ep("transitions"),
                        weights=ep("weights"), lease=ep("lease"), telemetry=ep("telemetry"), control=ep("control"),
                        rate=rate, seconds=warmup_s + seconds + 300, keys_dir=str(keys), envs=envs)
        step = _services.run_step(cluster, cfg, processes=math.ceil(actors / per_process), warmup_s=warmup_s,
                                  seconds=seconds, progress=progress)
    finally:
        codes = cluster.stop()
    figures = _services.summarize(step, rate, limits if limits is not None else _services.compose_memory_limits())
    figures["exit_codes"] = codes
    figures["settings"] = {"rate_per_actor": rate, "envs": envs, "per_process": per_process, "sets": sets,
                           "curve": True, "env_id": DEFAULT_ENV}
    return figures


def run(ctx: BenchContext) -> SuiteResult:
    try:
        counts = [int(a) for a in ctx.option("actors", "16,64,256").split(",") if a.strip()]
    except ValueError:
        raise BenchError("--opt actors expects comma-separated integers, e.g. 16,64,256") from None
    if not counts or min(counts) < 1:
        raise BenchError("--opt actors expects counts of at least 1")
    seconds = ctx.option_float("seconds", 15.0 if ctx.quick else 60.0)
    warmup_s = ctx.option_float("warmup_s", 5.0 if ctx.quick else 10.0)
    rate = ctx.option_float("rate", 8.0)
    envs, per_process = ctx.option_int("envs", 8), ctx.option_int("per_process", 64)
    sets = _services.parse_sets(ctx.option("set", _services.DEFAULT_SETS))
    limits = _services.compose_memory_limits()
    steps: list[dict[str, Any]] = []
    with ctx.workdir("load") as tmp:
        keys = _services.make_keys(tmp / "keys", sim_names(max(counts)))
        for actors in counts:
            ctx.progress(f"{actors} simulated actors at {rate:g} transitions/s each")
            steps.append(measure_step(tmp / f"actors-{actors}", keys, actors, rate=rate, seconds=seconds,
                                      warmup_s=warmup_s, envs=envs, per_process=per_process, sets=sets,
                                      limits=limits, progress=ctx.progress))
    return assemble(steps, limits, method=f"one step per actor count on fresh services, {seconds:g} s measured "
                                          f"after every lease was granted and {warmup_s:g} s had passed")


def assemble(steps: list[dict[str, Any]], limits: dict[str, float], method: str = "") -> SuiteResult:
    """The suite's result from its steps' raw figures: rows, the per-step table, notes, and the figures in extra."""
    result = SuiteResult(suite="load", title="Load: simulated actors against the real services, with CURVE",
                         method=method)
    for figures in steps:
        result.rows += _rows(figures)
    result.extra["steps"] = steps
    result.extra["memory_limits_bytes"] = limits
    result.sections.append(table(steps))
    behind = [s["actors"] for s in steps if s["falls_behind"]]
    settings = steps[0]["settings"] if steps else {}
    result.notes += [
        f"Offered load: {settings.get('rate_per_actor')} transitions/s per simulated actor in vector steps of "
        f"{settings.get('envs')} Mario-size rows ({DEFAULT_ENV}), CURVE on; settings over the Mario preset: "
        f"{settings.get('sets')}.",
        "First falls behind (replay taking under 95% of the offered rate, or the actors dropping, or the generator "
        f"late): {behind[0]} actors." if behind else "Nothing fell behind at any actor count measured.",
        "CPU is each service's own report (process and children; the gateway's from its /metrics); memory the peak "
        "resident size sampled every second; the generator's CPU is measured apart and shares the machine.",
    ]
    return result


def _mib(value: float | None) -> float:
    return float("nan") if value is None else value / 2**20


def _rows(s: dict[str, Any]) -> list[Row]:
    case = f"{s['actors']} simulated actors"
    rows = [Row(case=case, metric="transitions into the replay", unit="1/s", flywheel=s["received_per_s"],
                goal=f"the offered {s['offered_per_s']:,.0f}/s", met=s["received_per_s"] >= 0.95 * s["offered_per_s"])]
    for service in _services.SERVICES:
        figures = s[service]
        per_1k = figures["cpu_cores_per_1k_transitions_per_s"]
        rows.append(Row(case=case, metric=f"{service} CPU per 1k transitions/s", unit="cores",
                        flywheel=float("nan") if per_1k is None else per_1k, higher_is_better=False))
        limit = figures["rss_limit_bytes"]
        rows.append(Row(case=case, metric=f"{service} resident memory, peak", unit="MiB",
                        flywheel=_mib(figures["rss_peak_bytes"]), higher_is_better=False,
                        goal=f"under the Compose limit {_mib(limit):,.0f} MiB" if limit else "",
                        met=figures["rss_peak_bytes"] < limit if limit else None))
    pub, lag, lost = s["publishing"], s["policy_lag"], s["losses"]
    io = pub["learner_io_thread_cpu_s_per_publish"]
    rows += [
        Row(case=case, metric="weights publishes", unit="1/s", flywheel=pub["publishes_per_s"]),
        Row(case=case, metric="weights bytes per publish (x actors on the wire)", unit="KiB",
            flywheel=pub["bytes_per_publish"] / 1024, higher_is_better=False),
        Row(case=case, metric="learner ZeroMQ I/O thread CPU per publish", unit="ms",
            flywheel=float("nan") if io is None else 1e3 * io, higher_is_better=False),
        Row(case=case, metric="weights fan-out sent (all subscribers)", unit="MB/s",
            flywheel=pub["fanout_bytes_per_s"] / 1e6, higher_is_better=False),
        Row(case=case, metric="weights versions deferred by the fan-out budget", unit="1/s",
            flywheel=pub["deferred_per_s"], higher_is_better=False),
        Row(case=case, metric="learner ZeroMQ I/O thread CPU per MB sent", unit="ms",
            flywheel=_num(pub["learner_io_thread_cpu_ms_per_mb"]), higher_is_better=False),
        Row(case=case, metric="policy lag, max", unit="versions", flywheel=_num(lag["max_versions"]),
            higher_is_better=False, goal="bounded"),
        Row(case=case, metric="/metrics render time, max", unit="s", flywheel=s["metrics_render"]["max_s"],
            higher_is_better=False, goal="< 1 s", met=s["metrics_render"]["max_s"] < 1.0),
        Row(case=case, metric="transitions dropped at the actors (counted)", unit="transitions",
            flywheel=lost["actor_dropped"], higher_is_better=False),
        Row(case=case, metric="transitions sent and neither stored nor counted", unit="transitions",
            flywheel=lost["unaccounted"], higher_is_better=False, goal="0",
            met=lost["unaccounted"] <= 0 if not lost["replay_rejected_batches"] else None),
    ]
    return rows


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def table(steps: list[dict[str, Any]]) -> str:
    """One line per actor count: the figures side by side."""
    lines = ["| actors | offered/s | into replay/s | CPU per 1k/s: replay, learner, gateway (cores) | peak RSS MiB: "
             "replay, learner, gateway | publishes/s | KiB/publish | fan-out MB/s | I/O ms per MB | lag p50/max "
             "(versions) | /metrics max (s) | dropped (counted) | unaccounted |",
             "|---:|---:|---:|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]

    def fmt(value: float | None, spec: str = ".3g") -> str:
        return "–" if value is None or not math.isfinite(value) else format(value, spec)

    for s in steps:
        cpu = ", ".join(fmt(s[n]["cpu_cores_per_1k_transitions_per_s"]) for n in ("replay", "learner", "gateway"))
        rss = ", ".join(fmt(_mib(s[n]["rss_peak_bytes"]), ",.0f") for n in ("replay", "learner", "gateway"))
        pub, lag, lost = s["publishing"], s["policy_lag"], s["losses"]
        lines.append(f"| {s['actors']} | {fmt(s['offered_per_s'], ',.0f')} | {fmt(s['received_per_s'], ',.0f')} | "
                     f"{cpu} | {rss} | {fmt(pub['publishes_per_s'])} | {fmt(pub['bytes_per_publish'] / 1024, ',.0f')}"
                     f" | {fmt(pub.get('fanout_bytes_per_s', 0) / 1e6)}"
                     f" | {fmt(pub.get('learner_io_thread_cpu_ms_per_mb'))}"
                     f" | {fmt(lag['p50_versions'])}/{fmt(lag['max_versions'])} | "
                     f"{fmt(s['metrics_render']['max_s'])} | {lost['actor_dropped']:,} | {lost['unaccounted']:,.0f} |")
    return "\n".join(lines)
