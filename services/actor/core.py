"""The acting core: a vector of environments, batched epsilon-greedy inference, n-step output; no sockets."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from flywheel.envs import EpisodeEnd, StartStateConfig, VectorEnv, make_vector_env
from flywheel.envs.vector import PROGRESS_METRIC, STATES_METRIC, SUCCESS_METRIC

from .deaths import DeathPoints
from .nstep import Emitted, NStepAccumulator
from .policy import Policy

log = logging.getLogger(__name__)


@dataclass
class Measured:
    """The env's measures (flywheel.envs.measures) of the last 100 episodes that report them: each episode's
    furthest progress, and whether it reached the goal (1.0 or 0.0)."""

    progress: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    successes: deque[float] = field(default_factory=lambda: deque(maxlen=100))

    def record(self, episode: EpisodeEnd) -> None:
        """Keep the episode's measures (an env without them adds nothing)."""
        if PROGRESS_METRIC in episode.metrics:
            self.progress.append(episode.metrics[PROGRESS_METRIC])
        if SUCCESS_METRIC in episode.metrics:
            self.successes.append(episode.metrics[SUCCESS_METRIC])


@dataclass
class RestartStats:
    """Training episodes that began at a kept start state (flywheel.envs.start_states), apart from the rest."""

    episodes: int = 0
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    measured: Measured = field(default_factory=Measured)
    start_progress: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=100))  # restarted or not, every episode
    states_kept: dict[int, float] = field(default_factory=dict)  # per env slot, as its last episode reported

    def record(self, episode: EpisodeEnd) -> None:
        """Note one finished training episode (restarted or not)."""
        self.recent.append(episode.restarted)
        if STATES_METRIC in episode.metrics:
            self.states_kept[episode.slot] = episode.metrics[STATES_METRIC]
        if episode.restarted:
            self.episodes += 1
            self.returns.append(episode.ret)
            self.measured.record(episode)
            self.start_progress.append(episode.start_progress)


@dataclass
class EpisodeStats:
    """Rolling episode figures reported as telemetry: level-start episodes only (restarted ones in ``restarts``)."""

    returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    lengths: deque[int] = field(default_factory=lambda: deque(maxlen=100))
    measured: Measured = field(default_factory=Measured)
    eval_returns: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    episodes: int = 0
    eval_episodes: int = 0
    restarts: RestartStats = field(default_factory=RestartStats)

    def record(self, episode: EpisodeEnd) -> None:
        """Add one finished training episode (one that began at a kept start state goes to ``restarts`` only)."""
        self.restarts.record(episode)
        if episode.restarted:
            return
        self.returns.append(episode.ret)
        self.lengths.append(episode.length)
        self.measured.record(episode)
        self.episodes += 1


@dataclass
class TimeSplit:
    """Seconds the actor spent in each part of its loop (cumulative)."""

    env: float = 0.0  # stepping environments, or waiting for the workers that step them
    inference: float = 0.0  # the batched forward passes
    other: float = 0.0  # n-step returns, priorities, epsilon-greedy choice, copies


