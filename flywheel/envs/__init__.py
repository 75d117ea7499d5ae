"""Environments by id: Super Mario Bros, Atari (ale-py), Snake, MettaGrid and any Gymnasium id, single or as vectors.

An id may carry options after ``?``, e.g. ``SuperMarioBros-1-1-v0?actions=right_only`` or
``ALE/Breakout-v5?clip_rewards=false,repeat_action_probability=0``: every service derives the
same observation shape and action count from the same id string. Gymnasium's ``module:EnvId`` form,
e.g. ``flywheel.examples.corridor:Corridor-v0``, imports the module (which registers the id) in
whichever process resolves the id first.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium
import numpy as np

from flywheel.envs import nes_compat
from flywheel.envs.atari import EVALUATION_OPTIONS as ATARI_EVALUATION_OPTIONS
from flywheel.envs.atari import AtariConfig, atari_env_ids, is_atari_id, register_ale
from flywheel.envs.mario import MarioConfig, MarioEnv
from flywheel.envs.mario_ids import mario_env_ids, parse_mario_id
from flywheel.envs.measures import Measures, measures_of
from flywheel.envs.metta import METTAGRID_IDS, is_mettagrid_id
from flywheel.envs.snake import SNAKE_IDS, SnakeConfig, SnakeEnv, SnakeVector, register_snake
from flywheel.envs.spaces import action_count, observation_shape
from flywheel.envs.start_states import StartStateConfig, StartStateCurriculum, StartStatesUnsupported
from flywheel.envs.vector import EpisodeEnd, InProcessVector, VectorEnv, VectorStep
from flywheel.extras import MissingExtra

__all__ = [
    "EnvModuleError",
    "EnvSpec",
    "EpisodeEnd",
    "Measures",
    "StartStateConfig",
    "StartStatesUnsupported",
    "UnknownEnvironmentError",
    "VectorEnv",
    "VectorStep",
    "action_count",
    "env_family",
    "env_spec",
    "evaluation_env_id",
    "known_env_ids",
    "observation_shape",
    "make_env",
    "make_vector_env",
    "measures_of",
    "split_env_id",
    "start_states_refusal",
]

Family = Literal["mario", "atari", "snake", "mettagrid", "gymnasium"]
_EXAMPLE_IDS = ("CartPole-v1", "SuperMarioBros-1-1-v0", "ALE/Pong-v5", "Snake-v0", "MettaGrid-v0")

register_snake()


class UnknownEnvironmentError(ValueError):
    """Raised for an env id that no family (Mario, Atari, Snake, MettaGrid, Gymnasium) knows."""

    def __init__(self, env_id: str, module: str | None = None) -> None:
        """Build a one-line message with suggestions and the accepted id families."""
        self.env_id = env_id
        close = difflib.get_close_matches(env_id, known_env_ids(), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        where = f" (module {module!r} was imported but registered no such id)" if module else ""
        super().__init__(
            f"unknown environment id {env_id!r}{where}{hint}; known: {', '.join(_EXAMPLE_IDS)}, ... "
            "(every gym-super-mario-bros id SuperMarioBros[-W-S]-vN / SuperMarioBrosRandomStages-vN / "
            "SuperMarioBros2-vN, every ale-py id ALE/<Game>-v5 / <Game>NoFrameskip-v4, Snake-v0, "
            f"{' / '.join(METTAGRID_IDS)}, any registered Gymnasium id); list them with "
            "flywheel.envs.known_env_ids()"
        )


class EnvModuleError(UnknownEnvironmentError):
    """Raised when the module of a ``module:EnvId`` id cannot be imported (one line naming it and the cause)."""

    def __init__(self, env_id: str, message: str) -> None:
        """Keep the id; the message is the whole one-line error."""
        self.env_id = env_id
        ValueError.__init__(self, message)


def split_env_module(base: str) -> tuple[str | None, str]:
    """Split Gymnasium's ``"module:EnvId"`` into the module to import and the id (no ``:``: no module)."""
    module, sep, name = base.partition(":")
    if not sep:
        return None, base
    if not module.strip() or not name.strip():
        raise EnvModuleError(base, f"environment id {base!r} must look like module:EnvId, "
                                   "e.g. flywheel.examples.corridor:Corridor-v0")
    return module.strip(), name.strip()


def _import_env_module(base: str) -> str:
    """Import the module of ``module:EnvId`` (it registers the id) and return the bare id; else return ``base``."""
    module, name = split_env_module(base)
    if module is not None:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any failure while importing someone else's module is one clear line
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise EnvModuleError(base, f"cannot import module {module!r} for environment id {base!r}: "
                                       f"{type(exc).__name__}{': ' + detail if detail else ''}") from None
    return name


