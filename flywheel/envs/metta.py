"""MettaGrid (the ``mettagrid`` package): every agent of every simulation is one env slot sharing one policy.

Ids:
- ``MettaGrid-v0``: heart hunt. ``agents`` agents (default 4) on a ``size`` x ``size`` room with
  ``walls`` wall blocks and ``hearts`` heart sources (100 hearts each); walking into a source takes
  one heart, worth reward 1. Episodes are truncated after ``max_steps`` (default 500).
- ``MettaGrid-Arena-v0``: mettagrid's own arena (``mettagrid.builder.envs.make_arena``), 24 agents.

Observations are mettagrid's egocentric 13x13 token window made dense: ``uint8 (features, 13, 13)``,
one plane per observation feature (global tokens sit on the centre cell) plus a last plane that is
255 wherever any object is seen (many features are 0-valued yet present, e.g. agent id 0). Actions are the game's
primary actions (noop and four moves). ``mettagrid`` is an optional extra: ``pip install
'flywheel-rl[mettagrid]'``; it installs beside Super Mario Bros on NumPy 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from flywheel.envs.options import EnvOptions
from flywheel.envs.vector import EpisodeEnd, SyncVectorEnv, VectorStep

METTAGRID_IDS = ("MettaGrid-v0", "MettaGrid-Arena-v0")
_ID = re.compile(r"MettaGrid(-Arena)?-v0")
_PADDING, _GLOBAL = 0xFF, 0xFE


@dataclass(frozen=True)
class MettaConfig(EnvOptions):
    """Options of the MettaGrid ids (``size``, ``walls``, ``hearts`` apply to MettaGrid-v0 only)."""

    FAMILY: ClassVar[str] = "MettaGrid"

    agents: int | None = None  # default: 4 (v0) or 24 (Arena)
    size: int = 15
    walls: int = 10
    hearts: int = 6
    max_steps: int | None = None  # default: 500 (v0) or 1000 (Arena)

    @classmethod
    def from_options(cls, **options: Any) -> MettaConfig:
        """Build from keyword options, rejecting unknown names."""
        config = super().from_options(**options)
        if config.agents is not None and config.agents < 1:
            raise ValueError(f"MettaGrid option agents must be >= 1, got {config.agents!r}")
        if config.size < 5:
            raise ValueError(f"MettaGrid option size must be >= 5, got {config.size!r}")
        return config


def is_mettagrid_id(env_id: str) -> bool:
    """True for the ids this module builds."""
    return _ID.fullmatch(env_id) is not None


def _import() -> Any:
    try:
        import mettagrid
    except ImportError as exc:
        from flywheel.extras import MissingExtra

        raise MissingExtra("metta", "MettaGrid", exc) from exc
    return mettagrid


def build_config(env_id: str, **options: Any) -> Any:
    """The MettaGridConfig for ``env_id`` with ``options``."""
    if not is_mettagrid_id(env_id):
        raise ValueError(f"not a MettaGrid id: {env_id!r}")
    opts = MettaConfig.from_options(**options)
    _import()
    from mettagrid.builder.envs import make_arena, make_navigation

    if env_id == "MettaGrid-Arena-v0":
        cfg = make_arena(opts.agents or 24)
        cfg.game.max_steps = opts.max_steps or 1000
    else:
        from mettagrid.config.handler_config import Handler
        from mettagrid.config.mettagrid_config import GridObjectConfig, InventoryConfig
        from mettagrid.config.mutation.resource_mutation import withdraw
        from mettagrid.map_builder.random_map import RandomMapBuilderConfig

        agents = opts.agents or 4
        cfg = make_navigation(agents)
        cfg.game.objects["heart_source"] = GridObjectConfig(
            name="heart_source", inventory=InventoryConfig(initial={"heart": 100}),
            on_use_handler=Handler(mutations=[withdraw({"heart": 1})]),
        )
        cfg.game.map_builder = RandomMapBuilderConfig(
            agents=agents, width=opts.size, height=opts.size, border_width=1,
            objects={"heart_source": opts.hearts, "wall": opts.walls},
        )
        cfg.game.max_steps = opts.max_steps or 500
    cfg.game.episode_truncates = True  # the time limit is a truncation: n-step returns bootstrap through it
    return cfg.model_validate(cfg.model_dump())


@dataclass(frozen=True)
class MettaSpec:
    """Shapes of a MettaGrid id: agents per simulation, dense observation shape, number of actions."""

    agents: int
    obs_shape: tuple[int, int, int]
    n_actions: int


def mettagrid_spec(env_id: str, **options: Any) -> MettaSpec:
    """Shapes without building a simulation."""
    cfg = build_config(env_id, **options)
    from mettagrid.policy.policy_env_interface import PolicyEnvInterface

    pei = PolicyEnvInterface.from_mg_cfg(cfg)
    features = max((int(f.id) for f in pei.obs_features), default=0) + 1
    return MettaSpec(int(cfg.game.num_agents), (features + 1, int(pei.obs_height), int(pei.obs_width)),
                     len(pei.action_names))


class MettaGridVector(SyncVectorEnv):
    """``num_envs // agents`` simulations; slot ``k * agents + a`` is agent ``a`` of simulation ``k``.

    Simulation ``k`` starts from seed ``seed + k * agents`` and takes the next seed on every new
    episode. All agents of a simulation end their episode together (at the time limit).
    """

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None, slot_offset: int = 0,
                 **options: Any) -> None:
        """Build the simulations."""
        super().__init__()
        self.cfg = build_config(env_id, **options)
        self.spec = mettagrid_spec(env_id, **options)
        agents = self.spec.agents
        if num_envs < agents or num_envs % agents:
            raise ValueError(
                f"{env_id} has {agents} agents per simulation, so the number of env slots must be a multiple of "
                f"{agents}; got {num_envs}"
            )
        from mettagrid import Simulation

        self._simulation_cls = Simulation
        self.env_id = env_id
        self.num_envs = num_envs
        self.obs_shape = self.spec.obs_shape
        self.obs_dtype = np.dtype(np.uint8)
        self.n_actions = self.spec.n_actions
        self.slot_offset = slot_offset
        self.agents = agents
        self.num_sims = num_envs // agents
        base = 0 if seed is None else seed
        self._seeds = [base + k * agents for k in range(self.num_sims)]
        self._episode = [0] * self.num_sims
        self._sims: list[Any] = [None] * self.num_sims
        self._ret = np.zeros(num_envs)
        self._len = np.zeros(num_envs, dtype=np.int64)
        self._closed = False

    def _new_sim(self, k: int) -> None:
        if self._sims[k] is not None:
            self._sims[k].close()
        seed = self._seeds[k] + 1_000_003 * self._episode[k]
        self._episode[k] += 1
        cfg = self.cfg
        if hasattr(cfg.game.map_builder, "seed"):  # the map too comes from the seed: same seed, same episode
            cfg = cfg.model_copy(deep=True)
            cfg.game.map_builder.seed = seed
        self._sims[k] = self._simulation_cls(cfg, seed=seed)

    def _dense(self, tokens: np.ndarray, out: np.ndarray) -> None:
        """Scatter (agents, T, 3) uint8 tokens into (agents, C, H, W) planes (``out`` is zeroed first)."""
        out[:] = 0
        c, h, w = self.obs_shape
        c -= 1  # the last plane marks occupied cells
        coord, feature, value = tokens[..., 0], tokens[..., 1].astype(np.intp), tokens[..., 2]
        y = np.where(coord == _GLOBAL, h // 2, coord >> 4).astype(np.intp)
        x = np.where(coord == _GLOBAL, w // 2, coord & 0x0F).astype(np.intp)
        valid = (coord != _PADDING) & (y < h) & (x < w) & (feature < c)
        agent = np.broadcast_to(np.arange(tokens.shape[0])[:, None], coord.shape)
        out[agent[valid], feature[valid], y[valid], x[valid]] = value[valid]
        spatial = valid & (coord != _GLOBAL)
        out[agent[spatial], c, y[spatial], x[spatial]] = 255

    def _observe(self, k: int, out: np.ndarray) -> None:
        self._dense(self._sims[k]._c_sim.observations(), out[k * self.agents:(k + 1) * self.agents])

    def reset(self) -> np.ndarray:
        """Start every simulation from its first seed."""
        self._episode = [0] * self.num_sims
        obs = np.zeros((self.num_envs, *self.obs_shape), dtype=np.uint8)
        for k in range(self.num_sims):
            self._new_sim(k)
            self._observe(k, obs)
        self._ret[:] = 0.0
        self._len[:] = 0
        return obs

    def _step(self, actions: np.ndarray) -> VectorStep:
        actions = np.asarray(actions)
        if actions.min(initial=0) < 0 or actions.max(initial=0) >= self.n_actions:
            raise ValueError(f"MettaGrid actions must be in 0..{self.n_actions - 1}")
        n, a = self.num_envs, self.agents
        obs = np.zeros((n, *self.obs_shape), dtype=np.uint8)
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        ended: list[tuple[slice, np.ndarray]] = []
        episodes: list[EpisodeEnd] = []
        for k, sim in enumerate(self._sims):
            rows = slice(k * a, (k + 1) * a)
            c_sim = sim._c_sim
            c_sim.actions()[:] = actions[rows]
            sim.step()
            reward[rows] = c_sim.rewards()
            terminated[rows] = c_sim.terminals()
            truncated[rows] = c_sim.truncations() & ~terminated[rows]
            self._observe(k, obs)
            self._ret[rows] += reward[rows]
            self._len[rows] += 1
            if sim.is_done():
                ended.append((rows, obs[rows].copy()))
                for i in range(k * a, (k + 1) * a):
                    episodes.append(EpisodeEnd(self.slot_offset + i, float(self._ret[i]), int(self._len[i])))
                self._ret[rows] = 0.0
                self._len[rows] = 0
                terminated[rows] |= ~truncated[rows]  # a simulation that is done ends every agent's episode
                self._new_sim(k)
                self._observe(k, obs)
        final = obs.copy() if ended else obs
        for rows, last in ended:
            final[rows] = last
        return VectorStep(obs, reward, terminated, truncated, final, episodes)

    def close(self) -> None:
        """Close every simulation."""
        if not self._closed:
            self._closed = True
            for sim in self._sims:
                if sim is not None:
                    sim.close()
