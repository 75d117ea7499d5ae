"""Entry point of the learner service: wires settings to the core (startup.py), its sockets (transport.py) and the
loop (loop.py)."""

from __future__ import annotations

import logging
from typing import Any

from flywheel.transport import EndpointInUse, install_stop_signals

from .loop import LearnerLoop, LoopConfig
from .settings import LearnerSettings
from .startup import log_start, start_core
from .transport import open_sockets

log = logging.getLogger("flywheel.learner")


def main(settings: LearnerSettings, *, spec: Any = None) -> int:
    """Run the learner until SIGINT/SIGTERM or max_updates; returns the process exit code.

    ``spec`` (anything with ``obs_shape`` and ``n_actions``) overrides the lookup of ``settings.env_id``.
    """
    if not logging.getLogger().handlers:  # the CLI normally configures logging; stand-alone runs still get lines
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("flywheel").setLevel(settings.log_level)
    started = start_core(settings, spec)
    if started is None:
        return 2
    core, start_version, pretrained, resumed = started
    try:
        sockets = open_sockets(settings, core)
    except EndpointInUse as exc:
        log.error("learner: %s", exc)
        return 2
    try:
        loop = LearnerLoop(LoopConfig.of(settings), core, sockets, start_version=start_version, resumed=resumed)
    except BaseException:
        sockets.close()
        raise
    loop.counters.pretrain_updates_total = float(pretrained)  # the first weights published are these
    install_stop_signals(loop.stop)
    log_start(settings, core, loop.weights_endpoint)
    try:
        return loop.run()
    finally:
        loop.close()
