"""The real gateway, replay and learner under simulated actors (``flywheel bench load``): one step at N actors."""

from __future__ import annotations

import re
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from flywheel import keyfiles
from flywheel.bench.parts.sim_actors import SimActors, SimConfig
from flywheel.bench.runner import BenchError
from flywheel.launch.runwatch import fetch_status
from flywheel.presets import DEFAULT_ENV
from flywheel.testing.cluster import Cluster, ClusterError

SERVICES = ("gateway", "replay", "learner")
# What the suite changes from the Mario preset unless told otherwise (--opt set=...): no rate limiter, so the
# replay takes all it can and the offered load (not the learner's pace) decides; learning starts early; no
# torch.compile, whose minutes of compiling on a few cores would land in the measured window.
DEFAULT_SETS = "replay.samples_per_insert=0;replay.min_size_to_sample=1000;learner.compile=off"
COMPOSE = Path(__file__).resolve().parents[3] / "docker-compose.yml"
SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)b?$")


def parse_sets(text: str) -> dict[str, dict[str, str]]:
    """``service.key=value;...`` as per-service settings (``{"replay": {"CAPACITY": "1000"}}``)."""
    out: dict[str, dict[str, str]] = {}
    for item in (i.strip() for i in text.split(";")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        service, dot, key = name.partition(".")
        if not sep or not dot or service not in SERVICES or not key:
            raise BenchError(f"--opt set: {item!r} is not SERVICE.KEY=VALUE with SERVICE one of "
                             f"{', '.join(SERVICES)}")
        out.setdefault(service, {})[key.upper()] = value
    return out


def compose_memory_limits(path: Path = COMPOSE) -> dict[str, float]:
    """Each service's default ``mem_limit`` in docker-compose.yml, in bytes (empty when the file is not here)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for service, raw in re.findall(r"FLYWHEEL_MEMORY_(\w+):-([\w.]+)\}", text):
        found = SIZE.match(raw.lower())
        if found:
            out[service.lower()] = float(found[1]) * 1024 ** " kmg".index(found[2] or " ")
    return out


def make_keys(folder: Path, names: list[str]) -> Path:
    """A key folder whose servers accept every simulated actor's own key (``clients/NAME``); a kept folder (``--opt
    workdir``) keeps its keys and gains the clients it lacks."""
    if (folder / "server.key_secret").exists():
        keyfiles.add_clients(folder, names)
    else:
        keyfiles.generate(folder, names)
    return folder


def start_services(workdir: Path, keys: Path, sets: dict[str, dict[str, str]], timeout: float = 300.0) -> Cluster:
    """Gateway, replay and learner as ``Cluster`` starts them (a ``flywheel <service>`` process each, loopback TCP),
    with CURVE on, the Mario preset and the default env id, the learner sampling over a Unix socket and shared memory
    as in Compose; returned once the replay and the learner report."""
    sample = f"ipc://{workdir / 'sample.sock'}"
    base = {"CURVE_KEYS_DIR": str(keys), "PRESET": "mario"}
    settings = {
        "gateway": {**base, **sets.get("gateway", {})},
        "replay": {**base, "SAMPLE_BIND": sample, **sets.get("replay", {})},
        "learner": {**base, "SAMPLE_ENDPOINT": sample, "TORCH_THREADS": "1", **sets.get("learner", {})},
    }
    cluster = Cluster(workdir, env_id=DEFAULT_ENV, settings=settings)
    for service in SERVICES:
        cluster.add(service)
    cluster.start_all()
    try:
        cluster.wait(lambda: all(cluster.is_up(f"{s}-0") for s in ("replay", "learner")), timeout,
                     "the replay and the learner reporting to the gateway", alive=list(cluster.services))
    except ClusterError:
        cluster.stop()
        raise
    return cluster


def get_metrics(url: str) -> tuple[float, str]:
    """Seconds a GET of /metrics took, and its text."""
    began = time.perf_counter()
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return time.perf_counter() - began, text


def metric(text: str, name: str) -> float:
    """The sum of one metric's samples in Prometheus text (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rpartition(" ")[2])
    return total


