"""kill -9 of each service in turn during a running CartPole pipeline, with the expectations each must meet.

Used by ``flywheel bench reliability`` (which reports the figures) and by ``tests/reliability`` (which bounds
them). Every expectation that fails raises ClusterError with the services' last log lines.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from flywheel.testing.cluster import Cluster, ClusterError
from flywheel.testing.weights import WeightsWatcher

ACTORS = ("actor-0", "actor-1")  # actor-0 drops at the high-water mark, actor-1 blocks
EVERYONE = ("gateway-0", "replay-0", "learner-0", *ACTORS)


def fault_cluster(workdir: Path) -> Cluster:
    """The pipeline the faults run against: small CartPole settings, frequent checkpoints on both sides."""
    cluster = Cluster(workdir, settings={
        "gateway": {"STALE_AFTER_S": "5", "SWEEP_INTERVAL_S": "0.25"},
        "replay": {"CAPACITY": "20000", "MIN_SIZE_TO_SAMPLE": "200", "CHECKPOINT_DIR": str(workdir / "replay"),
                   "CHECKPOINT_INTERVAL_S": "2", "TRANSITIONS_HWM": "8"},
        "learner": {"BATCH_SIZE": "32", "HIDDEN": "64", "PUBLISH_INTERVAL_UPDATES": "5", "TORCH_THREADS": "1",
                    "CHECKPOINT_DIR": str(workdir / "learner"), "CHECKPOINT_INTERVAL_S": "2"},
        "actor": {"NUM_ENVS": "4", "HIDDEN": "64", "SEND_HWM": "4", "SEND_BATCH": "4"},
    })
    for name in ("gateway", "replay", "learner"):
        cluster.add(name)
    cluster.add("actor", "actor-0", ON_FULL="drop")
    cluster.add("actor", "actor-1", ON_FULL="block")
    return cluster


def _replay_checkpoint_size(directory: Path) -> int:
    """Transitions held by the replay checkpoint on disk now (read without pickle)."""
    positions = np.load(directory / "replay" / "storage.positions.npy", allow_pickle=False)
    return int(positions[0] - positions[1])


def _wait_down(cluster: Cluster, name: str, killed_at: float, timeout: float = 15.0) -> float:
    cluster.wait(lambda: cluster.is_up(name) is False, timeout, f"the gateway to show {name} down", poll_s=0.1)
    return time.monotonic() - killed_at


def _rises(cluster: Cluster, name: str, key: str, timeout: float, what: str, by: float = 1.0) -> float:
    """Wait until ``key`` of ``name`` grows by ``by`` from now; returns the seconds it took."""
    start, began = cluster.value(name, key), time.monotonic()
    cluster.wait(lambda: cluster.value(name, key) >= start + by, timeout, what)
    return time.monotonic() - began


def run_faults(cluster: Cluster, *, outage: float = 6.0,
               progress: Callable[[str], None] = lambda _: None) -> dict[str, float]:
    """Start the pipeline, kill -9 an actor, the replay, the learner and the gateway in turn (each away for
    ``outage`` seconds at least); the figures."""
    figures: dict[str, float] = {}
    watcher = WeightsWatcher(cluster.endpoint("weights")).follow()
    try:
        began = time.monotonic()
        cluster.start_all()

        def trained() -> bool:
            status = cluster.status()
            if status is None or not all(cluster.is_up(n) for n in EVERYONE if n != "gateway-0"):
                return False
            return (cluster.value("learner-0", "updates_total") > 20
                    and all(cluster.value(a, "weight_version") > 0 for a in ACTORS)
                    and (cluster.workdir / "replay" / "replay" / "manifest.json").exists()
                    and (cluster.workdir / "learner" / "learner.safetensors").exists())
        cluster.wait(trained, 180, "the pipeline to train and checkpoint", alive=list(EVERYONE))
        figures["startup_s"] = time.monotonic() - began
        progress(f"pipeline up and trained in {figures['startup_s']:.0f} s")

        # ---- an actor ------------------------------------------------------------------------------------------
        killed = cluster.kill("actor-1")
        figures["actor_down_after_s"] = _wait_down(cluster, "actor-1", killed)
        _rises(cluster, "actor-0", "env_steps_total", 30, "actor-0 to keep acting while actor-1 is gone")
        restarted = time.monotonic()
        cluster.start("actor-1")
        cluster.wait(lambda: cluster.is_up("actor-1") and cluster.value("actor-1", "transitions_sent_total") > 0,
                     60, "the restarted actor-1 to send transitions", alive=list(EVERYONE))
        figures["actor_back_after_s"] = time.monotonic() - restarted
        progress(f"actor: down after {figures['actor_down_after_s']:.1f} s, back {figures['actor_back_after_s']:.1f} s "
                 "after its restart")

        # ---- the replay ----------------------------------------------------------------------------------------
        dropped0 = cluster.value("actor-0", "transitions_dropped_total")
        blocked0 = cluster.value("actor-1", "send_blocked_seconds_total")
        killed = cluster.kill("replay-0")
        figures["replay_down_after_s"] = _wait_down(cluster, "replay-0", killed)
        _rises(cluster, "actor-0", "env_steps_total", 30, "actor-0 (drop mode) to keep acting while the replay is away")
        cluster.wait(lambda: cluster.value("actor-0", "transitions_dropped_total") > dropped0
                     and cluster.value("actor-1", "send_blocked_seconds_total") > blocked0, 30,
                     "the actors to count drops (actor-0) and blocked seconds (actor-1) while the replay is away",
                     alive=[n for n in EVERYONE if n != "replay-0"])
        figures["outage_actor0_dropped"] = cluster.value("actor-0", "transitions_dropped_total") - dropped0
        figures["outage_actor1_blocked_s"] = cluster.value("actor-1", "send_blocked_seconds_total") - blocked0
        time.sleep(max(0.0, outage - (time.monotonic() - killed)))
        if not all(cluster.is_up(n) for n in ("actor-0", "actor-1", "learner-0")):
            raise ClusterError("an actor or the learner went silent while the replay was away")
        saved = _replay_checkpoint_size(cluster.workdir / "replay")
        restarted = time.monotonic()
        updates0 = cluster.value("learner-0", "updates_total")
        cluster.start("replay-0")
        cluster.wait(lambda: "restored" in cluster.log_text("replay-0").rpartition("===== start")[2], 60,
                     "the replay to restore its checkpoint", alive=list(EVERYONE))
        restored = int(re.findall(r"restored (\d+) transitions", cluster.log_text("replay-0"))[-1])
        if restored != saved:
            raise ClusterError(f"the replay restored {restored} transitions, its last checkpoint held {saved}")
        figures["replay_restored_transitions"] = restored
        cluster.wait(lambda: cluster.value("replay-0", "transitions_received_total") > 0, 60,
                     "the actors to reconnect to the restarted replay", alive=list(EVERYONE))
        figures["replay_inserts_after_s"] = time.monotonic() - restarted
        cluster.wait(lambda: cluster.value("learner-0", "updates_total") > updates0 + 5, 90,
                     "the learner to train again on the restarted replay", alive=list(EVERYONE))
        figures["replay_updates_after_s"] = time.monotonic() - restarted
        progress(f"replay: down after {figures['replay_down_after_s']:.1f} s, {restored} transitions restored, "
                 f"inserts {figures['replay_inserts_after_s']:.1f} s and updates "
                 f"{figures['replay_updates_after_s']:.1f} s after its restart")

        # ---- the learner ---------------------------------------------------------------------------------------
        stale0 = sum(cluster.value(a, "weights_stale_total") for a in ACTORS)
        killed = cluster.kill("learner-0")
        last_published = watcher.newest(before=killed)
        figures["learner_down_after_s"] = _wait_down(cluster, "learner-0", killed)
        for actor in ACTORS:
            _rises(cluster, actor, "env_steps_total", 30, f"{actor} to keep acting while the learner is away")
        time.sleep(max(0.0, outage - (time.monotonic() - killed)))
        restarted = time.monotonic()
        cluster.start("learner-0", RESUME="true")
        first = cluster.wait(lambda: watcher.first(restarted), 90, "the resumed learner to publish weights",
                             alive=list(EVERYONE))
        figures["learner_first_version_after_s"] = first[0] - restarted
        figures["learner_last_version_before_kill"] = last_published
        figures["learner_first_version_after_resume"] = first[1]
        if first[1] <= last_published:
            raise ClusterError(f"the resumed learner published version {first[1]}, not above the last published "
                               f"{last_published}: actors would refuse it as stale")
        cluster.wait(lambda: all(cluster.value(a, "weight_version") >= first[1] for a in ACTORS), 60,
                     "the actors to act with the resumed learner's weights", alive=list(EVERYONE))
        figures["learner_actors_updated_after_s"] = time.monotonic() - restarted
        stale = sum(cluster.value(a, "weights_stale_total") for a in ACTORS) - stale0
        if stale:
            raise ClusterError(f"the actors refused {stale:.0f} weight messages of the resumed learner as stale")
        progress(f"learner: down after {figures['learner_down_after_s']:.1f} s, resumed at version {first[1]} "
                 f"(last published {last_published}), actors updated {figures['learner_actors_updated_after_s']:.1f} "
                 "s after its restart")

        # ---- the gateway ---------------------------------------------------------------------------------------
        killed = cluster.kill("gateway-0")
        time.sleep(outage)
        during = watcher.newest(since=killed + 1.0)
        if during <= watcher.newest(before=killed):
            raise ClusterError("no new weights while the gateway was away: the data path stopped with it")
        figures["gateway_outage_new_versions"] = float(during - watcher.newest(before=killed))
        restarted = time.monotonic()
        cluster.start("gateway-0")
        cluster.wait(lambda: all(cluster.is_up(n) for n in EVERYONE if n != "gateway-0"), 60,
                     "every instance to report to the restarted gateway", alive=list(EVERYONE))
        figures["gateway_all_up_after_s"] = time.monotonic() - restarted
        cluster.wait(lambda: sorted(cluster.value(a, "lease_index", -1) for a in ACTORS) == [0.0, 1.0]
                     and all(cluster.value(a, "lease_slots") == 2 for a in ACTORS), 60,
                     "the actors to hold leases 0 and 1 of 2 from the restarted gateway", alive=list(EVERYONE))
        figures["gateway_leases_after_s"] = time.monotonic() - restarted
        progress(f"gateway: every instance up {figures['gateway_all_up_after_s']:.1f} s after its restart, "
                 f"leases {figures['gateway_leases_after_s']:.1f} s")
        cluster.check_alive()
        return figures
    finally:
        watcher.close()
