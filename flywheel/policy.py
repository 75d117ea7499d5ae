"""A trained policy: a learner checkpoint's online Q-network (safetensors only), greedy or epsilon-greedy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from flywheel.checkpoints import CHECKPOINT_FILE, CheckpointError, check_format, policy_tensors
from flywheel.nets import C51_ATOMS, QNetwork, build_q_network

RUN_JSON = "run.json"


class PolicyError(CheckpointError):
    """A checkpoint folder that cannot be loaded as a policy; the message is one line."""


WHICH = ("auto", "best", "latest")
BEST_FILE = "best.safetensors"  # written by the learner's evaluations (services/learner/best.py)
KEPT_BEST_DIR = "kept-best"  # where a `flywheel bench` checkpoint copy keeps the learner's best of its moment
PREFERRED_FILE = "preferred.json"  # which of the two evaluated better at the end of the run (flywheel/tools/film.py)


def file_version(path: Path) -> int | None:
    """The weight version a policy file's metadata names; None when it names none or cannot be read."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            meta = json.loads((fh.metadata() or {}).get("flywheel", "null"))
        return int(meta["weight_version"])
    except (SafetensorError, OSError, ValueError, KeyError, TypeError):
        return None


def preferred(directory: str | Path) -> tuple[str, str] | None:
    """("latest" or "best", why) from the end-of-run comparison (``PREFERRED_FILE``, written by flywheel/tools/film.py),
    while both files still hold the versions it compared; None otherwise."""
    path = Path(directory)
    folder = path / "learner" if (path / "learner" / PREFERRED_FILE).is_file() else path
    try:
        choice = json.loads((folder / PREFERRED_FILE).read_text())
        which, versions, why = choice["which"], choice["versions"], str(choice["why"])
        if which not in ("latest", "best") or not isinstance(versions, dict):
            return None
        for name, file in (("latest", CHECKPOINT_FILE), ("best", BEST_FILE)):
            if versions.get(name) is not None and file_version(folder / file) != int(versions[name]):
                return None  # the run went on (or its best changed) since the comparison
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return which, why


def find_checkpoint(directory: str | Path, which: str = "auto") -> Path:
    """The policy file of a checkpoint folder (or the file itself when ``directory`` is a .safetensors file).

    In DIR, or DIR/learner for a ``flywheel run --checkpoint-dir``: ``latest`` is learner.safetensors (the newest
    weights), ``best`` is best.safetensors (the weights that did best in the learner's evaluations),
    ``auto`` is whichever the end-of-run comparison ranked higher (``preferred``) while its files are unchanged,
    else best when there is one, else latest. ``best`` also finds a bench checkpoint copy's KEPT_BEST_DIR/ (``auto``
    does not: such a folder's default is the newest weights, which the bench evaluates).
    """
    if which not in WHICH:
        raise PolicyError(f"which must be one of {', '.join(WHICH)}, got {which!r}")
    path = Path(directory)
    if path.is_file() and path.suffix == ".safetensors":
        return path
    if not path.is_dir():
        raise PolicyError(f"checkpoint folder {str(path)!r} does not exist")
    if which == "auto" and (choice := preferred(path)) is not None:
        which = choice[0]
    names = {"auto": (BEST_FILE, CHECKPOINT_FILE), "best": (BEST_FILE,), "latest": (CHECKPOINT_FILE,)}[which]
    for name in names:
        for candidate in (path / name, path / "learner" / name):
            if candidate.is_file():
                return candidate
    if which == "best":
        if (kept := path / KEPT_BEST_DIR / BEST_FILE).is_file():  # a `flywheel bench` checkpoint copy
            return kept
        raise PolicyError(f"no best policy in {str(path)!r} (expected {BEST_FILE}, learner/{BEST_FILE} or "
                          f"{KEPT_BEST_DIR}/{BEST_FILE}: the learner writes it after its first greedy evaluation); "
                          "--which latest takes the newest")
    raise PolicyError(f"no learner checkpoint in {str(path)!r} (expected {CHECKPOINT_FILE} or "
                      f"learner/{CHECKPOINT_FILE})")


def _run_json_env(file: Path) -> str | None:
    """The "env_id" of a run.json next to the checkpoint or one folder up; None when there is none."""
    for folder in (file.parent, file.parent.parent):
        path = folder / RUN_JSON
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text()).get("env_id")
        except (OSError, ValueError, AttributeError) as exc:
            raise PolicyError(f"{path} is unreadable ({exc})".splitlines()[0]) from None
        if isinstance(value, str) and value:
            return value
    return None


def _spec_from_name(name: str, env_id: str) -> dict[str, Any]:
    """The network spec of an old checkpoint (no "network_spec"): the env's shapes plus what its name says."""
    from flywheel.envs import env_spec

    spec = env_spec(env_id)
    hidden = re.search(r"-h(\d+)(?:-|$)", name)
    quantiles, atoms = re.search(r"-qr(\d+)$", name), re.search(r"-c(\d+)$", name)
    head = "quantile" if quantiles else "c51" if atoms else "q"
    return {"obs_shape": list(spec.obs_shape), "n_actions": int(spec.n_actions), "dueling": "-dueling" in name,
            "hidden": int(hidden.group(1)) if hidden else 256, "head": head,
            "num_quantiles": int(quantiles.group(1)) if quantiles else 51,
            "c51_atoms": int(atoms.group(1)) if atoms else C51_ATOMS}


