"""W&B tracking (``--track``) of the gateway's curve points, online or offline (the CLI flags:
flywheel.launch.tracking_cli)."""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import string
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from flywheel.extras import DISTRIBUTION, MissingExtra

log = logging.getLogger("flywheel.tracking")

INSTALL_HINT = f"pip install '{DISTRIBUTION}[track]'"
RUN_ID_FILE = "wandb-run-id"  # in the curves folder: the W&B run the curves there belong to (resumed with them)
Mode = Literal["online", "offline"]
MODES = ("online", "offline")
MAX_TAG_CHARS = 64  # W&B refuses longer tags
RETRY_START_S = 60.0  # a W&B run that failed to start is tried again at most this often
BACKLOG_POINTS = 10_000  # points kept while W&B refuses them, sent in order once it takes them again
_ID_CHARS = string.ascii_lowercase + string.digits


class TrackingUnavailable(MissingExtra):
    """Tracking was asked for but wandb cannot be imported; the message is one line naming the track extra."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("track", "W&B tracking", cause)


def require_wandb() -> ModuleType:
    """The ``wandb`` module, or TrackingUnavailable naming the extra that installs it."""
    try:
        import wandb
    except ImportError as exc:
        raise TrackingUnavailable(exc) from None
    return wandb


def default_mode(environ: Mapping[str, str] | None = None) -> Mode:
    """``offline`` when WANDB_MODE says offline (or its old name dryrun), else ``online``."""
    mode = (os.environ if environ is None else environ).get("WANDB_MODE", "").strip().lower()
    return "offline" if mode in ("offline", "dryrun") else "online"


def parse_tags(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; ValueError for a tag W&B would refuse (over 64 characters)."""
    tags = [tag.strip() for tag in text.split(",") if tag.strip()]
    for tag in tags:
        if len(tag) > MAX_TAG_CHARS:
            raise ValueError(f"tag {tag[:20]!r}... is longer than {MAX_TAG_CHARS} characters")
    return list(dict.fromkeys(tags))


def offline_glob(track_dir: str | Path) -> str:
    """Where offline runs land: TRACK_DIR/wandb/offline-run-* (one folder per start; a resumed run adds one)."""
    return f"{Path(track_dir) / 'wandb'}/offline-run-*"


def sync_command(track_dir: str | Path) -> str:
    """The command that uploads the offline runs under ``track_dir`` (resumed parts in order, as one run)."""
    return f"wandb sync {shlex.quote(str(Path(track_dir) / 'wandb'))}/offline-run-*"


def describe(mode: str, track_dir: str | Path, project: str, entity: str = "", group: str = "") -> str:
    """One line saying where tracking goes, for the start of a run."""
    where = f"project {project}" + (f", entity {entity}" if entity else "") + (f", group {group}" if group else "")
    if mode == "offline":
        return (f"flywheel: tracking to W&B offline ({where}) in {Path(track_dir) / 'wandb'}; upload later with: "
                f"{sync_command(track_dir)}")
    return f"flywheel: tracking to W&B online ({where}); the run's URL is in the gateway log, a copy in " \
           f"{Path(track_dir) / 'wandb'}"


def run_config(folder: Path, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The W&B run's config: FOLDER/run.json (what ``flywheel run`` started) when there is one, plus ``settings``."""
    from flywheel.launch.runfolder import RunConfigError, load_run_config

    try:
        saved = load_run_config(folder) or {}
    except RunConfigError as exc:
        log.warning("tracking: %s; the W&B config holds the gateway's settings only", exc)
        saved = {}
    config = {k: v for k, v in saved.items() if k not in ("format", "format_version")}
    config["gateway"] = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    return config


def _new_id() -> str:
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def run_id(folder: Path, resume: bool) -> str:
    """The W&B run id of the curves in ``folder``: the saved one when they continue (``resume``), else a new one."""
    path = folder / RUN_ID_FILE
    if resume:
        try:
            saved = path.read_text().strip()
        except OSError:
            saved = ""
        if saved and len(saved) <= 64 and all(c in _ID_CHARS + "-_" for c in saved):
            return saved
    new = _new_id()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RUN_ID_FILE}.{os.getpid()}.tmp")
    tmp.write_text(new + "\n")
    os.replace(tmp, path)
    return new


