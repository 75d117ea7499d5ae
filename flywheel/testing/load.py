"""Many actors at full speed against a deliberately slow learner: memory, queues and where the back-pressure is.

Used by ``flywheel bench reliability`` (minutes, with plots) and by ``tests/reliability`` (under a minute, bounded).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.testing.cluster import Cluster, ClusterError

# A learner that is slow on purpose: a 512-wide MLP (the actors use the same) on batches of 512, one CPU thread.
HIDDEN = "512"
SLOW_LEARNER = {"BATCH_SIZE": "512", "HIDDEN": HIDDEN, "TORCH_THREADS": "1", "PUBLISH_INTERVAL_UPDATES": "5",
                "REQUESTS_IN_FLIGHT": "4"}
MAX_PENDING = 256
TRANSITIONS_HWM = 16


@dataclass
class LoadRun:
    """Samples every few seconds: RSS per process and the gauges and counters that show queues and waiting."""

    names: list[str]
    started: float
    samples: list[dict[str, float]] = field(default_factory=list)

    def series(self, key: str) -> list[tuple[float, float]]:
        return [(s["t"], s[key]) for s in self.samples if key in s]


def load_cluster(workdir: Path, actors: int = 8, envs: int = 16, *, tight: bool = False) -> Cluster:
    """Gateway, a rate-limited replay, the slow learner and ``actors`` actors (half block, half drop when full).

    ``tight`` bounds what travels between actors and replay to a few hundred transitions per actor (small
    messages, high-water marks of 2, 16 KiB kernel buffers), so the back-pressure reaches the actors in seconds;
    without it the defaults hold (TCP buffers of a few MiB per actor, filled in minutes at CartPole's 60-byte rows).
    """
    hwm, actor_extra, replay_extra = str(TRANSITIONS_HWM), {}, {}
    if tight:
        hwm = "2"
        actor_extra = {"SEND_BATCH": "32", "SEND_BUFFER_KB": "16"}
        replay_extra = {"TRANSITIONS_BUFFER_KB": "16"}
    cluster = Cluster(workdir, settings={
        "replay": {"CAPACITY": "200000", "MIN_SIZE_TO_SAMPLE": "2000", "SAMPLES_PER_INSERT": "8",
                   "ERROR_BUFFER": "4000", "BLOCK_INSERTS": "true", "TRANSITIONS_HWM": hwm,
                   "MAX_PENDING_REQUESTS": str(MAX_PENDING), **replay_extra},
        "learner": dict(SLOW_LEARNER),
        "actor": {"NUM_ENVS": str(envs), "HIDDEN": HIDDEN, "SEND_HWM": hwm, "WEIGHTS_INTERVAL_S": "2",
                  **actor_extra},
    })
    for name in ("gateway", "replay", "learner"):
        cluster.add(name)
    for i in range(actors):
        cluster.add("actor", f"actor-{i}", ON_FULL="block" if i < (actors + 1) // 2 else "drop")
    return cluster


def _sample(cluster: Cluster, run: LoadRun) -> dict[str, float] | None:
    status = cluster.status()
    if status is None:
        return None
    row: dict[str, float] = {"t": time.monotonic() - run.started}
    for name in run.names:
        row[f"rss.{name}"] = float(cluster.rss(name))
    actors = [n for n in run.names if n.startswith("actor-")]
    insts = {n: cluster.instance(n, status) or {} for n in run.names}

    def total(names: list[str], key: str) -> float:
        return sum(float(insts[n].get("counters", {}).get(key, 0.0)) for n in names)

    def gauge(name: str, key: str) -> float:
        return float(insts[name].get("gauges", {}).get(key, 0.0))

    row.update({
        "actor.env_steps": total(actors, "env_steps_total"),
        "actor.blocked_s": total(actors, "send_blocked_seconds_total"),
        "actor.dropped": total(actors, "transitions_dropped_total"),
        "actor.sent": total(actors, "transitions_sent_total"),
        "replay.received": total(["replay-0"], "transitions_received_total"),
        "replay.insert_wait_s": total(["replay-0"], "rate_limiter_insert_wait_seconds_total"),
        "replay.sample_wait_s": total(["replay-0"], "rate_limiter_sample_wait_seconds_total"),
        "replay.pending": gauge("replay-0", "pending_sample_requests"),
        "replay.size": gauge("replay-0", "size_transitions"),
        "learner.updates": total(["learner-0"], "updates_total"),
        "learner.data_wait_s": total(["learner-0"], "data_wait_seconds_total"),
        "learner.batches_waiting": gauge("learner-0", "batches_waiting"),
        "learner.in_flight": gauge("learner-0", "requests_in_flight"),
        "gateway.telemetry": float(len([n for n in run.names if insts[n]])),
    })
    return row


def run_load(cluster: Cluster, seconds: float, *, every_s: float = 2.0,
             progress: Callable[[str], None] = lambda _: None) -> LoadRun:
    """Start everything, wait until the learner trains, then sample for ``seconds``."""
    names = list(cluster.services)
    cluster.start_all()
    cluster.wait(lambda: cluster.value("learner-0", "updates_total") > 0 and all(
        cluster.is_up(n) for n in names if n != "gateway-0"), 240, "every process up and the learner training",
        alive=names)
    run = LoadRun(names, time.monotonic())
    next_line = 0.0
    while time.monotonic() - run.started < seconds:
        cluster.check_alive()
        row = _sample(cluster, run)
        if row is not None:
            run.samples.append(row)
            if row["t"] >= next_line:
                next_line = row["t"] + 30
                rss = max(v for k, v in row.items() if k.startswith("rss.")) / 2**20
                progress(f"{row['t']:.0f} s: {row['actor.env_steps']:,.0f} env steps, {row['learner.updates']:,.0f} "
                         f"updates, largest RSS {rss:,.0f} MiB, replay pending {row['replay.pending']:.0f}")
        time.sleep(every_s)
    if len(run.samples) < 4:
        raise ClusterError(f"only {len(run.samples)} samples of the running system in {seconds:.0f} s")
    return run


def summarize(run: LoadRun) -> dict[str, float]:
    """RSS growth (second half vs first half, per process), queue maxima and where the time went."""
    half = run.samples[len(run.samples) // 2]["t"]
    first = [s for s in run.samples if s["t"] < half]
    second = [s for s in run.samples if s["t"] >= half]
    a, b = run.samples[0], run.samples[-1]
    wall = b["t"] - a["t"]
    actors = sum(1 for n in run.names if n.startswith("actor-"))
    out: dict[str, float] = {"seconds": wall, "actors": float(actors)}
    for name in run.names:
        key = f"rss.{name}"
        out[f"rss_first_half_max_mib.{name}"] = max(s[key] for s in first) / 2**20
        out[f"rss_second_half_max_mib.{name}"] = max(s[key] for s in second) / 2**20
    growth = [out[f"rss_second_half_max_mib.{n}"] / max(out[f"rss_first_half_max_mib.{n}"], 1e-9)
              for n in run.names]
    out["rss_growth_worst"] = max(growth)
    out["rss_total_max_mib"] = max(sum(v for k, v in s.items() if k.startswith("rss.")) for s in run.samples) / 2**20
    out["replay_pending_max"] = max(s["replay.pending"] for s in run.samples)
    out["learner_batches_waiting_max"] = max(s["learner.batches_waiting"] for s in run.samples)
    out["learner_in_flight_max"] = max(s["learner.in_flight"] for s in run.samples)
    out["replay_size_max"] = max(s["replay.size"] for s in run.samples)
    out["env_steps_per_s"] = (b["actor.env_steps"] - a["actor.env_steps"]) / wall
    out["updates_per_s"] = (b["learner.updates"] - a["learner.updates"]) / wall
    out["inserts_per_s"] = (b["replay.received"] - a["replay.received"]) / wall
    in_flight = [s["actor.sent"] - s["replay.received"] for s in run.samples]  # sent by actors, not yet taken
    out["in_flight_first_half_max"] = max(in_flight[: len(first)])
    out["in_flight_second_half_max"] = max(in_flight[len(first):])
    out["actor_blocked_share"] = (b["actor.blocked_s"] - a["actor.blocked_s"]) / max(wall * ((actors + 1) // 2), 1e-9)
    out["actor_dropped_per_s"] = (b["actor.dropped"] - a["actor.dropped"]) / wall
    out["replay_insert_wait_share"] = (b["replay.insert_wait_s"] - a["replay.insert_wait_s"]) / wall
    out["learner_data_wait_share"] = (b["learner.data_wait_s"] - a["learner.data_wait_s"]) / wall
    return out
