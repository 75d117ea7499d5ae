"""Environment factory: any registered Gymnasium id plus every gym-super-mario-bros id."""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from flywheel.envs.mario import MarioConfig, MarioEnv, mario_env_ids, parse_mario_id

__all__ = [
    "EnvSpec",
    "UnknownEnvironmentError",
    "env_spec",
    "known_env_ids",
    "make_env",
]

_EXAMPLE_IDS = ("CartPole-v1", "SuperMarioBros-1-1-v0", "SuperMarioBros-v0", "SuperMarioBrosRandomStages-v0")


class UnknownEnvironmentError(ValueError):
    """Raised for an env id that is neither a registered Gymnasium id nor a Mario id."""

    def __init__(self, env_id: str) -> None:
        """Build a one-line message with suggestions and the accepted id families."""
        self.env_id = env_id
        close = difflib.get_close_matches(env_id, known_env_ids(), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        super().__init__(
            f"unknown environment id {env_id!r}{hint}; known: {', '.join(_EXAMPLE_IDS)}, ... "
            "(any registered Gymnasium id, every gym-super-mario-bros id SuperMarioBros[-W-S]-vN / "
            "SuperMarioBrosRandomStages-vN / SuperMarioBros2-vN); list them with "
            "flywheel.envs.known_env_ids()"
        )


@dataclass(frozen=True)
class EnvSpec:
    """Static description of an env's observations and actions as seen by the learner."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int


def known_env_ids() -> list[str]:
    """Return every accepted id: Mario ids first, then the Gymnasium registry (sorted)."""
    return mario_env_ids() + sorted(gymnasium.registry)


def _check_known(env_id: str) -> bool:
    """Return True for a Mario id, False for a Gymnasium id; raise if neither."""
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a str, got {type(env_id).__name__}")
    if parse_mario_id(env_id) is not None:
        return True
    if env_id in gymnasium.registry:
        return False
    raise UnknownEnvironmentError(env_id)


def make_env(env_id: str, seed: int | None = None, **options: Any) -> gymnasium.Env[np.ndarray, Any]:
    """Build an env for ``env_id``; ``seed`` seeds its first reset and action space.

    Mario options: actions ("simple" | "right_only" | "complex"), frame_skip,
    stack, size, max_episode_steps, stages, render_mode.  Gymnasium options are
    passed to ``gymnasium.make``.
    """
    if _check_known(env_id):
        env: gymnasium.Env[np.ndarray, Any] = MarioEnv(env_id, **options)
    else:
        from flywheel.envs.gym_envs import make_gymnasium_env

        env = make_gymnasium_env(env_id, **options)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


_SPEC_CACHE: dict[tuple[str, tuple[tuple[str, Any], ...]], EnvSpec] = {}
_SPEC_LOCK = threading.Lock()


def _compute_spec(env_id: str, options: dict[str, Any]) -> EnvSpec:
    """Derive the spec, building (and closing) one env only for Gymnasium ids."""
    if _check_known(env_id):
        config = MarioConfig.from_options(**options)
        return EnvSpec(env_id, config.obs_shape, "uint8", config.n_actions)
    from flywheel.envs.gym_envs import make_gymnasium_env

    env = make_gymnasium_env(env_id, **options)
    try:
        space = env.observation_space
        return EnvSpec(env_id, tuple(int(d) for d in space.shape), np.dtype(space.dtype).name, int(env.action_space.n))
    finally:
        env.close()


def env_spec(env_id: str, **options: Any) -> EnvSpec:
    """Return the EnvSpec for ``env_id`` with ``options`` (cached per id and options)."""
    try:
        key = (env_id, tuple(sorted(options.items())))
        hash(key)
    except TypeError:  # unhashable option values: compute without caching
        return _compute_spec(env_id, options)
    with _SPEC_LOCK:
        cached = _SPEC_CACHE.get(key)
    if cached is None:
        cached = _compute_spec(env_id, options)
        with _SPEC_LOCK:
            _SPEC_CACHE[key] = cached
    return cached
