"""A `flywheel bench mario` training kept across parts (``--opt resume=1``): the recipe, what earlier parts trained,
their checkpoints and every evaluation so far, saved in the kept workdir after each checkpoint and evaluation."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flywheel.bench.runner import BenchError
from flywheel.checkpoints import write_atomically

STATE_FILE = "bench-mario-state.json"
FORMAT = "flywheel-bench-mario-state"


@dataclass
class MarioState:
    """``recipe`` (env id, actors, deploys, sets) and ``evaluation`` (seeds, epsilons, no-ops, stall rule) must be
    the same in every part; ``trained_minutes`` and ``env_steps`` are where the last part ended (the actors' step
    counters start at 0 in every part, the learner's updates come back with its checkpoint)."""

    recipe: dict[str, Any]
    evaluation: dict[str, Any]
    trained_minutes: float = 0.0
    env_steps: float = 0.0
    parts: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    random: list[dict[str, Any]] | None = None

    @classmethod
    def load(cls, workdir: Path) -> MarioState:
        path = workdir / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise BenchError(f"--opt resume=1: {path} is missing; a training to resume is one run before with "
                             f"--opt workdir={workdir}") from None
        except (OSError, ValueError) as exc:
            raise BenchError(f"--opt resume=1: {path} cannot be read: {exc}") from None
        if not isinstance(raw, dict) or raw.pop("format", None) != FORMAT:
            raise BenchError(f"--opt resume=1: {path} is not a {FORMAT} file")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise BenchError(f"--opt resume=1: {path}: {exc}") from None

    @property
    def training_parts(self) -> int:
        """Parts of the training in time (``--opt resume=1`` adds one); deploys trained side by side in one part
        (deploy=run,compose) each add an entry to ``parts`` but share its start, so they count once."""
        return len({part["started_minute"] for part in self.parts})

    def save(self, workdir: Path) -> None:
        write_atomically(workdir / STATE_FILE, (json.dumps({"format": FORMAT, **asdict(self)}) + "\n").encode())

    def check_same(self, recipe: dict[str, Any], evaluation: dict[str, Any]) -> None:
        """A BenchError naming what differs from the parts before: a resumed training keeps its recipe and is judged
        by the same evaluation."""
        for what, before, now in (("recipe", self.recipe, recipe), ("evaluation", self.evaluation, evaluation)):
            changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
            if changed:
                shown = "; ".join(f"{k}: {before.get(k)!r} before, {now.get(k)!r} now" for k in changed)
                raise BenchError(f"--opt resume=1 continues the same training: its {what} differs ({shown})")

    def add_part(self, minutes: float, points: list[dict[str, Any]], checkpoints: list[dict[str, Any]],
                 loads: dict[str, Any], *, advance: bool = True) -> None:
        """One more part's polls and checkpoints, their time and agent steps counted from the first part's start.
        ``advance`` False: a training beside this one follows from the same start (deploy=run,compose)."""
        part = len(self.parts)
        offset_s, steps = 60.0 * self.trained_minutes, self.env_steps
        for p in points:
            p.update(t=p["t"] + offset_s, env_steps=(p.get("env_steps") or 0.0) + steps, part=part)
        for c in checkpoints:
            c.update(t=c["t"] + offset_s, asked_t=c["asked_t"] + offset_s, part=part,
                     env_steps=None if c.get("env_steps") is None else c["env_steps"] + steps)
        self.points += points
        self.checkpoints += checkpoints
        self.parts.append({"part": part, "started_minute": self.trained_minutes, "minutes": minutes,
                           "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loads": dict(loads)})
        if advance:
            self.env_steps = points[-1]["env_steps"] if points else self.env_steps
            self.trained_minutes += minutes
