"""Actor start-up: the acting network and core the settings describe, and the rows each message carries."""

from __future__ import annotations

import math

import numpy as np

from flywheel.envs import EnvSpec, UnknownEnvironmentError, env_spec
from flywheel.settings import fail

from .core import ActorCore, build_core
from .policy import Policy, build_policy, resolve_backend
from .settings import ActorSettings
from .start_pools import StartPools
from .transport import auto_batch_rows


def acting_policy(settings: ActorSettings, spec: EnvSpec) -> Policy:
    """The acting network as the settings describe it, on one thread."""
    return build_policy(spec.obs_shape, spec.n_actions, **settings.network().model_dump(), backend=settings.inference,
                        threads=1, seed=settings.seed, freeze=settings.torch_freeze, obs_dtype=spec.obs_dtype)


def build_acting(settings: ActorSettings, pools: StartPools | None = None) -> tuple[ActorCore, EnvSpec]:
    """The network (one thread) and the acting core, its envs' start-state ``pools`` read when resuming; a bad env
    id or option stops the actor with one line."""
    try:
        spec = env_spec(settings.env_id)
        policy = acting_policy(settings, spec)
        core = build_core(settings.env_id, settings.num_envs, policy, n_step=settings.n_step,
                          gamma=settings.gamma, eval_envs=settings.eval_envs, seed=settings.seed,
                          vector_mode=settings.vector_mode, workers=settings.workers or None,
                          start_states=settings.start_states(),
                          load_pools=pools.load if pools is not None and settings.resume else None,
                          cut_at_exploration=settings.cut_at_exploration,
                          episode_noops_max=settings.episode_noops_max)
    except UnknownEnvironmentError:
        raise
    except (TypeError, ValueError, ImportError, RuntimeError) as exc:
        raise fail(f"flywheel actor: cannot build {settings.env_id!r} x {settings.num_envs} "
                   f"(--env-id / FLYWHEEL_ACTOR_ENV_ID, --num-envs): {exc}") from None
    return core, spec


def send_batch_rows(settings: ActorSettings, spec: EnvSpec) -> int:
    """Rows per transitions message: ``send_batch``, or as many as make a message worth its fixed cost."""
    row_bytes = 2 * math.prod(spec.obs_shape) * np.dtype(spec.obs_dtype).itemsize  # obs and next_obs
    return settings.send_batch or auto_batch_rows(settings.num_envs, row_bytes)


def describe(settings: ActorSettings, core: ActorCore, spec: EnvSpec, batch_rows: int) -> str:
    """The start-up log line."""
    return (f"actor {settings.instance}: {settings.num_envs} x {settings.env_id} ({core.policy.name}, "
            f"{resolve_backend(spec.obs_shape, settings.inference)} inference, {spec.n_actions} actions, "
            f"{settings.vector_mode}, {len(core.groups)} slot group(s)), epsilon up to {core.epsilon:.4f}, sending "
            f"{batch_rows} rows a message to {settings.transitions_endpoint}")
