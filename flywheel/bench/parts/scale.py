"""A scale model from measured per-process costs: what more cores give, and what N frames in T hours need.

Inputs are two gateway snapshots of a running system (counters and each process's CPU seconds). The model takes
each service's CPU cost per unit of work: an actor's CPU seconds per env step, the learner's per sampled
transition, the replay's per item moved (inserted or sampled). A system with ``C`` cores and a samples-per-insert
ratio ``spi`` then runs ``S = C / (a + spi*l + (1 + spi)*r)`` env steps per second, capped by the single learner
(one process: ``1 / (spi*l)``) and the single replay event loop (``1 / ((1 + spi)*r)``), whichever binds first.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from flywheel.bench.runner import Row


@dataclass
class ScaleModel:
    """Measured rates and per-unit CPU costs of one run's steady window."""

    window_s: float
    actors: int
    env_steps_per_s: float
    updates_per_s: float
    samples_per_s: float
    transitions_per_s: float
    actor_cpu_per_step: float  # CPU seconds per env step, summed over actors
    learner_cpu_per_sample: float
    replay_cpu_per_item: float  # per transition inserted or sampled
    batch: float
    frame_skip: int = 1
    bare_env_steps_per_s: float | None = None
    cores_used: float = 0.0  # CPU seconds per second of every Flywheel process: the share of the machine it got

    @classmethod
    def from_points(cls, points: list[dict[str, Any]], *, actors: int, frame_skip: int = 1,
                    bare_env_steps_per_s: float | None = None, skip_fraction: float = 0.25) -> ScaleModel | None:
        """The window from ``skip_fraction`` of the run (start-up and replay filling left out) to its end."""
        live = [p for p in points if p["updates"] > 0]
        if len(live) < 2:
            return None
        start_t = live[0]["t"] + skip_fraction * (live[-1]["t"] - live[0]["t"])
        first = next(p for p in live if p["t"] >= start_t)
        last = live[-1]
        if last["t"] - first["t"] <= 0 or last is first:
            first = live[0]
        return cls.between(first, last, actors=actors, frame_skip=frame_skip,
                           bare_env_steps_per_s=bare_env_steps_per_s)

    @classmethod
    def between(cls, first: dict[str, Any], last: dict[str, Any], *, actors: int, frame_skip: int = 1,
                bare_env_steps_per_s: float | None = None) -> ScaleModel | None:
        dt = last["t"] - first["t"]
        if dt <= 0:
            return None

        def delta(key: str) -> float:
            return float(last[key] - first[key])

        def cpu(prefix: str) -> float:
            return sum(v - first["cpu"].get(k, 0.0) for k, v in last["cpu"].items() if k.startswith(prefix))

        steps, updates, samples, transitions = delta("env_steps"), delta("updates"), delta("samples"), \
            delta("transitions")
        if steps <= 0 or samples <= 0:
            return None
        return cls(
            window_s=dt, actors=actors, env_steps_per_s=steps / dt, updates_per_s=updates / dt,
            samples_per_s=samples / dt, transitions_per_s=transitions / dt,
            actor_cpu_per_step=cpu("actor-") / steps, learner_cpu_per_sample=cpu("learner-") / samples,
            replay_cpu_per_item=cpu("replay-") / max(1.0, transitions + samples),
            batch=samples / max(1.0, updates), frame_skip=frame_skip, bare_env_steps_per_s=bare_env_steps_per_s,
            cores_used=cpu("") / dt)

    @property
    def spi(self) -> float:
        """Samples per inserted transition, as measured."""
        return self.samples_per_s / self.transitions_per_s if self.transitions_per_s > 0 else math.nan

    def env_steps_on(self, cores: float, spi: float | None = None) -> tuple[float, str]:
        """Predicted env steps/s on ``cores`` cores with one learner and one replay, and what limits it."""
        spi = self.spi if spi is None else spi
        per_step = self.actor_cpu_per_step + spi * self.learner_cpu_per_sample + (1 + spi) * self.replay_cpu_per_item
        limits = {"cores": cores / per_step}
        if spi > 0 and self.learner_cpu_per_sample > 0:
            limits["learner (one process)"] = 1.0 / (spi * self.learner_cpu_per_sample)
        if self.replay_cpu_per_item > 0:
            limits["replay (one event loop)"] = 1.0 / ((1 + spi) * self.replay_cpu_per_item)
        name = min(limits, key=lambda k: limits[k])
        return limits[name], name

    def needs(self, frames: float, hours: float) -> dict[str, float]:
        """Actor cores, learner samples/s and replay cores to reach ``frames`` frames in ``hours`` hours."""
        steps_per_s = frames / self.frame_skip / (3600 * hours)
        samples = self.spi * steps_per_s
        return {
            "env_steps_per_s": steps_per_s,
            "actor_cores": steps_per_s * self.actor_cpu_per_step,
            "actors_at_measured_rate": steps_per_s / (self.env_steps_per_s / self.actors),
            "learner_samples_per_s": samples,
            "cpu_learners": samples * self.learner_cpu_per_sample,
            "updates_per_s_at_512": samples / 512,
            "replay_cores": (steps_per_s + samples) * self.replay_cpu_per_item,
        }

    def rows(self, case: str) -> list[Row]:
        return [
            Row(case=case, metric="env steps/s, all actors", unit="steps/s", flywheel=self.env_steps_per_s),
            Row(case=case, metric="env steps/s per actor", unit="steps/s",
                flywheel=self.env_steps_per_s / self.actors, peer=self.bare_env_steps_per_s,
                peer_name="bare env loop, one process" if self.bare_env_steps_per_s else ""),
            Row(case=case, metric="learner updates/s", unit="1/s", flywheel=self.updates_per_s),
            Row(case=case, metric="learner samples/s", unit="1/s", flywheel=self.samples_per_s),
            Row(case=case, metric="actor CPU per env step", unit="ms", flywheel=1e3 * self.actor_cpu_per_step,
                higher_is_better=False),
            Row(case=case, metric="learner CPU per sampled transition", unit="ms",
                flywheel=1e3 * self.learner_cpu_per_sample, higher_is_better=False),
            Row(case=case, metric="replay CPU per transition moved", unit="ms",
                flywheel=1e3 * self.replay_cpu_per_item, higher_is_better=False),
        ]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"spi": self.spi}


