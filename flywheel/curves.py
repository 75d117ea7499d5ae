"""Training curves that outlive a run: TensorBoard events in CHECKPOINT_DIR/tb and CHECKPOINT_DIR/progress.csv."""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TB_DIR = "tb"
CSV_FILE = "progress.csv"
# CSV column -> TensorBoard tag; env steps (the x axis) and seconds since the first run's start lead the row.
TAGS = {
    "return": "returns/episode",
    "greedy_return": "returns/greedy",
    # the env's own measures (flywheel.envs.measures), level-start and restarted episodes apart: the labels the env
    # gives them are in the text summary MEASURES_TAG
    "progress_mean": "episodes/progress_mean",
    "restarted_progress_mean": "episodes/restarted_progress_mean",
    "success_rate": "episodes/success_rate",
    "restarted_success_rate": "episodes/restarted_success_rate",
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
MEASURES_TAG = "env/measures"  # a TensorBoard text: which measure of the env each progress/success curve shows
# the curves of the env's measures: (tag, label key in ``summarize``, what the curve is of that measure)
MEASURE_CURVES = (
    ("episodes/progress_mean", "progress_label", "level-start episodes, mean"),
    ("episodes/restarted_progress_mean", "progress_label", "restarted episodes, mean"),
    ("episodes/success_rate", "success_label", "level-start episodes, rate"),
    ("episodes/restarted_success_rate", "success_label", "restarted episodes, rate"),
    ("eval/progress_mean", "eval_progress_label", "evaluation, mean"),
    ("eval/success_rate", "eval_success_label", "evaluation, rate"),
)
MAX_LABEL_CHARS = 64  # a label comes from a peer's telemetry info
Point = tuple[int, dict[str, float]]  # what Curves.record wrote: the step (env steps) and the values by tag
# Left by ``flywheel run --resume``, which starts every service again: the next writer adds all the env steps it
# sees to the last row (its counters started at zero) instead of guessing, and removes the mark.
FRESH_MARK = ".curves-counters-restart"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _gauge(gauges: list[dict[str, Any]], key: str) -> list[float]:
    return [float(g[key]) for g in gauges if g.get(key) is not None]


def _label(instances: list[dict[str, Any]], key: str) -> str | None:
    """A label the instances' telemetry info carries (the first that has one), else None."""
    found = next((i.get("info", {}).get(key) for i in instances if i.get("info", {}).get(key)), None)
    return None if found is None else str(found)[:MAX_LABEL_CHARS]


def summarize(status: dict[str, Any]) -> dict[str, Any]:
    """The numbers the progress line shows, from the gateway's /status (labels: str or None, the rest numbers).

    The env's measures carry /status summary's names (progress_mean, success_rate, progress_label, ...)."""
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
    progress_max = _gauge(gauges, "episode_progress_max")
    return {
        "env_steps": services.get("actor", {}).get("totals", {}).get("env_steps_total", 0.0),
        "env_steps_per_second": sum(g.get("env_steps_per_second", 0.0) for g in gauges),
        "updates": learners[0].get("counters", {}).get("updates_total", 0.0) if learners else 0.0,
        "updates_per_second": learner.get("updates_per_second", 0.0),
        "return": sum(returns) / len(returns) if returns else None,
        "greedy_return": max(greedy) if greedy else None,
        "progress_mean": _mean(_gauge(gauges, "episode_progress_mean")),  # the env's measures (None without)
        "progress_max": max(progress_max) if progress_max else None,
        "success_rate": _mean(_gauge(gauges, "episode_success_rate")),
        "restarted_progress_mean": _mean(_gauge(gauges, "restarted_progress_mean")),
        "restarted_success_rate": _mean(_gauge(gauges, "restarted_success_rate")),
        "progress_label": _label(actors, "progress_label"), "success_label": _label(actors, "success_label"),
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
        "eval_progress_label": _label(learners[:1], "eval_progress_label"),
        "eval_success_label": _label(learners[:1], "eval_success_label"),
        "actors_up": float(len(actors)),
    }


def scalars(summary: dict[str, Any], status: dict[str, Any]) -> dict[str, float | None]:
    """The curve values of one progress tick: ``summarize``'s numbers plus the loss and the policy lag."""
    services = status.get("services", {})

    def gauges(service: str) -> list[dict[str, Any]]:
        return [i.get("gauges", {}) for i in services.get(service, {}).get("instances", []) if i.get("up")]

    learners = gauges("learner")
    loss = learners[0].get("loss") if learners else None
    values: dict[str, float | None] = {column: summary.get(column) for column in TAGS}
    values["loss"] = None if loss is None else float(loss)
    values["policy_lag"] = _mean(_gauge(gauges("actor"), "policy_lag_versions"))
    return values


def measures_text(summary: dict[str, Any]) -> str:
    """The TensorBoard text (markdown) naming the env's measure behind each progress/success curve; "" without."""
    rows = [f"| {tag} | {summary[key]} ({what}) |" for tag, key, what in MEASURE_CURVES if summary.get(key)]
    return "\n".join(["| curve | measure |", "|---|---|", *rows]) if rows else ""


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            return list(reader.fieldnames or ()), rows
    except (OSError, csv.Error):
        return [], []


def _number(value: str | None) -> float:
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0


def _rewrite(path: Path, fields: Sequence[str], rows: list[dict[str, str]]) -> None:
    """``path`` again with the header ``fields`` (rows keep their values by column), replaced in one step."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


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
    A continued CSV whose header differs (columns of an earlier version) gets today's columns first, and keeps
    the columns it had that today's do not (empty in the new rows).
    """

    def __init__(self, directory: str | Path, *, resume: bool = False, flush_secs: int = 10) -> None:
        # TensorBoard events through tensorboardX's public SummaryWriter (no torch in the gateway: about 190 MB less)
        from tensorboardX import SummaryWriter

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.directory / CSV_FILE
        header, rows = _read(self.csv_path) if resume else ([], [])
        last = rows[-1] if rows else None
        self.step_offset = int(_number(last.get("env_steps"))) if last else 0
        self.time_offset = _number(last.get("elapsed_s")) if last else 0.0
        self.append = resume and last is not None
        fresh = self.directory / FRESH_MARK  # (elapsed, env steps) the counters started from, when appending:
        self._first: tuple[float, float] | None = (0.0, 0.0) if self.append and fresh.exists() else None  # or seen
        fresh.unlink(missing_ok=True)
        self.counters_from_zero = self._first is not None  # a partial first total cannot be misread then
        fields = [*COLUMNS, *(c for c in header if c not in COLUMNS)] if self.append else list(COLUMNS)
        if self.append and header != fields:
            _rewrite(self.csv_path, fields, rows)
        if not self.append:  # a new run in this folder: its curves start over, as its checkpoints do
            reset(self.directory)
        self._csv = open(self.csv_path, "a" if self.append else "w", newline="")  # closed in close()
        self._rows = csv.DictWriter(self._csv, fieldnames=fields, extrasaction="ignore")
        if not self.append:
            self._rows.writeheader()
            self._csv.flush()
        self._last_steps = 0.0
        self._measures = ""  # the MEASURES_TAG text written last
        # a file of its own per writer: tensorboardX names files by the second, so a writer reopened within the
        # same second (a gateway restarted, a resume) would overwrite the last one's events
        self.writer = SummaryWriter(str(self.directory / TB_DIR), flush_secs=flush_secs,
                                    filename_suffix=f".{os.getpid()}.{time.time_ns()}")
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
        row: dict[str, Any] = {"env_steps": step, "elapsed_s": f"{seconds:.1f}"}
        tagged: dict[str, float] = {}
        for column, tag in TAGS.items():
            value = values.get(column)
            if value is None or not math.isfinite(value):
                row[column] = ""
                continue
            row[column] = f"{value:.6g}"
            tagged[tag] = float(value)
            self.writer.add_scalar(tag, float(value), global_step=step)
        self._rows.writerow(row)
        self._csv.flush()
        self.points += 1
        return step, tagged

    def record_status(self, elapsed: float, status: dict[str, Any]) -> Point | None:
        """One point from a gateway /status (what ``record`` returns), and the env's measure labels once named."""
        summary = summarize(status)
        point = self.record(elapsed, summary.get("env_steps") or 0.0, scalars(summary, status))
        text = measures_text(summary)
        if point is not None and text and text != self._measures:
            self.writer.add_text(MEASURES_TAG, text, global_step=point[0])
            self._measures = text
        return point

    def close(self) -> None:
        """Flush and close both; safe to call twice."""
        if not self._csv.closed:
            self._csv.close()
            self.writer.close()

    def __enter__(self) -> Curves:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
