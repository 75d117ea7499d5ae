"""The update's metric sums on the device: per-batch loss/TD/Q tensors folded in a few ops, read in one host sync."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_PENDING_METRICS = 256  # per-batch metric tensors kept before they are folded into the device sums


@dataclass
class MetricSums:
    """What the device accumulated since the last read."""

    loss: float
    td_error: float
    q: float
    batches: int
    skipped_total: int
    demo_rows: int = 0  # demonstration rows trained on
    margin_loss: float = 0.0  # sum of their large-margin losses


class DeviceSums:
    """Loss, |TD| and Q of every batch, and demonstration rows with their margin loss, kept on the device.

    ``add`` only keeps a batch's tensors (no ops per update); every ``MAX_PENDING_METRICS`` batches, and at each
    ``drain``, they are reduced into the sums, which ``drain`` reads in one device-to-host copy.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._sums = torch.zeros(4, device=device)  # loss, td, q, batches folded from _pending
        self._demo_sums = torch.zeros(2, device=device)  # demonstration rows and their margin-loss sum

    def add(self, loss: torch.Tensor, td_abs: torch.Tensor, q_taken: torch.Tensor) -> None:
        """Keep one batch's loss, |TD| per sample and Q of the taken actions (device tensors)."""
        self._pending.append((loss, td_abs, q_taken))
        if len(self._pending) >= MAX_PENDING_METRICS:
            self._fold()

    def add_demos(self, demo_stats: torch.Tensor) -> None:
        """Add one batch's (demonstration rows, margin-loss sum)."""
        self._demo_sums += demo_stats

    def _fold(self) -> None:
        """Reduce the kept per-batch tensors into the device sums (a few ops for many batches)."""
        if not self._pending:
            return
        losses, tds, qs = zip(*self._pending, strict=True)
        size = tds[0].shape[0]
        if all(t.shape[0] == size for t in tds):  # the usual case: one reduction per kind
            td_sum = torch.stack(tds).float().mean(dim=1).sum()
            q_sum = torch.stack(qs).float().mean(dim=1).sum()
        else:
            td_sum = torch.stack([t.float().mean() for t in tds]).sum()
            q_sum = torch.stack([q.float().mean() for q in qs]).sum()
        count = torch.full((), float(len(tds)), device=self.device)  # a fill kernel, not a host copy
        self._sums += torch.stack((torch.stack(losses).float().sum(), td_sum, q_sum, count))
        self._pending.clear()

    def drain(self, applied_steps: torch.Tensor | None, steps: int) -> MetricSums:
        """The sums since the last call, read together with ``applied_steps`` (the optimizer's step count on the
        device, None before the first step), so ``skipped_total`` = ``steps`` minus it costs no second read."""
        self._fold()
        applied = (applied_steps.reshape(1).to(self._sums) if applied_steps is not None
                   else torch.zeros(1, device=self.device))
        loss, td, q, batches, applied_count, demo_rows, margin = torch.cat(
            (self._sums, applied, self._demo_sums)).tolist()
        self._sums.zero_()
        self._demo_sums.zero_()
        return MetricSums(loss=loss, td_error=td, q=q, batches=int(batches), skipped_total=steps - int(applied_count),
                          demo_rows=int(demo_rows), margin_loss=margin)
