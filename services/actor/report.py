"""The actor's telemetry: the counters and gauges of one report, from its core and its sockets' counts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from flywheel.metrics_spec import ActorCounters, ActorGauges

from .core import ActorCore, EpisodeStats
from .transport import LeaseClient, TransitionSender, WeightsReceiver


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0


@dataclass
class StepRate:
    """Env steps per second over windows of at least ``window_s`` (a blocked actor advances in bursts)."""

    since: float
    steps: float = 0.0
    per_s: float = 0.0
    window_s: float = 5.0

    def update(self, steps: float, now: float) -> float:
        if now - self.since >= self.window_s:
            self.per_s = (steps - self.steps) / (now - self.since)
            self.since, self.steps = now, steps
        return self.per_s


def actor_report(core: ActorCore, sender: TransitionSender, weights: WeightsReceiver, lease: LeaseClient, *,
                 paused: bool, rate: StepRate, now: float) -> tuple[ActorCounters, ActorGauges]:
    """Counters and gauges of one report (the loop adds what its other parts count)."""
    stats = core.stats
    gauges = ActorGauges(
        epsilon=core.epsilon, epsilon_min=float(core.epsilons.min()), epsilon_max=float(core.epsilons.max()),
        exploration_slots=core.slots, weight_version=weights.version, weight_version_newest=weights.newest_seen,
        policy_lag_versions=weights.lag, weight_age_seconds=now - weights.updated_at,
        env_steps_per_second=rate.update(core.env_steps, now), episode_return_mean=_mean(stats.returns),
        episode_length_mean=_mean(stats.lengths), lease_index=lease.index, lease_slots=lease.count,
        paused=float(paused), send_blocked_seconds=sender.blocked_s, num_envs=core.num_envs,
        slot_groups=len(core.groups), n_step=core.n_step, **episode_gauges(stats, core.start_states is not None),
        start_state_death_point_mean=_mean(core.deaths.points) if core.deaths is not None and core.deaths.points
        else None,
    )
    times = core.times
    counters = ActorCounters(
        env_steps_total=core.env_steps, episodes_total=stats.episodes, eval_episodes_total=stats.eval_episodes,
        transitions_sent_total=sender.sent, transitions_dropped_total=sender.dropped,
        weights_received_total=weights.received, weights_rejected_total=weights.rejected,
        weights_stale_total=weights.stale, messages_rejected_total=weights.faults.total,
        send_seconds_total=sender.send_s, send_blocked_seconds_total=sender.blocked_s,
        send_reconnects_total=sender.reconnects, weights_load_seconds_total=weights.load_s,
        env_seconds_total=times.env, inference_seconds_total=times.inference, bookkeeping_seconds_total=times.other,
        restarted_episodes_total=stats.restarts.episodes if core.start_states is not None else None,
    )
    return counters, gauges


def episode_gauges(stats: EpisodeStats, curriculum: bool) -> dict[str, float]:
    """The optional episode gauges that have a value: the last return, the env's measures (flywheel.envs.measures)
    of level-start episodes, the greedy episodes' returns and, with the start-state curriculum on (``curriculum``),
    the restarted episodes' figures apart."""
    out: dict[str, float] = {}
    if stats.returns:
        out["episode_return_last"] = stats.returns[-1]
    if stats.measured.progress:
        out["episode_progress_mean"] = _mean(stats.measured.progress)
        out["episode_progress_max"] = max(stats.measured.progress)
    if stats.measured.successes:
        out["episode_success_rate"] = _mean(stats.measured.successes)
    if stats.eval_returns:
        out["eval_return_mean"] = _mean(stats.eval_returns)
        out["eval_return_last"] = stats.eval_returns[-1]
    restarts = stats.restarts
    if curriculum:
        out["start_state_share_actual"] = _mean(restarts.recent)
        out["start_states_kept"] = sum(restarts.states_kept.values())
        if restarts.returns:
            out["restarted_return_mean"] = _mean(restarts.returns)
            out["start_state_progress_mean"] = _mean(restarts.start_progress)
        if restarts.measured.progress:
            out["restarted_progress_mean"] = _mean(restarts.measured.progress)
        if restarts.measured.successes:
            out["restarted_success_rate"] = _mean(restarts.measured.successes)
    return out