class Policy:
    """The online network of a learner checkpoint on ``device``; ``predict`` picks actions for a batch.

    Attributes: ``env_id``, ``n_actions``, ``obs_shape``, ``updates``, ``weight_version``, ``network`` (the name),
    ``path`` (the checkpoint file).
    """

    def __init__(self, net: QNetwork, env_id: str, *, updates: int = 0, weight_version: int = 0,
                 path: Path | None = None, device: str | torch.device = "cpu") -> None:
        self.net = net.to(device).eval()
        self.device = torch.device(device)
        self.env_id = env_id
        self.n_actions = int(net.n_actions)
        self.obs_shape = tuple(int(d) for d in net.obs_shape)
        self.network = net.name
        self.updates, self.weight_version, self.path = int(updates), int(weight_version), path

    @classmethod
    def load(cls, checkpoint_dir: str | Path, *, env_id: str | None = None, device: str = "cpu",
             which: str = "auto") -> Policy:
        """Read the policy file ``find_checkpoint(checkpoint_dir, which)`` and build its policy network (the acting
        average where the learner kept one, else the online network: ``flywheel.checkpoints.policy_tensors``).

        The env id comes from ``env_id``, else the checkpoint's metadata, else a run.json beside it (or one folder
        up); the network from the metadata's spec, else (older checkpoints) from the env and the network's name.
        Sets torch to one thread (evaluation workers run side by side, one core each).
        """
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)  # one policy, one core: evaluation workers run side by side
        path = find_checkpoint(checkpoint_dir, which)
        try:
            with safe_open(str(path), framework="pt", device="cpu") as fh:
                meta = json.loads((fh.metadata() or {}).get("flywheel", "null"))
                tensors = policy_tensors(fh)
        except (SafetensorError, OSError, ValueError) as exc:
            raise PolicyError(f"{path} is not a readable learner checkpoint: {exc}".splitlines()[0]) from None
        meta = check_format(meta, path, PolicyError)
        chosen = env_id or meta.get("env_id") or _run_json_env(path)
        if not isinstance(chosen, str) or not chosen:
            raise PolicyError(f"{path} does not name its env (an older checkpoint with no run.json beside it); "
                              "pass env_id")
        spec = meta.get("network_spec")
        try:
            if not isinstance(spec, dict):
                spec = _spec_from_name(str(meta.get("network", "")), chosen)
            net = build_q_network(tuple(spec["obs_shape"]), int(spec["n_actions"]), dueling=bool(spec["dueling"]),
                                  hidden=int(spec["hidden"]), head=str(spec["head"]),
                                  num_quantiles=int(spec["num_quantiles"]),
                                  c51_atoms=int(spec.get("c51_atoms", C51_ATOMS)))
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyError(f"{path}: cannot build its network for {chosen}: {exc}".splitlines()[0]) from None
        if net.name != meta.get("network"):
            raise PolicyError(f"{path} holds network {meta.get('network')!r}, but {chosen} builds {net.name!r}; "
                              "pass the env id the run trained on")
        own = net.state_dict()
        if set(tensors) != set(own) or any(tensors[k].shape != v.shape for k, v in own.items()):
            raise PolicyError(f"{path}: the policy network's tensors do not fit {net.name!r}")
        net.load_state_dict({k: v.to(own[k].dtype) for k, v in tensors.items()})
        return cls(net, chosen, updates=int(meta.get("updates", 0)), weight_version=int(meta.get("weight_version", 0)),
                   path=path, device=device)

    def _batch(self, obs: Any) -> tuple[torch.Tensor, bool]:
        array = np.asarray(obs)
        single = array.shape == self.obs_shape
        if single:
            array = array[None]
        if array.shape[1:] != self.obs_shape:
            raise ValueError(f"observations of shape {array.shape} do not fit {self.obs_shape} (one or a batch)")
        if array.dtype != np.uint8:
            array = array.astype(np.float32, copy=False)
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device), single

    def q_values(self, obs: Any) -> np.ndarray:
        """(B, n_actions) float32 Q-values for a batch (B, *obs_shape); one observation gives (1, n_actions)."""
        batch, _ = self._batch(obs)
        with torch.inference_mode():
            return self.net(batch).float().cpu().numpy()

    def predict(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> np.ndarray:
        """(B,) int64 actions: argmax Q, each replaced by a uniform random action with probability ``epsilon``.

        One unbatched observation (shape ``obs_shape``) gives shape (1,) as well; ``rng`` (default: a fresh,
        unseeded one) draws the random actions.
        """
        actions = self.q_values(obs).argmax(axis=1).astype(np.int64)
        if epsilon > 0.0:
            rng = rng if rng is not None else np.random.default_rng()
            explore = rng.random(len(actions)) < epsilon
            actions[explore] = rng.integers(self.n_actions, size=int(explore.sum()))
        return actions