class ActorCore:
    """Steps a :class:`VectorEnv` with one policy (its Q-network), one slot group per call.

    With a double-buffered (subprocess) vector, group B's forward pass runs while the workers
    step group A. An optional greedy evaluation vector (epsilon 0, never sent) is stepped with
    group 0. Every emitted row carries its env slot in ``stream``; rows of one slot come in step
    order.
    """

    def __init__(self, vec: VectorEnv, policy: Policy, *, n_step: int, gamma: float,
                 eval_vec: VectorEnv | None = None, seed: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, start_states: StartStateConfig | None = None,
                 cut_at_exploration: bool = False, episode_noops_max: int = 0) -> None:
        self.clock = clock  # what the time split counts: wall time (telemetry) or thread CPU time (benchmarks)
        self.start_states = start_states  # the curriculum ``vec``'s envs run (None: off), for telemetry
        # its "deaths" choice: where this actor's evaluation-like episodes die, sent to the envs (actor/deaths.py)
        self.deaths = (DeathPoints(start_states.death_epsilon) if start_states is not None
                       and start_states.choice == "deaths" else None)
        self.vec = vec
        self.eval_vec = eval_vec
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        self.n_actions = vec.n_actions
        self.groups = vec.groups
        first = vec.reset()
        self.obs = [np.array(first[g.start:g.stop]) for g in self.groups]
        self.n_step = n_step  # n of the n-step returns emitted
        self.cut_at_exploration = cut_at_exploration  # returns end before an exploratory action (NStepAccumulator.cut)
        # no-op starts: each slot's episode begins with 0..episode_noops_max actions 0 (drawn per episode), as the
        # evaluation's do; they count as exploratory for the cut (None: off)
        self.episode_noops_max = episode_noops_max
        self.noops_left = (self.rng.integers(episode_noops_max + 1, size=self.groups[-1].stop) if episode_noops_max
                           else None)
        self.nstep = [NStepAccumulator(len(g), vec.obs_shape, vec.obs_dtype, n_step, gamma, stream_base=g.start)
                      for g in self.groups]
        self.actions = [np.zeros(len(g), dtype=np.int64) for g in self.groups]
        self.q_sa = [np.zeros(len(g)) for g in self.groups]
        self.in_flight = [False] * len(self.groups)
        self.eval_obs = eval_vec.reset() if eval_vec is not None else None
        self.stats = EpisodeStats()
        self.times = TimeSplit()
        self.epsilons = np.full(self.groups[-1].stop, 0.4)  # one exploration rate per env slot
        self.env_steps = 0
        self._next = 0

    @property
    def num_envs(self) -> int:
        return self.vec.num_envs

    @property
    def slots(self) -> int:
        """Env slots acted for, each with its own exploration rate."""
        return self.groups[-1].stop

    @property
    def epsilon(self) -> float:
        """The highest exploration rate among the slots (the only one when all are equal)."""
        return float(self.epsilons.max())

    @epsilon.setter
    def epsilon(self, value: float | np.ndarray) -> None:
        """Set one rate for every slot, or one rate per slot."""
        rates = np.asarray(value, dtype=np.float64)
        if rates.ndim and rates.shape != (self.slots,):
            raise ValueError(f"expected one epsilon or {self.slots}, got shape {rates.shape}")
        self.epsilons = np.broadcast_to(rates, (self.slots,)).copy()

    def _q_values(self, obs: np.ndarray) -> np.ndarray:
        start = self.clock()
        q = self.policy.q_values(obs)
        self.times.inference += self.clock() - start
        return q

    def step(self) -> list[Emitted]:
        """Advance one slot group one step; return the transitions that became ready."""
        start = self.clock()
        g = self._next
        self._next = (g + 1) % len(self.groups)
        ready: list[Emitted] = []
        env_s = 0.0
        infer_before = self.times.inference
        if self.in_flight[g]:
            env_s += self._collect(g, ready)
        n = len(self.obs[g])
        with_eval = g == 0 and self.eval_obs is not None
        batch = np.concatenate([self.obs[g], self.eval_obs]) if with_eval else self.obs[g]
        q_all = self._q_values(batch)
        q = q_all[:n]
        finished = self.nstep[g].finish(q.max(axis=1))
        if finished is not None:
            ready.append(finished)
        actions = q.argmax(axis=1)
        group = self.groups[g]
        explore = self.rng.random(n) < self.epsilons[group.start:group.stop]
        if explore.any():
            actions = np.where(explore, self.rng.integers(0, self.n_actions, n), actions)
        if self.noops_left is not None:
            left = self.noops_left[group.start:group.stop]  # a view: counted down in place
            forced = left > 0
            if forced.any():
                actions = np.where(forced, 0, actions)
                left[forced] -= 1
                explore = explore | forced
        if self.cut_at_exploration and explore.any():
            cut = self.nstep[g].cut(explore, self.obs[g], q.max(axis=1))
            if cut is not None:
                ready.append(cut)
        self.actions[g] = actions
        self.q_sa[g] = q[np.arange(n), actions]
        wait_start = self.clock()
        self.vec.step_async(g, actions)
        self.in_flight[g] = True
        if with_eval:
            self._step_eval(q_all[n:].argmax(axis=1))
        env_s += self.clock() - wait_start
        self.times.env += env_s
        self.times.other += self.clock() - start - env_s - (self.times.inference - infer_before)
        return ready

    def _collect(self, g: int, ready: list[Emitted]) -> float:
        """Wait for group ``g``'s step in flight and take its outcome (rows that became ready go to ``ready``);
        the seconds waited."""
        wait_start = self.clock()
        res = self.vec.step_wait(g)
        env_s = self.clock() - wait_start
        self.in_flight[g] = False
        final_max_q: np.ndarray | None = None
        if res.truncated.any():
            final_max_q = np.zeros(len(res.truncated))
            rows = np.flatnonzero(res.truncated)
            final_max_q[rows] = self._q_values(np.ascontiguousarray(res.final_obs[rows])).max(axis=1)
        next_obs, final_obs = res.obs, res.final_obs
        if self.vec.reuses_buffers:  # shared memory is rewritten next step: keep copies (the n-step window does)
            next_obs = np.array(res.obs)
            final_obs = np.array(res.final_obs) if (res.terminated | res.truncated).any() else next_obs
        emitted = self.nstep[g].push(self.obs[g], self.actions[g], self.q_sa[g], res.reward, res.terminated,
                                     res.truncated, final_obs, final_max_q)
        if emitted is not None:
            ready.append(emitted)
        self.obs[g] = next_obs  # a fresh array each step: the n-step window holds it by reference
        for episode in res.episodes:
            self.stats.record(episode)
            if self.deaths is not None and self.deaths.record(episode, float(self.epsilons[episode.slot])):
                if self.deaths.counted == self.deaths.every:
                    log.info("start states: the first %d death points sent to the envs", self.deaths.counted)
                self.vec.set_start_targets(list(self.deaths.points))
            if self.noops_left is not None:
                self.noops_left[episode.slot] = self.rng.integers(self.episode_noops_max + 1)
        self.env_steps += len(res.reward)
        return env_s

    def settle(self) -> list[Emitted]:
        """Take the outcome of every group in flight, so that nothing is (the next ``step`` of a group acts on it
        as usual): before the vector's start-state pools are saved. The rows that became ready."""
        ready: list[Emitted] = []
        for g, flying in enumerate(self.in_flight):
            if flying:
                self.times.env += self._collect(g, ready)
        return ready

    def _step_eval(self, actions: np.ndarray) -> None:
        assert self.eval_vec is not None
        res = self.eval_vec.step(actions)
        self.eval_obs = np.array(res.obs)
        for episode in res.episodes:
            self.stats.eval_returns.append(episode.ret)
            self.stats.eval_episodes += 1

    def close(self) -> None:
        self.vec.close()
        if self.eval_vec is not None:
            self.eval_vec.close()