class WandbSink:
    """Sends curve points to one W&B run: ``log(step, values)`` per point, ``close()`` at the end.

    The run starts on the first call (or ``start()``); with ``resume`` it continues the run whose id the curves
    folder keeps (``resume="allow"``), so the curves and the W&B run go on together. Steps never go back: a point
    below the last one is left out (one at the same step updates it). A call that fails never raises: it is
    logged once, counted in ``failures``, and its points are sent again with the next call (a run that failed to
    start is tried again at most every ``retry_start_s``).
    """

    def __init__(self, directory: str | Path, *, project: str = "flywheel", entity: str = "", group: str = "",
                 tags: Sequence[str] = (), mode: str = "online", config: Mapping[str, Any] | None = None,
                 resume: bool = False, id_folder: str | Path | None = None, name: str | None = None,
                 retry_start_s: float | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.wandb = require_wandb()
        self.directory = Path(directory)
        self.project, self.entity, self.group, self.tags = project, entity, group, list(tags)
        self.mode, self.config, self.name = mode, dict(config or {}), name
        self.resume = resume
        self.run_id = run_id(Path(id_folder) if id_folder is not None else self.directory, resume)
        self.retry_start_s = RETRY_START_S if retry_start_s is None else retry_start_s
        self.run: Any = None
        self.failures = 0
        self.points = 0
        self.last_step = -1
        self.closed = False
        self._failing = False
        self._tried = False  # a start was attempted
        self._next_start = 0.0
        self._backlog: deque[tuple[int, dict[str, float]]] = deque(maxlen=BACKLOG_POINTS)
        self._lock = threading.Lock()  # W&B calls: the gateway sends from a worker thread, closes from its loop
        self._points = threading.Lock()  # the queue, held only for a moment (``add`` never waits on W&B)

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        if not self._failing:
            log.warning("tracking: W&B %s failed (%s: %s); tried again with later points (the last %d kept "
                        "meanwhile); further failures are only counted", what, type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "", BACKLOG_POINTS)
        self._failing = True

    def _start(self) -> bool:
        if self.run is not None:
            return True
        if self.closed or time.monotonic() < self._next_start:
            return False
        self._next_start = time.monotonic() + self.retry_start_s
        self._tried = True
        wandb = self.wandb
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False)
            self.run = wandb.init(
                project=self.project, entity=self.entity or None, group=self.group or None, tags=self.tags or None,
                name=self.name, job_type="train", dir=str(self.directory), id=self.run_id, resume="allow",
                mode=self.mode, config=self.config, allow_val_change=True, reinit="create_new", settings=settings)
        except Exception as exc:  # wandb raises many kinds (no API key, no network, its service gone)
            self._fail("start", exc)
            return False
        log.info("tracking: W&B run %s %s (%s, project %s) in %s", self.run_id,
                 "resumed" if self.resume else "started", self.mode, self.project, self.directory / "wandb")
        self.resume = True  # a start after this one (its service gone) continues the same run
        return True

    def start(self) -> bool:
        """Start (or resume) the W&B run now; False when that failed (it is tried again later)."""
        with self._lock:
            return self._start()

    def log(self, step: int, values: Mapping[str, float]) -> bool:
        """One point: ``values`` by name (TensorBoard tags), at ``step`` env steps. True when W&B took it."""
        return self.add(step, values) and self.flush()

    def add(self, step: int, values: Mapping[str, float]) -> bool:
        """Queue one point without calling W&B (``flush`` sends it); False when it is left out (a step back)."""
        with self._points:
            if self.closed or step < self.last_step:
                return False
            self.last_step = step
            self._backlog.append((int(step), dict(values)))  # past BACKLOG_POINTS the oldest gives way
            return True

    def flush(self) -> bool:
        """Send the queued points in order (starting the run first if need be); True when none is left."""
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        if not self._start():
            return False
        try:
            while True:
                with self._points:
                    if not self._backlog:
                        break
                    step, values = self._backlog[0]
                self.run.log(values, step=step)
                with self._points:
                    if self._backlog and self._backlog[0][0] == step:
                        self._backlog.popleft()
                self.points += 1
        except Exception as exc:
            self._fail("log", exc)
            self.run = None  # its service may be gone: the next call starts (resumes) the run again
            return False
        if self._failing:
            log.info("tracking: W&B takes points again")
            self._failing = False
        return True

    def close(self, wait_s: float | None = None) -> None:
        """Send what is left to a started run and finish it (offline: its files are then whole); safe to call twice.

        ``wait_s``: how long to wait for a send under way in another thread (None: as long as it takes); a run
        that failed to start is not tried again now, so a stop is not held up by W&B being unreachable."""
        if not self._lock.acquire(timeout=-1 if wait_s is None else wait_s):
            log.warning("tracking: W&B still busy after %g s; the run is left unfinished (`wandb sync` its folder)",
                        wait_s)
            return
        try:
            if self.closed:
                return
            if self._backlog and (self.run is not None or not self._tried):  # a start that failed is not retried
                self._flush()
            with self._points:
                self.closed = True
            run, self.run = self.run, None
            if run is None:
                return
            try:
                run.finish()
                # and wait for wandb's service to stop: only then are the offline files whole (finish returns once
                # the run is done, maybe before its file is written out); the next run starts a new service
                self.wandb.teardown()
            except Exception as exc:
                self._fail("finish", exc)
        finally:
            self._lock.release()

    def __enter__(self) -> WandbSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