def zmq_io_cpu(pid: int) -> float:
    """CPU seconds of a process's ZeroMQ I/O threads (libzmq names them ZMQbg/IO/n): where CURVE encrypts."""
    total = 0.0
    try:
        for thread in psutil.Process(pid).threads():
            try:
                name = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
            except OSError:
                continue
            if name.startswith("ZMQbg/IO"):
                total += thread.user_time + thread.system_time
    except psutil.Error:
        return 0.0
    return total


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of one process so far (0 when it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def _inst(status: dict[str, Any], name: str) -> dict[str, Any]:
    for entry in status.get("services", {}).values():
        for inst in entry.get("instances", []):
            if inst.get("instance") == name:
                return inst
    return {}


def _counter(inst: dict[str, Any], key: str) -> float:
    return float(inst.get("counters", {}).get(key, 0.0))


def _gauge(inst: dict[str, Any], key: str) -> float:
    return float(inst.get("gauges", {}).get(key, 0.0))


@dataclass
class Point:
    """One poll of the running step."""

    t: float
    status: dict[str, Any]
    metrics_s: float
    metrics_text: str
    rss: dict[str, float]
    io_cpu: dict[str, float]
    generator_cpu: float = 0.0  # CPU seconds of the simulated actors' processes so far

    def cpu(self, service: str) -> float:
        """CPU seconds of a service's process and children, as it reported them (the gateway: its /metrics)."""
        if service == "gateway":
            return metric(self.metrics_text, "flywheel_gateway_process_cpu_seconds_total")
        inst = _inst(self.status, f"{service}-0")
        return _counter(inst, "process_cpu_seconds_total") + _counter(inst, "process_children_cpu_seconds_total")

    def reported_rss(self, service: str) -> float:
        """Resident bytes of a service's process and children, as it reported them (the gateway: its /metrics)."""
        if service == "gateway":
            return metric(self.metrics_text, "flywheel_gateway_process_resident_memory_bytes")
        inst = _inst(self.status, f"{service}-0")
        return _gauge(inst, "process_resident_memory_bytes") + _gauge(inst, "process_children_resident_memory_bytes")

    def actors(self) -> list[dict[str, Any]]:
        return list(self.status.get("services", {}).get("actor", {}).get("instances", []))

    def actor_total(self, key: str) -> float:
        return sum(_counter(a, key) for a in self.actors())

    def lags(self) -> list[float]:
        """Policy lag of every live simulated actor: the learner's last published version minus the one it holds."""
        published = _gauge(_inst(self.status, "learner-0"), "weight_version")
        return [max(0.0, published - _gauge(a, "weight_version")) for a in self.actors() if a.get("up")]


@dataclass
class Step:
    """What one step at N simulated actors measured."""

    actors: int
    points: list[Point] = field(default_factory=list)
    sim: dict[str, Any] = field(default_factory=dict)
    after: Point | None = None
    leases_granted_s: float = 0.0


def _poll(cluster: Cluster, started: float, generator: list[int]) -> Point | None:
    status = fetch_status(cluster.url, timeout=30.0)
    if status is None:
        return None
    try:
        seconds, text = get_metrics(cluster.url)
    except OSError:
        return None
    names = [f"{s}-0" for s in SERVICES]
    return Point(time.monotonic() - started, status, seconds, text, {n: float(cluster.rss(n)) for n in names},
                 {n: zmq_io_cpu(cluster.pid(n)) for n in names}, sum(cpu_seconds(pid) for pid in generator))


def run_step(cluster: Cluster, cfg: SimConfig, *, processes: int, warmup_s: float, seconds: float,
             poll_s: float = 1.0, progress: Callable[[str], None] = lambda _: None) -> Step:
    """Run the generator at ``len(cfg.names)`` identities against ``cluster``: warm up, measure, drain.

    The window opens once every identity holds a lease and ``warmup_s`` has passed; every ``poll_s`` it takes
    /status (each service's telemetry, the simulated actors' versions), a timed GET of /metrics, each service's
    resident memory with its children and the CPU of its ZeroMQ I/O threads, and the generator's CPU."""
    step = Step(len(cfg.names))
    sim = SimActors(cfg, processes)
    try:
        sim.wait_ready(120.0)
        started = time.monotonic()
        sim.go()

        def leased() -> bool:
            status = cluster.status()
            return status is not None and status.get("leases", {}).get("count", 0) >= step.actors

        cluster.wait(leased, max(60.0, warmup_s), f"{step.actors} leases granted", poll_s=0.5,
                     alive=list(cluster.services))
        step.leases_granted_s = time.monotonic() - started
        time.sleep(max(0.0, warmup_s - step.leases_granted_s))
        progress(f"{step.actors} actors: leases after {step.leases_granted_s:.1f} s; measuring {seconds:g} s")
        window_end = time.monotonic() + seconds
        while time.monotonic() < window_end:
            cluster.check_alive()
            point = _poll(cluster, started, sim.pids())
            if point is not None:
                step.points.append(point)
            time.sleep(max(0.0, min(poll_s, window_end - time.monotonic())))
        step.sim = sim.finish()
    finally:
        sim.close()
    time.sleep(3.0)  # the replay's last inserts and every final report reach the gateway
    step.after = _poll(cluster, started, [])
    if len(step.points) < 2 or step.after is None:
        raise BenchError(f"{step.actors} actors: the gateway answered {len(step.points)} polls; logs in "
                         f"{cluster.workdir}")
    return step


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(step: Step, rate: float, limits: dict[str, float]) -> dict[str, Any]:
    """The step's raw figures: rates, CPU per 1k transitions/s per service, memory, publishing, lag, drops."""
    a, b, after = step.points[0], step.points[-1], step.after
    assert after is not None
    dt = b.t - a.t
    replay_a, replay_b = _inst(a.status, "replay-0"), _inst(b.status, "replay-0")
    learner_a, learner_b = _inst(a.status, "learner-0"), _inst(b.status, "learner-0")
    received = (_counter(replay_b, "transitions_received_total") - _counter(replay_a, "transitions_received_total"))
    received_per_s = received / dt
    out: dict[str, Any] = {
        "actors": step.actors, "window_s": dt, "offered_per_s": step.actors * rate,
        "sent_per_s": (b.actor_total("transitions_sent_total") - a.actor_total("transitions_sent_total")) / dt,
        "received_per_s": received_per_s, "leases_granted_after_s": step.leases_granted_s,
    }
    leases = a.status.get("leases", {})
    out["leases"] = {"count_at_window_start": leases.get("count", 0),
                     "holders_at_window_start": sorted(leases.get("actors", [])),
                     "actors_up_at_window_start": sum(1 for x in a.actors() if x.get("up"))}
    for service in SERVICES:
        cores = (b.cpu(service) - a.cpu(service)) / dt
        peak = max(p.rss[f"{service}-0"] for p in step.points)
        out[service] = {
            "cpu_cores": cores,
            "cpu_cores_per_1k_transitions_per_s": cores / (received_per_s / 1000) if received_per_s > 0 else None,
            "rss_peak_bytes": peak, "rss_limit_bytes": limits.get(service),
            "rss_reported_max_bytes": max(p.reported_rss(service) for p in step.points),
            "rss_share_of_limit": peak / limits[service] if limits.get(service) else None,
            "zmq_io_cpu_cores": (b.io_cpu[f"{service}-0"] - a.io_cpu[f"{service}-0"]) / dt,
        }
    publishes = _counter(learner_b, "weights_published_total") - _counter(learner_a, "weights_published_total")
    sim = step.sim
    identities = sim.get("identities", [])
    weights_bytes = float(sim.get("weights_bytes", 0.0))
    io = out["learner"]["zmq_io_cpu_cores"] * dt
    fanout = _counter(learner_b, "weights_fanout_bytes_total") - _counter(learner_a, "weights_fanout_bytes_total")
    deferred = (_counter(learner_b, "weights_publishes_deferred_total")
                - _counter(learner_a, "weights_publishes_deferred_total"))
    out["publishing"] = {
        "publishes": publishes, "publishes_per_s": publishes / dt,
        "updates_per_s": (_counter(learner_b, "updates_total") - _counter(learner_a, "updates_total")) / dt,
        "bytes_per_publish": weights_bytes, "wire_bytes_per_publish": weights_bytes * step.actors,
        "encode_cpu_s_per_publish": sim.get("weights_encode_cpu_s"),
        "learner_io_thread_cpu_s_per_publish": io / publishes if publishes > 0 else None,
        # the fan-out budget (learner.weights_fanout_mb_per_s) sends fewer versions than it makes: bytes sent, the
        # versions deferred (replaced by a newer one before their turn), the I/O thread's CPU per MB on the wire
        "fanout_bytes_per_s": fanout / dt, "deferred_per_s": deferred / dt,
        "subscribers": _gauge(learner_b, "weights_subscribers"),
        "min_interval_s": _gauge(learner_b, "weights_min_interval_seconds"),
        "learner_io_thread_cpu_ms_per_mb": io * 1e3 / (fanout / 1e6) if fanout > 0 else None,
        "learner_cpu_s_per_update": ((b.cpu("learner") - a.cpu("learner"))
                                     / max(1.0, _counter(learner_b, "updates_total")
                                           - _counter(learner_a, "updates_total"))),
    }
    lags = [lag for p in step.points for lag in p.lags()]
    spreads = _fanout_spreads(identities)
    out["policy_lag"] = {
        "p50_versions": statistics.median(lags) if lags else None, "p95_versions": _pct(lags, 0.95),
        "max_versions": max(lags) if lags else None, "samples": len(lags),
        "fanout_spread_p50_s": statistics.median(spreads) if spreads else None,
        "fanout_spread_max_s": max(spreads) if spreads else None,
        "versions_per_actor_min": min((len(i["versions"]) for i in identities), default=0),
    }
    render = [p.metrics_s for p in step.points]
    out["metrics_render"] = {"p50_s": statistics.median(render), "max_s": max(render),
                             "bytes": len(b.metrics_text.encode())}
    sent = sum(i["sent"] for i in identities)
    replay_after = _inst(after.status, "replay-0")
    total_received = _counter(replay_after, "transitions_received_total")
    gateway = after.status.get("gateway", {})
    out["losses"] = {
        "sent": sent, "received": total_received, "unaccounted": sent - total_received,
        "actor_dropped": sum(i["dropped"] for i in identities),
        "generator_late_steps": sum(i["late_steps"] for i in identities),
        "replay_rejected_batches": _counter(replay_after, "transitions_rejected_total"),
        "replay_rejected": {k: v for k, v in replay_after.get("counters", {}).items() if k.startswith("rejected_")},
        "actor_telemetry_dropped": sum(i["telemetry_dropped"] for i in identities),
        "actor_rejected": sum(sum(i["rejected"].values()) for i in identities),
        "gateway_rejected": gateway.get("rejected", {}),
        "curve_handshakes_refused": metric(after.metrics_text, "flywheel_gateway_curve_handshakes_refused_total"),
        "identities_without_lease": sum(1 for i in identities if not i["lease"]),
        "identities_without_weights": sum(1 for i in identities if not i["versions"]),
    }
    out["generator"] = {"processes_cpu_cores": (b.generator_cpu - a.generator_cpu) / dt, "cpu_s": sim.get("cpu_s"),
                        "max_rss_bytes": sim.get("max_rss_bytes")}
    lost = out["losses"]
    out["falls_behind"] = bool(received_per_s < 0.95 * out["offered_per_s"] or lost["actor_dropped"] > 0
                               or lost["generator_late_steps"] > 0)
    return out


def _fanout_spreads(identities: list[dict[str, Any]]) -> list[float]:
    """Per weights version: seconds from the first identity that took it to the last (every process, one clock)."""
    arrivals: dict[str, list[float]] = {}
    for ident in identities:
        for version, at in ident["versions"].items():
            arrivals.setdefault(version, []).append(at)
    return [max(times) - min(times) for times in arrivals.values() if len(times) == len(identities)]