def build_core(env_id: str, num_envs: int, policy: Policy, *, n_step: int, gamma: float,
               eval_envs: int = 0, seed: int | None = None,
               vector_mode: Literal["inprocess", "subprocess"] = "inprocess", workers: int | None = None,
               start_states: StartStateConfig | None = None,
               load_pools: Callable[[VectorEnv], object] | None = None, cut_at_exploration: bool = False,
               episode_noops_max: int = 0) -> ActorCore:
    """An ActorCore over ``num_envs`` slots of ``env_id``; ``eval_envs`` adds one greedy env (one simulation).

    ``start_states`` (the start-state curriculum) goes to the training envs only: the greedy env starts every
    episode at the level start. ``load_pools`` is given the training vector before its first reset (a resumed
    run's start-state pools).
    """
    vec = make_vector_env(env_id, num_envs, seed, mode=vector_mode, workers=workers, start_states=start_states)
    eval_vec = None
    try:
        if load_pools is not None:
            load_pools(vec)
        if eval_envs:  # evaluation settings (Atari: whole games, unclipped scores), same observations and actions
            from flywheel.envs import env_spec, evaluation_env_id

            eval_id = evaluation_env_id(env_id)
            eval_vec = make_vector_env(eval_id, env_spec(eval_id).agents, None if seed is None else seed + 10_000)
        return ActorCore(vec, policy, n_step=n_step, gamma=gamma, eval_vec=eval_vec, seed=seed,
                         start_states=start_states, cut_at_exploration=cut_at_exploration,
                         episode_noops_max=episode_noops_max)
    except BaseException:
        vec.close()
        if eval_vec is not None:
            eval_vec.close()
        raise
