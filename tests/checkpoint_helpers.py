"""A real learner checkpoint written by the learner's own code, for the tests of what reads one (eval, export)."""

from __future__ import annotations

from pathlib import Path

import torch

from flywheel.services.learner.checkpoint import save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore


def learner_checkpoint(folder: Path, env_id: str, obs_shape: tuple[int, ...], n_actions: int, *,
                       weight_version: int = 5, seed: int = 0, **config: object) -> Path:
    """An untrained learner (``config``: CoreConfig fields) of ``env_id``, seeded, saved at ``weight_version``
    laid out as flywheel run does (DIR/learner/); returns ``folder``."""
    torch.manual_seed(seed)
    core = LearnerCore(obs_shape, n_actions, CoreConfig(**config))  # type: ignore[arg-type]
    core.env_id = env_id  # type: ignore[attr-defined]  # what services/learner/main.py sets
    save_checkpoint(folder / "learner", core, weight_version=weight_version)
    return folder