@dataclass(frozen=True)
class EnvSpec:
    """Static description of an env's observations and actions as seen by the learner.

    ``agents`` is how many env slots one simulation fills (MettaGrid: its agents; else 1); ``measures`` the labels
    of the progress and success measures the env declares (flywheel.envs.measures).
    """

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int
    agents: int = 1
    measures: Measures = Measures()


def known_env_ids() -> list[str]:
    """Every accepted id (without options): Mario, Snake, MettaGrid, then the Gymnasium registry with ale-py's
    (when the atari extra is installed)."""
    atari_env_ids()  # registers ale-py's ids, if it is there
    ours = mario_env_ids() + list(SNAKE_IDS) + list(METTAGRID_IDS)
    return ours + sorted(set(gymnasium.registry) - set(ours))


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def split_env_id(env_id: str) -> tuple[str, dict[str, Any]]:
    """Split ``"ID?name=value,name=value"`` into the id and its options (values read as JSON, else strings)."""
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a str, got {type(env_id).__name__}")
    base, _, query = env_id.partition("?")
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in query.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"bad option {item!r} in environment id {env_id!r}; expected name=value")
        options[name.strip()] = _option_value(value.strip())
    return base, options


def env_family(env_id: str) -> Family:
    """Which family builds ``env_id`` (options after ``?`` ignored); raise UnknownEnvironmentError if none.

    A ``module:EnvId`` id imports its module first (EnvModuleError if that fails), then is judged by ``EnvId``.
    """
    full, _ = split_env_id(env_id)
    base = _import_env_module(full)
    module = split_env_module(full)[0]
    if parse_mario_id(base) is not None:
        nes_compat.require_installed()  # the mario extra (a metadata lookup, no import)
        return "mario"
    if base in SNAKE_IDS:
        return "snake"
    if is_mettagrid_id(base):
        return "mettagrid"
    if base not in gymnasium.registry:
        try:
            register_ale()
        except MissingExtra:
            if base.startswith("ALE/") or "NoFrameskip" in base:  # an Atari id: the atari extra is missing
                raise
            raise UnknownEnvironmentError(base, module) from None
    if base in gymnasium.registry:
        return "atari" if is_atari_id(base) else "gymnasium"
    raise UnknownEnvironmentError(base, module)


def evaluation_env_id(env_id: str) -> str:
    """The id evaluation plays for a training id: Atari as whole games with the game's own score, Mario without
    its training-only cut-off.

    For an Atari id the options after ``?`` get ``terminal_on_life_loss=false,clip_rewards=false`` (whatever the
    id said: the same observations and actions, scored as a game); a Mario id loses ``stall_steps`` (an episode
    ends at death, the flag, the level clock or the step cap); every other id is returned unchanged.
    flywheel.evaluation (the bench suites, the learner's best-policy evaluations), actor-0's greedy env and
    ``flywheel play`` use it, so training and evaluation differ only there.
    """
    full, options = split_env_id(env_id)
    family = env_family(full)
    if family == "atari":
        options.update(ATARI_EVALUATION_OPTIONS)
    elif family != "mario" or options.pop("stall_steps", None) is None:
        return env_id
    if not options:
        return full
    return full + "?" + ",".join(f"{name}={json.dumps(value)}" for name, value in options.items())


def _resolve(env_id: str, options: dict[str, Any]) -> tuple[str, Family, dict[str, Any]]:
    """The bare id (a ``module:`` prefix imported and dropped), its family and the merged options."""
    full, from_id = split_env_id(env_id)
    family = env_family(full)
    return split_env_module(full)[1], family, {**from_id, **options}


def make_env(env_id: str, seed: int | None = None, **options: Any) -> gymnasium.Env[np.ndarray, Any]:
    """Build one env for ``env_id``; ``seed`` seeds its first reset and action space.

    Options (also accepted after ``?`` in the id): Mario — actions ("simple" | "right_only" |
    "complex"), frame_skip, stack, size, max_episode_steps, stages; Atari — see AtariConfig;
    Snake — see SnakeConfig; Gymnasium ids — passed to ``gymnasium.make``. MettaGrid is
    multi-agent: use :func:`make_vector_env`.
    """
    base, family, options = _resolve(env_id, options)
    env: gymnasium.Env[np.ndarray, Any]
    if family == "mario":
        env = MarioEnv(base, **options)
    elif family == "atari":
        from flywheel.envs.atari import AtariEnv

        env = AtariEnv(base, **options)
    elif family == "snake":
        env = SnakeEnv(**options)
    elif family == "mettagrid":
        raise ValueError(f"{base} is multi-agent: build it with flywheel.envs.make_vector_env (agents become slots)")
    else:
        from flywheel.envs.gym_envs import make_gymnasium_env

        env = make_gymnasium_env(base, **options)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def _start_states_refusal(base: str, family: Family) -> str | None:
    if family in ("snake", "mettagrid"):
        return "a natively vectorised env without state snapshots"
    mario = parse_mario_id(base) if family == "mario" else None
    if mario is not None and mario.target is None:
        return "only single-stage ids SuperMarioBros-W-S-vN, where x_pos is progress"
    return None


