"""The learner's data path built from settings: replay client, control subscriber and feeder, as the service runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import zmq

from flywheel import proto
from flywheel.services.replay.client import ReplayClient
from flywheel.transport import ControlSubscriber, FaultCounter

from .core import LearnerCore
from .feeder import Feeder, ReadyBatch
from .sampling import batch_limits, batches_per_request
from .settings import LearnerSettings
from .staging import HostCopy

SERVICE = "learner"


@dataclass
class DataPath:
    """What brings batches to the update loop and priorities back: ``take`` a ready batch or command, ``done``
    with a batch's |TD| errors. The feeder's thread does the sampling I/O between."""

    client: ReplayClient
    control: ControlSubscriber
    feeder: Feeder
    group: int  # training batches per sample request

    def start(self) -> None:
        self.feeder.start()

    def take(self, timeout_ms: int) -> ReadyBatch | proto.Command[Any]:
        """The next ready batch or command, waiting up to ``timeout_ms``; raises queue.Empty when none came."""
        return self.feeder.events.get(timeout=timeout_ms / 1000)

    def done(self, ready: ReadyBatch, td_abs: torch.Tensor) -> None:
        """Hand back the |TD| errors of a trained batch (a fresh tensor: kept as a view on a CPU, copied off a GPU)."""
        self.feeder.done(ready.index, HostCopy({"p": td_abs}, copy=False), ready.lease)

    def close(self) -> None:
        """Stop the feeder (its queued priorities are sent first), then close the sockets."""
        self.feeder.stop()
        self.client.close()
        self.control.close()


def open_data_path(settings: LearnerSettings, core: LearnerCore, ctx: zmq.Context, faults: FaultCounter, *,
                   beta: float) -> DataPath:
    """The replay client, control subscriber and feeder the learner service samples through, from ``settings``;
    batches are checked and staged by ``core``. Not started: call ``start``."""
    group = batches_per_request(settings.batches_per_request, settings.batch_size, core.obs_shape)
    rows = settings.batch_size * group
    # Up to 2 x requests_in_flight requests are outstanding or queued (the feeder's bound); on a CPU a reply's slot
    # is leased until it is trained on, so the one in training and one whose priorities wait come on top. Should
    # they all be taken, the replay answers over the socket instead (shm_slots_exhausted_total).
    client = ReplayClient(settings.sample_endpoint, rows, inflight=settings.requests_in_flight, beta=beta,
                          transport=settings.sample_transport, ctx=ctx, limits=batch_limits(rows, core.obs_shape),
                          slots=2 * settings.requests_in_flight + 2, request_timeout_s=settings.request_timeout_s,
                          faults=faults, packed=settings.sample_packed, obs_shape=core.obs_shape)
    control: ControlSubscriber | None = None
    try:
        control = ControlSubscriber(ctx, settings.control_endpoint, SERVICE, settings.instance, faults)
        feeder = Feeder(ctx, client, control, faults, check=core.check_batch, stage=core.stager.stage, beta=beta,
                        train_batch=settings.batch_size, group=group, hold_shared=core.stager.keeps_views)
    except BaseException:
        if control is not None:
            control.close()
        client.close()
        raise
    return DataPath(client, control, feeder, group)
