"""Entry point of the learner service: wires settings to the core (startup.py), its sockets and the loop."""

from __future__ import annotations

import logging
from typing import Any

import zmq

from flywheel.transport import EndpointInUse, install_stop_signals

from .settings import LearnerSettings
from .startup import log_start, start_core
from .transport import LearnerService

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
    ctx = zmq.Context()
    try:
        service = LearnerService(settings, core, ctx, start_version=start_version, resumed=resumed)
    except EndpointInUse as exc:
        log.error("learner: %s", exc)
        ctx.term()
        return 2
    service.counters["pretrain_updates_total"] = float(pretrained)  # the first weights published are these
    install_stop_signals(service.stop)
    log_start(settings, core, service.weights_endpoint)
    try:
        return service.run()
    finally:
        service.close()
        ctx.term()
