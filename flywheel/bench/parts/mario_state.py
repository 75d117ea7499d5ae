"""A `flywheel bench mario` training kept across parts (``--opt resume=1``) or branched from another's end
(``--opt branch_from``): the recipe, what earlier parts trained, their checkpoints and every evaluation so far, saved
in the kept workdir after each checkpoint and evaluation; and the marks (minutes, agent steps from the first part's
start) its checkpoints are taken at."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flywheel.bench.runner import BenchError
from flywheel.checkpoints import write_atomically

STATE_FILE = "bench-mario-state.json"
FORMAT = "flywheel-bench-mario-state"
RUN_FOLDER = "run"  # the flywheel run's folder in a kept workdir (its checkpoints in RUN_FOLDER/checkpoints)


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
    branched_from: dict[str, Any] | None = None

    @classmethod
    def load(cls, workdir: Path, option: str = "--opt resume=1") -> MarioState:
        """The state kept in ``workdir``; a BenchError naming ``option`` when there is none or it cannot be read."""
        path = workdir / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise BenchError(f"{option}: {path} is missing; a kept training is one run before with "
                             f"--opt workdir={workdir}") from None
        except (OSError, ValueError) as exc:
            raise BenchError(f"{option}: {path} cannot be read: {exc}") from None
        if not isinstance(raw, dict) or raw.pop("format", None) != FORMAT:
            raise BenchError(f"{option}: {path} is not a {FORMAT} file")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise BenchError(f"{option}: {path}: {exc}") from None

    @classmethod
    def branch(cls, source: Path, workdir: Path, recipe: dict[str, Any], evaluation: dict[str, Any]) -> MarioState:
        """A new training that starts where the one kept in ``source`` ended (``--opt branch_from``), checked but not
        made yet (:meth:`copy_branch` makes it): minutes and agent steps count from the source's start; the source's
        checkpoints stay its own, and its random-policy episodes are reused only for the same evaluation."""
        from flywheel.launch import runfolder

        source = source.resolve()
        before = cls.load(source, "--opt branch_from")
        learner = source / RUN_FOLDER / "checkpoints" / "learner" / "learner.safetensors"
        if not learner.is_file():
            raise BenchError(f"--opt branch_from={source}: {learner} is missing: there is no training to branch from")
        if before.recipe.get("env_id") != recipe["env_id"]:
            raise BenchError(f"--opt branch_from={source}: a branch goes on in the source's env "
                             f"({before.recipe.get('env_id')}), not {recipe['env_id']}")
        if (workdir / STATE_FILE).exists() or (workdir / RUN_FOLDER).exists():
            raise BenchError(f"--opt branch_from: {workdir} holds a training already; a branch starts in a new --opt "
                             "workdir (resume=1 goes on with the one there)")
        try:
            runfolder.probe(source / RUN_FOLDER / "checkpoints")
        except runfolder.FolderLocked as exc:
            raise BenchError(f"--opt branch_from={source}: {exc}; branch once it has stopped") from None
        last: dict[str, Any] = max(before.checkpoints, key=lambda c: c.get("t", 0.0), default={})
        return cls(recipe, evaluation, trained_minutes=before.trained_minutes, env_steps=before.env_steps,
                   random=before.random if before.evaluation == evaluation else None,
                   branched_from={"dir": str(source), "trained_minutes": before.trained_minutes,
                                  "env_steps": before.env_steps, "sets": before.recipe.get("sets", []),
                                  "parts": before.training_parts, "last_checkpoint_updates":
                                      last.get("checkpoint_updates")})

    def copy_branch(self, workdir: Path) -> None:
        """Make the branch :meth:`branch` checked: the source's run folder (without its lock) copied into
        ``workdir``, to go on with ``flywheel run --resume`` and this recipe's sets (they win over the saved ones),
        and this state saved beside it."""
        from flywheel.launch import runfolder

        if self.branched_from is None:
            raise ValueError("copy_branch makes the branch MarioState.branch checked: this state is none")
        workdir.mkdir(parents=True, exist_ok=True)
        partial = workdir / f"{RUN_FOLDER}.copying"
        shutil.rmtree(partial, ignore_errors=True)  # what a copy cut off left
        shutil.copytree(Path(self.branched_from["dir"]) / RUN_FOLDER, partial, symlinks=True,
                        ignore=shutil.ignore_patterns(runfolder.LOCK_FILE))
        partial.replace(workdir / RUN_FOLDER)
        self.save(workdir)

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
