"""Vectorised n-step returns over a vector of environments, with Ape-X initial priorities."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flywheel import proto


@dataclass
class Emitted(proto.Transition[np.ndarray]):
    """Transitions ready to send (one row each), with their initial priorities."""

    priority: np.ndarray = field(metadata={"dtype": "float32"})
    # env slot of each row (rows of one slot come in step order)
    stream: np.ndarray | None = field(default=None, metadata={"dtype": "int64"})


class NStepAccumulator:
    """Keeps the last steps of every environment and emits n-step transitions.

    ``push`` takes one vector step. An entry matures when it has n rewards (its own and n - 1 newer)
    or its episode ends.
    Matured entries whose bootstrap state is the *next* observation to be acted on wait in a
    pending list until ``finish`` is given max-Q of those observations (computed by the next batched
    forward pass anyway), so priorities cost no extra inference.
    """

    def __init__(self, num_envs: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype | str,
                 n: int, gamma: float, stream_base: int = 0) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        size = n
        self.num_envs, self.size, self.gamma = num_envs, size, gamma
        self.stream_base = stream_base
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype)
        # The last ``size`` observation batches, by reference: push takes ownership (no copy of frame stacks).
        self.obs_w: list[np.ndarray | None] = [None] * size
        self.act_w = np.zeros((size, num_envs), dtype=np.int64)
        self.rew_w = np.zeros((size, num_envs), dtype=np.float64)
        self.qsa_w = np.zeros((size, num_envs), dtype=np.float64)
        self.filled = np.zeros(num_envs, dtype=np.int64)  # steps of each env not yet emitted, newest first
        self.all_full = False  # every env has n - 1 steps waiting: the steady state's fast path applies next push
        self._envs = np.arange(num_envs)
        self._streams = (self._envs + stream_base).astype(np.int64)
        self.n = n
        self._discount_n = np.full(num_envs, gamma**n, dtype=np.float32)
        self.t = 0
        self.pending: Emitted | None = None
        self.pending_env: np.ndarray = np.zeros(0, dtype=np.int64)
        self.pending_base: np.ndarray = np.zeros(0)

    def push(self, obs: np.ndarray, action: np.ndarray, q_sa: np.ndarray, reward: np.ndarray,
             terminated: np.ndarray, truncated: np.ndarray, next_obs: np.ndarray,
             final_max_q: np.ndarray | None = None) -> Emitted | None:
        """Record one step of every env; return transitions whose priority is already known.

        ``next_obs`` holds, for envs whose episode ended, the final observation (not the reset one).
        ``final_max_q`` holds max-Q of ``next_obs`` for truncated envs (needed to bootstrap them).
        ``obs`` and ``next_obs`` are kept by reference and may be emitted as they are: the caller
        must not modify them afterwards (give each step fresh arrays).
        """
        slot = self.t % self.size
        self.obs_w[slot] = obs
        self.act_w[slot] = action
        self.rew_w[slot] = reward
        self.qsa_w[slot] = q_sa
        done = terminated | truncated
        if self.all_full and not done.any():
            self._push_steady(slot, next_obs)
            return None
        self.filled += 1
        depth = int(self.filled.max())
        ages = np.arange(depth)[:, None]
        emit = (ages < self.filled[None, :]) & (done[None, :] | (ages >= self.n - 1))
        if not emit.any():
            self.all_full = bool((self.filled == self.n - 1).all())
            self.t += 1
            return None
        slots_by_age = (self.t - np.arange(depth)) % self.size
        returns = self._returns(slots_by_age, self._envs)
        # Env-major, oldest step first: the rows of each env (stream) leave in step order.
        env_idx, newer = np.nonzero(emit[::-1].T)
        age_idx = depth - 1 - newer
        slots = slots_by_age[age_idx]
        discount = self.gamma ** (age_idx + 1) * (1.0 - terminated[env_idx])
        # One row per env, all of one age (the steady state): no copies.
        every_env_once = (not done.any() and len(env_idx) == self.num_envs and bool((env_idx == self._envs).all())
                          and bool((age_idx == age_idx[0]).all()))
        rows = Emitted(
            obs=self.obs_w[int(slots[0])] if every_env_once else self._gather(slots, env_idx),  # type: ignore[arg-type]
            action=self.act_w[slots, env_idx],
            reward=returns[age_idx, env_idx].astype(np.float32),
            discount=discount.astype(np.float32),
            next_obs=np.asarray(next_obs) if every_env_once else np.asarray(next_obs)[env_idx],
            priority=np.zeros(len(env_idx), dtype=np.float32),
            stream=(env_idx + self.stream_base).astype(np.int64),
        )
        base = rows.reward - self.qsa_w[slots, env_idx]
        np.minimum(self.filled, self.n - 1, out=self.filled)
        self.filled[done] = 0
        self.all_full = bool((self.filled == self.n - 1).all())
        self.t += 1
        # Terminated rows need no bootstrap; truncated rows bootstrap from their final observation.
        ready = done[env_idx]
        if truncated.any():
            if final_max_q is None:
                raise ValueError("final_max_q is required when an episode is truncated")
            boot = np.where(truncated[env_idx], final_max_q[env_idx], 0.0)
        else:
            boot = np.zeros(len(env_idx))
        rows.priority[:] = np.abs(base + rows.discount * boot)
        waiting = ~ready
        if waiting.any():
            self.pending = _take(rows, waiting)
            self.pending_env = env_idx[waiting]
            self.pending_base = base[waiting]
        return _take(rows, ready) if ready.any() else None

    def _push_steady(self, slot: int, next_obs: np.ndarray) -> None:
        """No episode ended and every env has n - 1 steps waiting: each env's oldest matures; nothing is copied."""
        oldest = (self.t - self.n + 1) % self.size
        ret = self.rew_w[slot].copy()
        for j in range(1, self.n):
            ret = self.rew_w[(self.t - j) % self.size] + self.gamma * ret
        obs = self.obs_w[oldest]
        assert obs is not None
        rows = Emitted(obs=obs, action=self.act_w[oldest].copy(), reward=ret.astype(np.float32),
                       discount=self._discount_n, next_obs=np.asarray(next_obs),
                       priority=np.zeros(self.num_envs, dtype=np.float32), stream=self._streams)
        self.pending = rows
        self.pending_env = self._envs
        self.pending_base = rows.reward - self.qsa_w[oldest]
        self.t += 1

    def _returns(self, slots_by_age: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """(age, env) returns of ``envs``' entries: G_j = r(age j) + gamma * G_{j-1}, G_0 = r(age 0)."""
        returns = np.empty((len(slots_by_age), len(envs)))
        returns[0] = self.rew_w[slots_by_age[0], envs]
        for j in range(1, len(slots_by_age)):
            returns[j] = self.rew_w[slots_by_age[j], envs] + self.gamma * returns[j - 1]
        return returns

    def _gather(self, slots: np.ndarray, env_idx: np.ndarray) -> np.ndarray:
        """Observations of (slot, env) pairs, copied out of the referenced batches."""
        out = np.empty((len(env_idx), *self.obs_shape), dtype=self.obs_dtype)
        for slot in np.unique(slots):
            rows = slots == slot
            batch = self.obs_w[int(slot)]
            assert batch is not None
            out[rows] = batch[env_idx[rows]]
        return out

    def cut(self, explored: np.ndarray, obs: np.ndarray, max_q: np.ndarray) -> Emitted | None:
        """End the returns of envs whose next action is exploratory (``explored``): their waiting entries leave now,
        bootstrapped from ``obs``, the observations about to be acted on, with ``max_q`` of them (Watkins's Q(lambda)
        cut: a return never runs through a random action, so its target is the greedy policy's). Call it after
        ``finish`` and before the ``push`` of the step that takes those actions."""
        envs = np.flatnonzero(explored & (self.filled > 0))
        if not len(envs):
            return None
        depth = int(self.filled[envs].max())
        newest = self.t - 1  # the step of age 0: the last one pushed
        slots_by_age = (newest - np.arange(depth)) % self.size
        returns = self._returns(slots_by_age, envs)
        take = np.arange(depth)[:, None] < self.filled[envs][None, :]  # (age, env) pairs that are waiting
        pos, older = np.nonzero(take[::-1].T)  # env-major, oldest step first
        age_idx = depth - 1 - older
        env_idx, slots = envs[pos], slots_by_age[age_idx]
        rows = Emitted(obs=self._gather(slots, env_idx), action=self.act_w[slots, env_idx],
                       reward=returns[age_idx, pos].astype(np.float32),
                       discount=(self.gamma ** (age_idx + 1)).astype(np.float32),
                       next_obs=np.asarray(obs)[env_idx], priority=np.zeros(len(env_idx), dtype=np.float32),
                       stream=(env_idx + self.stream_base).astype(np.int64))
        rows.priority[:] = np.abs(rows.reward - self.qsa_w[slots, env_idx] + rows.discount * max_q[env_idx])
        self.filled[envs] = 0
        self.all_full = False
        return rows

    def finish(self, max_q: np.ndarray) -> Emitted | None:
        """Complete pending rows with max-Q of the observations each env is about to act on."""
        if self.pending is None:
            return None
        rows, self.pending = self.pending, None
        rows.priority[:] = np.abs(self.pending_base + rows.discount * max_q[self.pending_env])
        return rows


def _take(rows: Emitted, mask: np.ndarray) -> Emitted:
    return rows if mask.all() else rows.select(mask)  # the common case (no episode ended): no copy
