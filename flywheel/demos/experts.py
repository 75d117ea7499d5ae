"""Policies that play demonstrations: scripted experts (CartPole, Snake, NES platformers), random, or a checkpoint."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Policy = Callable[[np.ndarray, dict[str, Any]], int]


class PolicyError(ValueError):
    """A policy that cannot be built: unknown name, no expert for this env, or a bad checkpoint."""


def cartpole_expert() -> Policy:
    """A linear balance controller on (x, x_dot, theta, theta_dot); it keeps the pole up for all 500 steps."""
    gains = np.array([0.0, 0.1, 10.0, 2.0])

    def act(obs: np.ndarray, _info: dict[str, Any]) -> int:
        return int(float(np.dot(gains, np.asarray(obs, dtype=np.float64))) > 0)

    return act


_SNAKE_MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # the Snake env's actions: up, right, down, left


def snake_expert() -> Policy:
    """Breadth-first search from the head to the food around the body; if no path, the move with most room."""

    def act(obs: np.ndarray, _info: dict[str, Any]) -> int:
        body, head, food = obs[0] > 0, obs[1] > 0, obs[2] > 0
        size_h, size_w = body.shape
        heads = np.argwhere(head)
        if len(heads) == 0:
            return 0
        start = tuple(int(v) for v in heads[0])
        blocked = body.copy()
        blocked[start] = False

        def free(cell: tuple[int, int]) -> bool:
            return 0 <= cell[0] < size_h and 0 <= cell[1] < size_w and not blocked[cell]

        first_move: dict[tuple[int, int], int] = {}
        queue: deque[tuple[int, int]] = deque()
        for action, (dy, dx) in enumerate(_SNAKE_MOVES):
            cell = (start[0] + dy, start[1] + dx)
            if free(cell) and cell not in first_move:
                first_move[cell] = action
                queue.append(cell)
        while queue:
            cell = queue.popleft()
            if food[cell]:
                return first_move[cell]
            for dy, dx in _SNAKE_MOVES:
                nxt = (cell[0] + dy, cell[1] + dx)
                if free(nxt) and nxt not in first_move:
                    first_move[nxt] = first_move[cell]
                    queue.append(nxt)
        room = {a: 0 for a in range(4)}  # no path to food: go where the most cells are reachable
        for action in first_move.values():
            room[action] += 1
        return max(room, key=lambda a: room[a])

    return act


def platformer_actions(action_meanings: list[str]) -> dict[str, int] | None:
    """The indices of the NES buttons right+A+B and right+B among ``action_meanings`` ("right A B", ...); None
    when the action set lacks either."""
    wanted = {"run_jump": ("right", "A", "B"), "run": ("right", "B")}
    index: dict[str, int] = {}
    for name, buttons in wanted.items():
        for i, meaning in enumerate(action_meanings):
            parts = tuple(p.strip() for p in re.split(r"[ +,]+", meaning) if p.strip())
            if set(parts) == set(buttons):
                index[name] = i
    return index if len(index) == len(wanted) else None


def platformer_expert(action_meanings: list[str], seed: int = 0) -> Policy:
    """Run right holding B, jump with A in bursts (releasing A so the character can jump again), a little
    randomness: a side-scrolling NES platformer's expert."""
    index = platformer_actions(action_meanings)
    if index is None:
        raise PolicyError(f"the platformer expert needs right+A+B and right+B actions; this action set has "
                          f"{action_meanings}")
    rng = np.random.default_rng(seed)
    step = {"t": 0}

    def act(_obs: np.ndarray, _info: dict[str, Any]) -> int:
        step["t"] += 1
        if rng.random() < 0.05:
            return int(rng.integers(len(action_meanings)))
        return index["run_jump"] if step["t"] % 16 < 14 else index["run"]

    return act


def random_policy(n_actions: int, seed: int = 0) -> Policy:
    """Uniformly random actions."""
    rng = np.random.default_rng(seed)
    return lambda _obs, _info: int(rng.integers(n_actions))


_NAME = re.compile(r"(?P<kind>mlp|conv|nature)-(?P<shape>[0-9x]+)-(?P<actions>\d+)-(?P<arch>dueling|plain)"
                   r"(?:-h(?P<hidden>\d+))?(?:-qr(?P<quantiles>\d+)|-c(?P<atoms>\d+))?")


def checkpoint_policy(directory: str | Path, obs_shape: tuple[int, ...], n_actions: int) -> Policy:
    """Greedy actions of the policy network in a learner checkpoint (the acting average where the learner kept one,
    else the online network; safetensors, nothing executed on load)."""
    import torch  # only here: scripted experts start their workers without it
    from safetensors import safe_open

    from flywheel.checkpoints import policy_tensors
    from flywheel.nets import C51_ATOMS, QNetwork

    path = Path(directory)
    path = path / "learner.safetensors" if path.is_dir() else path
    if not path.is_file():
        raise PolicyError(f"no learner checkpoint at {path}")
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = json.loads((fh.metadata() or {}).get("flywheel", "{}"))
            tensors = policy_tensors(fh)
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise PolicyError(f"{path} is not a readable learner checkpoint: {exc}") from None
    match = _NAME.fullmatch(str(meta.get("network", "")))
    if match is None:
        raise PolicyError(f"{path} names no network this build knows: {meta.get('network')!r}")
    net = QNetwork(tuple(obs_shape), n_actions, dueling=match["arch"] == "dueling",
                   hidden=int(match["hidden"] or 256),
                   head="quantile" if match["quantiles"] else "c51" if match["atoms"] else "q",
                   num_quantiles=int(match["quantiles"] or 51), c51_atoms=int(match["atoms"] or C51_ATOMS))
    if net.name != meta["network"]:
        raise PolicyError(f"{path} holds {meta['network']} but this env needs {net.name}")
    try:
        net.load_state_dict(tensors)
    except RuntimeError as exc:
        raise PolicyError(f"{path}: online network does not load: {str(exc).splitlines()[0]}") from None
    net.eval()

    def act(obs: np.ndarray, _info: dict[str, Any]) -> int:
        with torch.inference_mode():
            return int(net(torch.from_numpy(np.asarray(obs)[None])).argmax(dim=1).item())

    return act


EXPERT_FAMILIES = ("CartPole", "Snake", "NES platformers with right+A+B and right+B actions")


def build_policy(spec: str, env_id: str, env: Any, seed: int) -> Policy:
    """``expert``, ``random`` or ``checkpoint:DIR`` for ``env`` (an env made for ``env_id``)."""
    n_actions = int(env.action_space.n)
    if spec == "random":
        return random_policy(n_actions, seed)
    if spec.startswith("checkpoint:"):
        return checkpoint_policy(spec.split(":", 1)[1], tuple(env.observation_space.shape), n_actions)
    if spec != "expert":
        raise PolicyError(f"unknown policy {spec!r}: use expert, random or checkpoint:DIR")
    base = env_id.split("?", 1)[0]
    if base.startswith("CartPole"):
        return cartpole_expert()
    if base in ("Snake-v0", "flywheel/Snake-v0"):
        return snake_expert()
    meanings = getattr(env.unwrapped, "get_action_meanings", None)
    if callable(meanings) and platformer_actions(list(meanings())) is not None:
        return platformer_expert(list(meanings()), seed)
    raise PolicyError(f"no scripted expert for {env_id}; experts exist for {', '.join(EXPERT_FAMILIES)}; "
                      "use --policy checkpoint:DIR or random")
