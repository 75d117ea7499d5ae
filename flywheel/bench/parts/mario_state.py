"""A `flywheel bench mario` training kept across parts (``--opt resume=1``): the recipe, what earlier parts trained,
their checkpoints and every evaluation so far, saved in the kept workdir after each checkpoint and evaluation; and
the marks (minutes, agent steps from the first part's start) its checkpoints are taken at."""

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


STEPS_POLL_MIN_S = 1.0  # the services report their counters to the gateway every second (telemetry_interval_s)


def parse_minutes(raw: str, minutes: float, offset: float = 0.0) -> list[float]:
    """``--opt checkpoint_at``: minutes counted from the first part's start, each in (offset, offset + minutes]."""
    try:
        marks = sorted({float(m) for m in raw.split(",") if m.strip()})
    except ValueError:
        raise BenchError(f"--opt checkpoint_at={raw!r}: expected minutes separated by commas") from None
    if not marks or marks[0] <= offset or marks[-1] > offset + minutes:
        within = f"({offset:g}, {offset + minutes:g}] (the training so far ends at {offset:g} min)" if offset else \
            f"(0, minutes={minutes:g}]"
        raise BenchError(f"--opt checkpoint_at={raw!r}: each must be in {within}")
    return marks


def parse_steps(raw: str) -> list[int]:
    """``--opt checkpoint_steps``: agent-step marks, whole numbers > 0, each larger than the one before."""
    try:
        marks = [int(m) for m in raw.split(",") if m.strip()]
    except ValueError:
        marks = []
    if not marks:
        raise BenchError(f"--opt checkpoint_steps={raw!r}: expected whole numbers of agent steps separated by commas")
    if marks[0] <= 0 or any(b <= a for a, b in zip(marks, marks[1:], strict=False)):
        raise BenchError(f"--opt checkpoint_steps={raw!r}: each must be > 0 and larger than the one before")
    return marks


def steps_wait(points: list[dict[str, Any]], mark: float, poll_s: float) -> float:
    """Seconds to the next poll as the agent steps near ``mark``: 80% of the way there at the rate over about the
    last ``poll_s`` seconds of ``points``, at least STEPS_POLL_MIN_S, never more than ``poll_s`` (``poll_s`` while
    no rate is known)."""
    new = points[-1]
    old = next((p for p in reversed(points[:-1]) if new["t"] - p["t"] >= poll_s), points[0])
    rate = (new["env_steps"] - old["env_steps"]) / (new["t"] - old["t"]) if new["t"] > old["t"] else 0.0
    if rate <= 0:
        return poll_s
    return min(poll_s, max(STEPS_POLL_MIN_S, 0.8 * (mark - new["env_steps"]) / rate))


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

    def steps_to_take(self, marks: list[int], deploy: str) -> list[int]:
        """The step marks this part still takes for ``deploy`` (marks count agent steps from the first part's start):
        one an earlier part took stays as it was; one the training passed untaken is a BenchError."""
        taken = {c["steps_mark"] for c in self.checkpoints
                 if c.get("steps_mark") is not None and c.get("deploy", "run") == deploy}
        missed = [m for m in marks if m not in taken and m <= self.env_steps]
        if missed:
            raise BenchError(f"--opt checkpoint_steps: {', '.join(map(str, missed))} lie within the training so far "
                             f"({self.env_steps:,.0f} agent steps) and no earlier part took them: leave them out")
        return [m for m in marks if m not in taken]

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
                     **{k: c[k] + steps for k in ("env_steps", "polled_env_steps") if c.get(k) is not None})
        self.points += points
        self.checkpoints += checkpoints
        self.parts.append({"part": part, "started_minute": self.trained_minutes, "minutes": minutes,
                           "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loads": dict(loads)})
        if advance:
            self.env_steps = points[-1]["env_steps"] if points else self.env_steps
            self.trained_minutes += minutes