def scale_table(model: ScaleModel, targets: tuple[tuple[float, float], ...]) -> list[str]:
    """Markdown lines: what each (frames, hours) target needs, from the model's measured costs."""
    lines = [
        f"Scale model (measured over {model.window_s:.0f} s: {model.env_steps_per_s:,.0f} env steps/s from "
        f"{model.actors} actors, {model.updates_per_s:,.1f} updates/s of {model.batch:.0f}, {model.spi:.2f} samples "
        f"per insert; {1e3 * model.actor_cpu_per_step:.2f} ms actor CPU per env step, "
        f"{1e3 * model.learner_cpu_per_sample:.3f} ms learner CPU per sample, {1e3 * model.replay_cpu_per_item:.3f} ms "
        f"replay CPU per transition moved; {model.frame_skip} frames per env step):",
        "",
        "| target | env steps/s | actor cores | actors at this run's per-actor rate | learner samples/s "
        "| CPU learners like this one | updates/s at batch 512 (GPU learner) | replay cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for frames, hours in targets:
        n = model.needs(frames, hours)
        lines.append(
            f"| {frames / 1e6:,.0f}M frames in {hours:g} h | {n['env_steps_per_s']:,.0f} | {n['actor_cores']:,.1f} | "
            f"{n['actors_at_measured_rate']:,.0f} | {n['learner_samples_per_s']:,.0f} | {n['cpu_learners']:,.1f} | "
            f"{n['updates_per_s_at_512']:,.1f} | {n['replay_cores']:,.2f} |")
    return ["\n".join(lines)]
