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
}
COLUMNS = ("env_steps", "elapsed_s", *TAGS)


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


class Curves:
    """Appends one point per progress tick to TensorBoard and to the CSV, with env steps as the step.

    A resumed run continues both: its env steps and seconds count on from the last row of progress.csv
    (the services' own counters start again from zero); a new run replaces them.
    """

    def __init__(self, directory: str | Path, *, resume: bool = False, flush_secs: int = 10) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.directory / CSV_FILE
        last = _last_row(self.csv_path) if resume else None
        self.step_offset = int(_number(last.get("env_steps"))) if last else 0
        self.time_offset = _number(last.get("elapsed_s")) if last else 0.0
        append = resume and last is not None
        self._csv = open(self.csv_path, "a" if append else "w", newline="")  # closed in close()
        self._rows = csv.DictWriter(self._csv, fieldnames=COLUMNS, extrasaction="ignore")
        if not append:  # a new run in this folder: its curves start over, as its checkpoints do
            self._rows.writeheader()
            self._csv.flush()
            for old in (self.directory / TB_DIR).glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(log_dir=str(self.directory / TB_DIR), flush_secs=flush_secs)
        self.points = 0

    def record(self, elapsed: float, env_steps: float, values: dict[str, float | None]) -> None:
        """One point: ``values`` by CSV column (None or NaN: left out of TensorBoard, empty in the CSV)."""
        step = self.step_offset + int(env_steps)
        seconds = self.time_offset + elapsed
        row: dict[str, Any] = {"env_steps": step, "elapsed_s": f"{seconds:.1f}"}
        now = time.time()
        for column, tag in TAGS.items():
            value = values.get(column)
            if value is None or not math.isfinite(value):
                row[column] = ""
                continue
            row[column] = f"{value:.6g}"
            self.writer.add_scalar(tag, value, global_step=step, walltime=now)
        self._rows.writerow(row)
        self._csv.flush()
        self.points += 1

    def record_status(self, elapsed: float, summary: dict[str, float | None], status: dict[str, Any]) -> None:
        """One point from the progress loop's gateway /status and its summary."""
        self.record(elapsed, summary.get("env_steps") or 0.0, scalars(summary, status))

    def close(self) -> None:
        """Flush and close both; safe to call twice."""
        if not self._csv.closed:
            self._csv.close()
            self.writer.close()

    def __enter__(self) -> Curves:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
