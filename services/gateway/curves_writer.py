"""Curves that outlive the run, written by the gateway (FLYWHEEL_GATEWAY_CURVES_DIR): a point of /status each tick.

The gateway sees every service wherever it runs, so `flywheel run`, compose and Kubernetes all get the same
tb/ and progress.csv (flywheel/curves.py), on whatever volume holds the folder.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from flywheel.curves import Curves

from . import views
from .transport import GatewayService

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
    started = time.monotonic()
    writer = _PointWriter(gw, curves, started)
    try:
        while True:
            await asyncio.sleep(interval_s)
            writer.point()
    finally:
        writer.point()  # the last point, as the run stops (every service stopped before the gateway)
        curves.close()


class _PointWriter:
    """One point of /status per call, once the totals are whole; a failed write is logged once and retried."""

    def __init__(self, gw: GatewayService, curves: Curves, started: float) -> None:
        self.gw, self.curves, self.started = gw, curves, started
        # continuing earlier rows whose services may have gone on: wait until every live instance has reported,
        # so the first point's totals are whole (a partial first total would be taken for services that started
        # again); after `flywheel run --resume` every counter starts from zero and any first point is right
        guess = curves.append and not curves.counters_from_zero
        self.grace_until = gw.started + (gw.settings.stale_after_s if guess else 0.0)
        self.failing = False

    def point(self) -> None:
        status = views.status(self.gw)
        if time.monotonic() < self.grace_until or "actor" not in status["services"]:
            return
        try:
            self.curves.record_status(time.monotonic() - self.started, status)
        except OSError as exc:
            if not self.failing:
                log.warning("curves: cannot write to %s (%s); retrying each point", self.curves.directory, exc)
            self.failing = True
        else:
            if self.failing:
                log.info("curves: writing to %s again", self.curves.directory)
            self.failing = False
