"""Reverb-style rate limiter: a minimum size, and a samples-per-insert ratio kept within an error band."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RateLimiter:
    """Counts inserted and sampled items; ``samples_per_insert`` 0 means no ratio is enforced.

    The learner waits while ``inserts * spi - samples`` would fall below ``min_diff``; when
    ``block_inserts`` is set, actors wait while it would exceed ``max_diff`` (Reverb's semantics). Reverb samples
    one item at a time; a request here takes ``count`` at once, so a request larger than the band
    (``2 * error_buffer``) is served once inserts are blocked: waiting could not help and would deadlock both sides.
    """

    min_size_to_sample: int = 1
    samples_per_insert: float = 0.0
    error_buffer: float = 100_000.0
    block_inserts: bool = False
    inserts: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        if self.min_size_to_sample < 1:
            raise ValueError("min_size_to_sample must be at least 1")
        if self.samples_per_insert < 0 or self.error_buffer < 0:
            raise ValueError("samples_per_insert and error_buffer must be non-negative")

    @property
    def min_diff(self) -> float:
        return self.samples_per_insert * self.min_size_to_sample - self.error_buffer

    @property
    def max_diff(self) -> float:
        return self.samples_per_insert * self.min_size_to_sample + self.error_buffer

    def can_sample(self, count: int, size: int) -> bool:
        if size < self.min_size_to_sample:
            return False
        if self.samples_per_insert <= 0:
            return True
        if self.inserts * self.samples_per_insert - (self.samples + count) >= self.min_diff:
            return True
        return self.block_inserts and not self.can_insert(1)  # the band is full: no insert can come to wait for

    def can_insert(self, count: int) -> bool:
        if not self.block_inserts or self.samples_per_insert <= 0:
            return True
        if self.inserts < self.min_size_to_sample:
            return True
        return (self.inserts + count) * self.samples_per_insert - self.samples <= self.max_diff

    def record_insert(self, count: int) -> None:
        self.inserts += count

    def record_sample(self, count: int) -> None:
        self.samples += count

    def state_dict(self) -> dict[str, int]:
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.inserts, self.samples = int(state["inserts"]), int(state["samples"])
