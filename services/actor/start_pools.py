"""The actor's start-state pools in its checkpoint folder: read at a resumed start, written now and then and at stop."""

from __future__ import annotations

import logging
import os
import re
import time

from flywheel.envs.vector import PoolReport, VectorEnv

from .core import ActorCore
from .nstep import Emitted
from .settings import ActorSettings

log = logging.getLogger("flywheel.actor")


class StartPools:
    """Each env slot's start-state pool (flywheel.envs.start_states) as ``DIRECTORY/<actor>-env<slot>.npz``.

    A fault of a file (missing, corrupt, of another env) is one log line and an empty pool for its slot, never a
    stop; so is a file that cannot be written (the older one stays).
    """

    def __init__(self, directory: str, actor: str, interval_s: float, now: float) -> None:
        """Write every ``interval_s`` seconds (from ``now``) to ``directory``, files keyed by ``actor``."""
        self.directory, self.actor, self.interval_s = directory, actor, interval_s
        self.next_save = now + interval_s

    def load(self, vec: VectorEnv) -> PoolReport:
        """Read the pools of ``vec``'s slots (before its first reset); one log line says what was found."""
        report = vec.load_start_states(self.directory, self.actor)
        beyond = self._beyond(vec.num_envs)
        if report.files or report.failed or beyond:
            parts = [f"start states: {report.files} of {report.slots} env slots' pools read from {self.directory} "
                     f"({report.states} states"]
            parts[0] += f", {report.dropped} not kept)" if report.dropped else ")"
            if report.missing:
                parts.append(f"{len(report.missing)} without a file start empty")
            parts += [f"{why} (starts empty)" for why in report.failed]
            if beyond:
                parts.append(f"{beyond} file(s) of slots beyond this actor's {vec.num_envs} envs left unread")
            (log.warning if report.failed or beyond or report.missing else log.info)("%s", "; ".join(parts))
        elif report.slots:
            log.info("start states: no pools of %s in %s: every env starts empty", self.actor, self.directory)
        return report

    def _beyond(self, num_envs: int) -> int:
        """Pool files of this actor for slots it does not have (a resume with fewer envs)."""
        pattern = re.compile(re.escape(self.actor) + r"-env(\d+)\.npz")
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        return sum(1 for name in names if (m := pattern.fullmatch(name)) and int(m.group(1)) >= num_envs)

    def due(self, now: float) -> bool:
        """Whether a periodic save is due."""
        return now >= self.next_save

    def save(self, core: ActorCore, now: float) -> list[Emitted]:
        """Write the pools (the groups in flight settled first); the rows their settling made ready."""
        self.next_save = now + self.interval_s
        rows = core.settle()
        try:
            os.makedirs(self.directory, exist_ok=True)
            report = core.vec.save_start_states(self.directory, self.actor)
        except OSError as exc:
            log.warning("start states: pools not written to %s: %s", self.directory, exc)
            return rows
        if report.failed:
            log.warning("start states: %d of %d pools not written (%s)", len(report.failed), report.slots,
                        "; ".join(report.failed))
        else:
            log.debug("start states: %d pools (%d states) written to %s", report.files, report.states,
                      self.directory)
        return rows


def start_pools(settings: ActorSettings) -> StartPools | None:
    """The pools the settings ask for: with the start-state curriculum on and a checkpoint folder (None: none)."""
    if settings.start_states() is None or not settings.checkpoint_dir:
        return None
    return StartPools(settings.checkpoint_dir, settings.instance, settings.checkpoint_interval_s, time.monotonic())
