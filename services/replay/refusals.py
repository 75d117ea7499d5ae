"""Refusals on the sampling path: a fault-labelled error, and the checks a client makes before it expands a batch."""

from __future__ import annotations

from flywheel import proto


class Refused(ValueError):
    """A sample request or reply not served or used as sent; ``fault`` labels ``rejected_total{reason=...}``."""

    def __init__(self, fault: str, message: str) -> None:
        super().__init__(message)
        self.fault = fault


def check_fit(batch: proto.SampleBatch, rows: int, obs_shape: tuple[int, ...] | None, max_bytes: int, *,
              in_slot: bool) -> None:
    """Before anything is mapped or expanded: ``rows`` rows as asked, observations of ``obs_shape`` when given (a
    shared-memory slot's shape is checked when it is mapped) and a compact batch's stacks within ``max_bytes`` (the
    client's decode limit). Raises BadShape or OversizedMessage."""
    got = int(batch.action.shape[0])
    if got != rows:
        raise proto.BadShape(f"sample_batch: {got} rows, {rows} were asked for")
    expanded = batch.expanded_shape()
    if expanded is not None and batch.expanded_bytes() > max_bytes:
        raise proto.OversizedMessage(f"sample_batch: expands to {batch.expanded_bytes()} bytes, above this client's "
                                     f"limit of {max_bytes}")
    shape = expanded[1:] if expanded is not None else None if in_slot else tuple(batch.obs.shape[1:])
    if obs_shape is not None and shape is not None and shape != obs_shape:
        raise proto.BadShape(f"sample_batch: observations {shape}, this client expects {obs_shape}")
