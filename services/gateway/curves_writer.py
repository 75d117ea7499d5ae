"""Curves that outlive the run, written by the gateway (FLYWHEEL_GATEWAY_CURVES_DIR): a point of /status each tick.

The gateway sees every service wherever it runs, so `flywheel run`, compose and Kubernetes all get the same
tb/ and progress.csv (flywheel/curves.py), on whatever volume holds the folder.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from flywheel.curves import Curves, Point

from . import views
from .transport import GatewayService

if TYPE_CHECKING:
    from flywheel.tracking import WandbSink

log = logging.getLogger("flywheel.gateway")


async def write_curves(gw: GatewayService, directory: Path, interval_s: float) -> None:
    """Append one point every ``interval_s`` until cancelled; a failed write is logged once and retried."""
    try:
        curves = await asyncio.to_thread(Curves, directory, resume=True)  # imports torch's TensorBoard writer
    except (OSError, ImportError) as exc:
        log.error("curves: cannot write curves to %s (%s); the gateway runs on without them", directory, exc)
        return
    log.info("curves: TensorBoard events in %s and %s, a point every %g s (%s)", directory / "tb",
             curves.csv_path, interval_s, "continuing the earlier rows" if curves.append else "new")
    tracker = await _start_tracking(gw, curves)
    started = time.monotonic()
    writer = _PointWriter(gw, curves, started, tracker)
    sending: asyncio.Future[None] | None = None
    try:
        while True:
            await asyncio.sleep(interval_s)
            writer.track(writer.point())
            if tracker is not None and (sending is None or sending.done()):  # W&B may block (starting, online):
                sending = asyncio.ensure_future(asyncio.to_thread(writer.send))  # off the loop, one send at a time
    finally:
        writer.track(writer.point())  # the last point, as the run stops (every service stopped before the gateway)
        curves.close()
        if tracker is not None:
            tracker.close(wait_s=5.0)  # sends what is queued (after a send under way) and finishes the run
            gw.tracking_failures = tracker.failures


async def _start_tracking(gw: GatewayService, curves: Curves) -> WandbSink | None:
    """The W&B sink of the curves' points (FLYWHEEL_GATEWAY_TRACK), its run started or resumed with the curves."""
    s = gw.settings
    if not s.track:
        return None
    from flywheel.tracking import WandbSink, parse_tags, run_config

    fields = ("instance", "curves_dir", "curves_interval_s", "track_project", "track_entity", "track_group",
              "track_tags", "track_mode", "track_dir")
    config = run_config(curves.directory, {name: getattr(s, name) for name in fields})
    env_id = config.get("env_id")
    try:
        tracker = await asyncio.to_thread(
            WandbSink, s.track_dir or curves.directory, project=s.track_project, entity=s.track_entity,
            group=s.track_group, tags=parse_tags(s.track_tags), mode=s.track_mode, config=config,
            resume=curves.append, id_folder=curves.directory,
            name=f"{env_id} {curves.directory.name}" if env_id else None)
    except Exception as exc:  # the wandb import (checked at start) or the run id file
        gw.tracking_failures += 1
        log.error("tracking: cannot track to W&B (%s); the gateway runs on without it", exc)
        return None
    return tracker  # its run starts with the first send; a failure is logged, counted and tried again


class _PointWriter:
    """One point of /status per call, once the totals are whole; a failed write is logged once and retried."""

    def __init__(self, gw: GatewayService, curves: Curves, started: float, tracker: WandbSink | None = None) -> None:
        self.gw, self.curves, self.started, self.tracker = gw, curves, started, tracker
        # continuing earlier rows whose services may have gone on: wait until every live instance has reported,
        # so the first point's totals are whole (a partial first total would be taken for services that started
        # again); after `flywheel run --resume` every counter starts from zero and any first point is right
        guess = curves.append and not curves.counters_from_zero
        self.grace_until = gw.started + (gw.settings.stale_after_s if guess else 0.0)
        self.failing = False

    def point(self) -> Point | None:
        """Write one point; what was written (step, values by tag) for the tracker, or None."""
        status = views.status(self.gw)
        if time.monotonic() < self.grace_until or "actor" not in status["services"]:
            return None
        try:
            point = self.curves.record_status(time.monotonic() - self.started, status)
        except OSError as exc:
            if not self.failing:
                log.warning("curves: cannot write to %s (%s); retrying each point", self.curves.directory, exc)
            self.failing = True
            return None
        if self.failing:
            log.info("curves: writing to %s again", self.curves.directory)
        self.failing = False
        return point

    def track(self, point: Point | None) -> None:
        """Queue a written point for W&B: the same step and values (``send`` sends it)."""
        if self.tracker is not None and point is not None and point[1]:
            self.tracker.add(*point)

    def send(self) -> None:
        """Send the queued points (a worker thread); a failure is logged once, counted, and retried next time."""
        if self.tracker is not None:
            self.tracker.flush()  # never raises
            self.gw.tracking_failures = self.tracker.failures
