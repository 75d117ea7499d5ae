"""How the learner asks for batches: its data-path settings, training batches per request and decoder limits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from flywheel import proto
from flywheel.settings import setting_default, shared_values

from .settings import LearnerSettings


def batch_limits(batch_size: int, obs_shape: tuple[int, ...]) -> proto.Limits:
    """Decoder limits that fit one batch of this shape (float32 observations, the worst case) and no more."""
    obs_bytes = math.prod(obs_shape) * 4
    max_batch = 2 * batch_size * (obs_bytes + 64) + (1 << 20)
    return proto.Limits(max_total_bytes=max_batch, max_array_bytes=max_batch)


TARGET_REQUEST_TRANSITIONS = 4096  # auto grouping: small batches are fetched this many transitions at a time
MAX_AUTO_GROUP = 32


def batches_per_request(choice: int, batch_size: int, obs_shape: tuple[int, ...]) -> int:
    """Training batches per sample request: ``choice``, or for 0 (auto) 1 with pixels, else ~4096 transitions.

    Every request, reply and priority message costs tens of microseconds on each side; for small vector
    batches that is a noticeable share of an update, so several are fetched at once.
    """
    if choice > 0:
        group = choice
    elif len(obs_shape) == 3:
        group = 1
    else:
        group = max(1, min(MAX_AUTO_GROUP, TARGET_REQUEST_TRANSITIONS // batch_size))
    return max(1, min(group, 65536 // batch_size))


@dataclass(frozen=True)
class FeedConfig:
    """What the learner's data path takes of its settings (LearnerSettings' fields of the same names)."""

    sample_endpoint: str = setting_default(LearnerSettings, "sample_endpoint")
    sample_transport: Literal["auto", "shm", "tcp"] = setting_default(LearnerSettings, "sample_transport")
    sample_packed: bool = setting_default(LearnerSettings, "sample_packed")
    batch_size: int = setting_default(LearnerSettings, "batch_size")
    batches_per_request: int = setting_default(LearnerSettings, "batches_per_request")
    requests_in_flight: int = setting_default(LearnerSettings, "requests_in_flight")
    request_timeout_s: float = setting_default(LearnerSettings, "request_timeout_s")
    beta_start: float = setting_default(LearnerSettings, "beta_start")

    @classmethod
    def of(cls, settings: LearnerSettings) -> FeedConfig:
        """The values of ``settings`` this config holds."""
        return cls(**shared_values(settings, cls))