def start_states_refusal(env_id: str) -> str | None:
    """Why ``env_id`` cannot keep start states, known from the id alone; None where it may (the env itself is
    checked by :class:`StartStateCurriculum` when it wraps it). Mario's preset follows it (flywheel.presets)."""
    return _start_states_refusal(split_env_id(env_id)[0], env_family(env_id))


def _check_start_states(env_id: str, base: str, family: Family) -> None:
    """Refuse, before building anything, the ids that cannot keep start states."""
    why = _start_states_refusal(base, family)
    if why is not None:
        raise StartStatesUnsupported(env_id, why)


def make_vector_env(env_id: str, num_envs: int, seed: int | None = None, *,
                    mode: Literal["inprocess", "subprocess"] = "inprocess", workers: int | None = None,
                    groups: int = 2, slot_offset: int = 0,
                    start_states: StartStateConfig | dict[str, Any] | None = None, **options: Any) -> VectorEnv:
    """``num_envs`` slots of ``env_id`` with auto-reset; slot ``i`` is seeded with ``seed + i``.

    ``inprocess`` steps them in this process (Snake and MettaGrid natively vectorised, others one
    after another); ``subprocess`` spreads them over ``workers`` processes (default: the usable
    cores) sharing memory, double-buffered in ``groups`` halves. ``start_states`` with a share > 0 wraps each
    env in the start-state curriculum (training envs only; StartStatesUnsupported for an env that cannot).
    """
    base, family, options = _resolve(env_id, options)
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    curriculum = StartStateConfig.from_json(start_states) if start_states is not None else None
    if curriculum is not None and curriculum.share > 0:
        _check_start_states(env_id, base, family)
    else:
        curriculum = None
    if mode == "subprocess":
        from flywheel.envs.subproc import SubprocessVector

        base = split_env_id(env_id)[0]  # keep any module: prefix, so each worker imports the module too
        spec = env_spec(base, **options)
        count = workers if workers else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        worker_options = options if curriculum is None else {**options, "start_states": curriculum.to_json()}
        return SubprocessVector(base, num_envs, obs_shape=spec.obs_shape, obs_dtype=spec.obs_dtype,
                                n_actions=spec.n_actions, seed=seed, workers=count, groups=groups,
                                atom=spec.agents, options=worker_options, make_vector_env=make_vector_env)
    if mode != "inprocess":
        raise ValueError(f"vector mode must be 'inprocess' or 'subprocess', got {mode!r}")
    if family == "snake":
        return SnakeVector(num_envs, seed, slot_offset=slot_offset, **options)
    if family == "mettagrid":
        from flywheel.envs.metta import MettaGridVector

        return MettaGridVector(base, num_envs, seed, slot_offset=slot_offset, **options)
    seeds = [None if seed is None else seed + i for i in range(num_envs)]
    envs: list[gymnasium.Env[np.ndarray, Any]] = []
    try:
        for _ in range(num_envs):
            env = make_env(base, **options)
            envs.append(env)
            if curriculum is not None:
                envs[-1] = StartStateCurriculum(env, curriculum, env_id)
    except BaseException:
        for env in envs:
            env.close()
        raise
    return InProcessVector(envs, seeds, slot_offset=slot_offset)


_SPEC_CACHE: dict[tuple[str, tuple[tuple[str, Any], ...]], EnvSpec] = {}
_SPEC_LOCK = threading.Lock()


def _compute_spec(env_id: str, options: dict[str, Any]) -> EnvSpec:
    """Derive the spec, building (and closing) one env only for Gymnasium ids."""
    base, family, options = _resolve(env_id, options)
    if family == "mario":
        mario = MarioConfig.from_options(**options)
        return EnvSpec(env_id, mario.obs_shape, "uint8", mario.n_actions,
                       measures=Measures.from_metadata(MarioEnv.metadata))
    if family == "snake":
        return EnvSpec(env_id, SnakeConfig.from_options(**options).obs_shape, "uint8", 4,
                       measures=Measures.from_metadata(SnakeEnv.metadata))
    if family == "mettagrid":
        from flywheel.envs.metta import mettagrid_spec

        metta = mettagrid_spec(base, **options)
        return EnvSpec(env_id, metta.obs_shape, "uint8", metta.n_actions, metta.agents)
    if family == "atari":
        AtariConfig.from_options(**options)  # validate before building an emulator
    env = make_env(base, **options)
    try:
        space = env.observation_space
        return EnvSpec(env_id, observation_shape(space), np.dtype(space.dtype).name, action_count(env.action_space),
                       measures=measures_of(env))
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
