"""Training curves that outlive a run: TensorBoard events in CHECKPOINT_DIR/tb and CHECKPOINT_DIR/progress.csv."""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path
from typing import Any

TB_DIR = "tb"
CSV_FILE = "progress.csv"
# CSV column -> TensorBoard tag; env steps (the x axis) and seconds since the first run's start lead the row.
TAGS = {
    "return": "returns/episode",
    "greedy_return": "returns/greedy",
    "mario_distance": "mario/distance",
    "mario_flag_rate": "mario/flag_rate",
    "loss": "learner/loss",
    "updates": "learner/updates",
    "updates_per_second": "learner/updates_per_second",
    "env_steps_per_second": "actors/env_steps_per_second",
    "policy_lag": "actors/policy_lag_versions",
    "replay_size": "replay/size",
    "eval_return": "eval/return",  # the learner's evaluations under the preset's protocol (services/learner/best.py)
    "eval_success_rate": "eval/success_rate",
    "eval_progress_mean": "eval/progress_mean",
}
COLUMNS = ("env_steps", "elapsed_s", *TAGS)
Point = tuple[int, dict[str, float]]  # what Curves.record wrote: the step (env steps) and the values by tag
# Left by ``flywheel run --resume``, which starts every service again: the next writer adds all the env steps it
# sees to the last row (its counters started at zero) instead of guessing, and removes the mark.
FRESH_MARK = ".curves-counters-restart"


def summarize(status: dict[str, Any]) -> dict[str, float | None]:
    """The numbers the progress line shows, from the gateway's /status."""
    services = status.get("services", {})

    def live(service: str) -> list[dict[str, Any]]:
        return [i for i in services.get(service, {}).get("instances", []) if i.get("up")]

    actors, learners, replays = live("actor"), live("learner"), live("replay")
    gauges = [a.get("gauges", {}) for a in actors]
    eps_low = [g.get("epsilon_min", g["epsilon"]) for g in gauges if "epsilon" in g]
    eps_high = [g.get("epsilon_max", g["epsilon"]) for g in gauges if "epsilon" in g]
    returns = [g["episode_return_mean"] for g in gauges if g.get("episode_return_mean")]
    greedy = [g["eval_return_mean"] for g in gauges if "eval_return_mean" in g]
    learner = learners[0].get("gauges", {}) if learners else {}
    distance = [g["mario_distance_mean"] for g in gauges if "mario_distance_mean" in g]
    return {
        "env_steps": services.get("actor", {}).get("totals", {}).get("env_steps_total", 0.0),
        "env_steps_per_second": sum(g.get("env_steps_per_second", 0.0) for g in gauges),
        "updates": learners[0].get("counters", {}).get("updates_total", 0.0) if learners else 0.0,
        "updates_per_second": learner.get("updates_per_second", 0.0),
        "return": sum(returns) / len(returns) if returns else None,
        "greedy_return": max(greedy) if greedy else None,
        "distance": sum(distance) / len(distance) if distance else None,
        "epsilon_min": min(eps_low) if eps_low else None, "epsilon_max": max(eps_high) if eps_high else None,
        "replay_size": sum(r.get("gauges", {}).get("size_transitions", 0.0) for r in replays),
        "weight_version": learner.get("weight_version", 0.0),
        "best_return": learner.get("best_greedy_return"),  # the learner's kept best (services/learner/best.py)
        "best_version": learner.get("best_weight_version"),
        "eval_return": learner.get("eval_greedy_return"),  # the learner's last evaluation, under its protocol
        "eval_version": learner.get("eval_greedy_version"),
        "eval_success_rate": learner.get("eval_success_rate"),
        "eval_progress_mean": learner.get("eval_progress_mean"),
        "eval_progress_median": learner.get("eval_progress_median"),
        "actors_up": float(len(actors)),
    }



def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def scalars(summary: dict[str, float | None], status: dict[str, Any]) -> dict[str, float | None]:
    """The curve values of one progress tick: ``flywheel.run.summarize``'s numbers plus loss, lag and flag rate."""
    services = status.get("services", {})

    def gauges(service: str) -> list[dict[str, Any]]:
        return [i.get("gauges", {}) for i in services.get(service, {}).get("instances", []) if i.get("up")]

    actors, learners = gauges("actor"), gauges("learner")
    loss = learners[0].get("loss") if learners else None
    return {
        "return": summary.get("return"),
        "greedy_return": summary.get("greedy_return"),
        "mario_distance": summary.get("distance"),
        "mario_flag_rate": _mean([float(g["mario_flag_rate"]) for g in actors if "mario_flag_rate" in g]),
        "loss": None if loss is None else float(loss),
        "updates": summary.get("updates"),
        "updates_per_second": summary.get("updates_per_second"),
        "env_steps_per_second": summary.get("env_steps_per_second"),
        "policy_lag": _mean([float(g["policy_lag_versions"]) for g in actors if "policy_lag_versions" in g]),
        "replay_size": summary.get("replay_size"),
        "eval_return": summary.get("eval_return"),
        "eval_success_rate": summary.get("eval_success_rate"),
        "eval_progress_mean": summary.get("eval_progress_mean"),
    }


