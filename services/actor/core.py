"""The acting core: a vector of environments, batched epsilon-greedy inference, n-step output; no sockets."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from flywheel.envs import make_env
from flywheel.nets import QNetwork

from .nstep import Emitted, NStepAccumulator


@dataclass
class EpisodeStats:
    """Rolling episode figures reported as telemetry."""

    returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    lengths: deque[int] = field(default_factory=lambda: deque(maxlen=100))
    distances: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    flags: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    eval_returns: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    episodes: int = 0
    eval_episodes: int = 0


class ActorCore:
    """Steps ``num_envs`` environments (plus an optional greedy evaluation env) with one network."""

    def __init__(self, env_id: str, num_envs: int, net: QNetwork, *, n_step: int, gamma: float,
                 eval_envs: int = 0, seed: int | None = None) -> None:
        self.envs = [make_env(env_id, seed=None if seed is None else seed + i) for i in range(num_envs)]
        self.eval_env = make_env(env_id, seed=None if seed is None else seed + 10_000) if eval_envs else None
        self.net = net
        self.rng = np.random.default_rng(seed)
        self.n_actions = int(self.envs[0].action_space.n)
        self.obs = np.stack([env.reset(seed=None if seed is None else seed + i)[0]
                             for i, env in enumerate(self.envs)])
        self.eval_obs = self.eval_env.reset()[0] if self.eval_env is not None else None
        self.nstep = NStepAccumulator(num_envs, self.obs.shape[1:], self.obs.dtype, n_step, gamma)
        self.ep_return = np.zeros(num_envs)
        self.ep_length = np.zeros(num_envs, dtype=np.int64)
        self.eval_return = 0.0
        self.stats = EpisodeStats()
        self.epsilon = 0.4
        self.env_steps = 0

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def _q_values(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.net(torch.from_numpy(obs)).float().numpy()

    def step(self) -> list[Emitted]:
        """Advance every environment one step; return the transitions that became ready."""
        ready: list[Emitted] = []
        batch = self.obs if self.eval_obs is None else np.concatenate([self.obs, self.eval_obs[None]])
        q_all = self._q_values(batch)
        q = q_all[: self.num_envs]
        finished = self.nstep.finish(q.max(axis=1))
        if finished is not None:
            ready.append(finished)
        greedy = q.argmax(axis=1)
        explore = self.rng.random(self.num_envs) < self.epsilon
        actions = np.where(explore, self.rng.integers(0, self.n_actions, self.num_envs), greedy)
        q_sa = q[np.arange(self.num_envs), actions]
        next_obs = np.empty_like(self.obs)
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        final_obs = np.empty_like(self.obs)
        for i, env in enumerate(self.envs):
            obs, reward, term, trunc, info = env.step(int(actions[i]))
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            final_obs[i] = obs
            if term or trunc:
                self._end_episode(i, reward, info)
                obs, _ = env.reset()
            else:
                self.ep_return[i] += reward
                self.ep_length[i] += 1
            next_obs[i] = obs
        final_max_q = None
        if truncated.any():
            final_max_q = np.zeros(self.num_envs)
            rows = np.nonzero(truncated)[0]
            final_max_q[rows] = self._q_values(final_obs[rows]).max(axis=1)
        emitted = self.nstep.push(self.obs, actions, q_sa, rewards, terminated, truncated, final_obs, final_max_q)
        if emitted is not None:
            ready.append(emitted)
        self.obs = next_obs
        self.env_steps += self.num_envs
        if self.eval_env is not None:
            self._step_eval(int(q_all[-1].argmax()))
        return ready

    def _end_episode(self, i: int, reward: float, info: dict) -> None:
        stats = self.stats
        stats.returns.append(float(self.ep_return[i] + reward))
        stats.lengths.append(int(self.ep_length[i] + 1))
        if "x_pos" in info:
            stats.distances.append(float(info["x_pos"]))
            stats.flags.append(float(bool(info.get("flag_get", False))))
        stats.episodes += 1
        self.ep_return[i] = 0.0
        self.ep_length[i] = 0

    def _step_eval(self, action: int) -> None:
        assert self.eval_env is not None
        obs, reward, term, trunc, _ = self.eval_env.step(action)
        self.eval_return += float(reward)
        if term or trunc:
            self.stats.eval_returns.append(self.eval_return)
            self.stats.eval_episodes += 1
            self.eval_return = 0.0
            obs, _ = self.eval_env.reset()
        self.eval_obs = obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.eval_env is not None:
            self.eval_env.close()