def _last_row(path: Path) -> dict[str, str] | None:
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, csv.Error):
        return None
    return rows[-1] if rows else None


def _number(value: str | None) -> float:
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0


def reset(directory: str | Path) -> None:
    """Remove the curves of an earlier run in ``directory`` (a new run's curves start over, as its checkpoints do)."""
    folder = Path(directory)
    (folder / CSV_FILE).unlink(missing_ok=True)
    (folder / FRESH_MARK).unlink(missing_ok=True)
    for old in (folder / TB_DIR).glob("events.out.tfevents.*"):
        old.unlink()


class Curves:
    """Appends one point per tick to TensorBoard and to the CSV, with env steps as the step.

    With ``resume`` an existing progress.csv is continued from its last row: when the first new point's env
    steps are at least that row's, only the writer restarted and the steps count as they are; when they are
    below it, the services started again and what they gain from the first new point on is added (what they
    did before that point is not counted, and nothing is counted twice); after ``mark_counters_restart`` (what
    ``flywheel run --resume`` leaves) every step the new services make is added. Without it both files start over.
    """

    def __init__(self, directory: str | Path, *, resume: bool = False, flush_secs: int = 10) -> None:
        # TensorBoard's own event writer (what torch's SummaryWriter wraps): no torch import in the gateway
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.directory / CSV_FILE
        last = _last_row(self.csv_path) if resume else None
        self.step_offset = int(_number(last.get("env_steps"))) if last else 0
        self.time_offset = _number(last.get("elapsed_s")) if last else 0.0
        self.append = resume and last is not None
        fresh = self.directory / FRESH_MARK  # (elapsed, env steps) the counters started from, when appending:
        self._first: tuple[float, float] | None = (0.0, 0.0) if self.append and fresh.exists() else None  # or seen
        fresh.unlink(missing_ok=True)
        self.counters_from_zero = self._first is not None  # a partial first total cannot be misread then
        if not self.append:  # a new run in this folder: its curves start over, as its checkpoints do
            reset(self.directory)
        self._csv = open(self.csv_path, "a" if self.append else "w", newline="")  # closed in close()
        self._rows = csv.DictWriter(self._csv, fieldnames=COLUMNS, extrasaction="ignore")
        if not self.append:
            self._rows.writeheader()
            self._csv.flush()
        self._last_steps = 0.0
        self.writer = EventFileWriter(str(self.directory / TB_DIR), flush_secs=flush_secs)
        self.points = 0

    @staticmethod
    def mark_counters_restart(directory: str | Path) -> None:
        """Tell the next writer in ``directory`` that every service starts again, its counters from zero."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / FRESH_MARK).touch()

    def record(self, elapsed: float, env_steps: float, values: dict[str, float | None]) -> Point | None:
        """One point: ``values`` by CSV column (None or NaN: left out of TensorBoard, empty in the CSV).

        Returns the point as written (its step, and its values by TensorBoard tag) for other sinks such as
        flywheel/tracking.py; None when no point was written (nothing new since the earlier rows' last step)."""
        if self.append:
            if self._first is None:  # counters that went on (only the writer restarted) count as they are;
                # counters below the last row started again: from here on what they gain is counted
                self._first = (elapsed, self.step_offset if env_steps >= self.step_offset else env_steps)
            elif env_steps < self._last_steps:  # counters started again while this writer ran
                self._first = (self._first[0], self._first[1] - self._last_steps)
            self._last_steps = env_steps
            step = self.step_offset + int(env_steps - self._first[1])
            seconds = self.time_offset + elapsed - self._first[0]
            if step <= self.step_offset:  # nothing new since the earlier rows' last step: no second point there
                return None
        else:
            step = int(env_steps)
            seconds = elapsed
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        row: dict[str, Any] = {"env_steps": step, "elapsed_s": f"{seconds:.1f}"}
        summary_values: list[Any] = []
        tagged: dict[str, float] = {}
        for column, tag in TAGS.items():
            value = values.get(column)
            if value is None or not math.isfinite(value):
                row[column] = ""
                continue
            row[column] = f"{value:.6g}"
            summary_values.append(Summary.Value(tag=tag, simple_value=value))
            tagged[tag] = float(value)
        if summary_values:
            self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=summary_values)))
        self._rows.writerow(row)
        self._csv.flush()
        self.points += 1
        return step, tagged

    def record_status(self, elapsed: float, status: dict[str, Any]) -> Point | None:
        """One point from a gateway /status (what ``record`` returns)."""
        summary = summarize(status)
        return self.record(elapsed, summary.get("env_steps") or 0.0, scalars(summary, status))

    def close(self) -> None:
        """Flush and close both; safe to call twice."""
        if not self._csv.closed:
            self._csv.close()
            self.writer.close()

    def __enter__(self) -> Curves:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
