"""Behaviour-cloning pretraining on a demonstrations set before RL: parallel loading, then N updates (DQfD or BC).

The set is read by a pool of threads (each episode file: CRC, zip inflate, validation; NumPy releases the GIL for
the heavy parts), kept once per frame in host memory, and minibatches are gathered from it by a prefetch thread
while the previous update runs. Batches go through the core's stager: on CUDA that copies them into pinned buffers
and sends them with non-blocking copies on a side stream. Pretraining has its own Adam (the RL optimizer starts
fresh) and ends with the target network set to the cloned online network. No sockets here.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from flywheel import proto
from flywheel.demos.format import DemoFileError, DemoFrames, DemoSet
from flywheel.settings import setting_default

from .core import LearnerCore
from .losses import cross_entropy_loss, large_margin_loss
from .settings import LearnerSettings

log = logging.getLogger("flywheel.learner")
PREFETCH_BATCHES = 4
PretrainLog = Callable[["PretrainProgress"], None]


@dataclass
class DemoData(DemoFrames):
    """Every transition of a set in host memory: observations once, transitions as row numbers into them."""

    env_id: str
    episodes: int
    load_seconds: float


@dataclass
class PretrainProgress:
    """Where pretraining stands: updates done, means over the last window and the rate."""

    updates: int
    total: int
    loss: float
    margin_loss: float
    expert_agreement: float  # share of rows whose greedy action is the expert's
    updates_per_second: float
    seconds: float


def load_demos(path: str | Path, obs_shape: tuple[int, ...], n_actions: int, *, workers: int = 0) -> DemoData:
    """Read and validate a whole set with ``workers`` threads (0 = cores); DemoFileError names what is wrong."""
    start = time.monotonic()
    demos = DemoSet(path)  # manifest, and every listed file present with its recorded size
    if demos.obs_shape != tuple(obs_shape):
        raise DemoFileError(f"{path} holds observations of shape {demos.obs_shape}; this learner's network takes "
                            f"{tuple(obs_shape)} (env {demos.env_id})")
    count = len(demos.manifest["episodes"])
    if count == 0 or demos.count == 0:
        raise DemoFileError(f"{path} holds no transitions")
    threads = max(1, min(workers or os.cpu_count() or 1, count))
    with ThreadPoolExecutor(threads, thread_name_prefix="demos-load") as pool:
        parts: list[DemoFrames] = list(pool.map(demos.episode_frames, range(count)))
    whole = DemoFrames.concatenate(parts)
    action = whole.rows.action
    if action.size and int(action.max()) >= n_actions:
        raise DemoFileError(f"{path} has action {int(action.max())}; this learner's network has {n_actions} actions")
    return DemoData(whole.observations, whole.rows, env_id=demos.env_id, episodes=count,
                    load_seconds=time.monotonic() - start)


class BatchPrefetcher:
    """A thread gathering random minibatches from ``DemoData`` into a small queue (a DataLoader for one array)."""

    def __init__(self, data: DemoData, batch_size: int, batches: int, seed: int | None = None) -> None:
        self.data, self.batch_size, self.batches = data, min(batch_size, len(data)), batches
        self.rng = np.random.default_rng(seed)
        self.queue: queue.Queue[proto.SampleBatch] = queue.Queue(PREFETCH_BATCHES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demos-prefetch", daemon=True)
        self._thread.start()

    def gather(self, rows: np.ndarray) -> proto.SampleBatch:
        """The batch of transitions ``rows``, every one a demonstration of weight 1 (index: the replay's name for
        demonstration row r, -1 - r)."""
        size = len(rows)
        return proto.SampleBatch(request_id=0, replay_size=len(self.data), index=-1 - rows.astype(np.int64),
                                 weight=np.ones(size, np.float32), is_demo=np.ones(size, np.uint8),
                                 **self.data.take(rows).arrays())

    def _run(self) -> None:
        for _ in range(self.batches):
            batch = self.gather(self.rng.integers(0, len(self.data), self.batch_size))
            while not self._stop.is_set():
                try:
                    self.queue.put(batch, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set():
                return

    def __iter__(self) -> DemoPrefetchIter:
        return DemoPrefetchIter(self)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class DemoPrefetchIter:
    """Takes the prefetcher's batches in order until it has handed out all of them."""

    def __init__(self, source: BatchPrefetcher) -> None:
        self.source, self.left = source, source.batches

    def __iter__(self) -> DemoPrefetchIter:
        return self

    def __next__(self) -> proto.SampleBatch:
        if self.left <= 0:
            raise StopIteration
        self.left -= 1
        return self.source.queue.get()


class Pretrainer:
    """N updates of the core's online network on demonstrations: DQfD (TD + lambda x margin) or cross-entropy BC."""

    def __init__(self, core: LearnerCore, *, loss: str = setting_default(LearnerSettings, "pretrain_loss"),
                 margin: float = setting_default(LearnerSettings, "demo_margin"),
                 margin_weight: float = setting_default(LearnerSettings, "demo_loss_weight"),
                 lr: float | None = None) -> None:
        if loss not in ("dqfd", "bc"):
            raise ValueError(f"pretraining loss must be dqfd or bc, got {loss!r}")
        if not margin > 0 or margin_weight < 0:
            raise ValueError(f"margin must be > 0 and its weight >= 0, got {margin} and {margin_weight}")
        self.core, self.loss, self.margin, self.margin_weight = core, loss, margin, margin_weight
        self.optimizer = torch.optim.Adam(core.params, lr=lr or core.config.lr, eps=core.config.adam_eps)
        self.updates = 0

    def step(self, batch: proto.SampleBatch) -> torch.Tensor:
        """One update; returns (loss, margin loss, expert agreement) as a device tensor (read it when logging)."""
        core = self.core
        b = core.stager.stage(batch)  # pinned buffers + side stream on CUDA
        b.use_on_current_stream()
        out = core.online.outputs(b.obs)
        q = core.online.q_values(out)
        margin = large_margin_loss(q, b.action, self.margin)
        if self.loss == "bc":
            loss = cross_entropy_loss(q, b.action).mean()
        else:
            terms = core.td_terms(out, b.action, b.reward, b.discount, *core.bootstrap_outputs(b.obs, b.next_obs))
            loss = (terms.per_sample + self.margin_weight * margin).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = core.config.grad_clip_norm if core.config.grad_clip_norm > 0 else math.inf
        torch.nn.utils.clip_grad_norm_(core.params, clip, foreach=True)
        self.optimizer.step()
        self.updates += 1
        if self.loss == "dqfd":
            self._refresh_target()
        agreement = (q.argmax(dim=1) == b.action).float().mean()
        return torch.stack((loss.detach(), margin.detach().mean(), agreement.detach()))

    def _refresh_target(self) -> None:
        config = self.core.config
        if config.tau > 0:
            with torch.no_grad():
                targets: list[torch.Tensor] = list(self.core.target.parameters())
                torch._foreach_lerp_(targets, self.core.params, config.tau)
        elif self.updates % config.target_update_interval == 0:
            self.core.sync_target()

    def run(self, data: DemoData, updates: int, batch_size: int, *, report: PretrainLog | None = None,
            report_every_s: float = 5.0, seed: int | None = None) -> PretrainProgress:
        """``updates`` minibatch updates; ``report`` gets progress every ``report_every_s`` seconds and at the end."""
        prefetch = BatchPrefetcher(data, batch_size, updates, seed)
        start = last_report = time.monotonic()
        window = torch.zeros(3, device=self.core.device)
        in_window = done_at_last = 0
        progress = PretrainProgress(0, updates, math.nan, math.nan, math.nan, 0.0, 0.0)
        try:
            for k, batch in enumerate(prefetch, start=1):
                window += self.step(batch)
                in_window += 1
                now = time.monotonic()
                if k == updates or now - last_report >= report_every_s:
                    loss, margin, agreement = (window / in_window).tolist()
                    progress = PretrainProgress(k, updates, loss, margin, agreement,
                                                (k - done_at_last) / max(now - last_report, 1e-9), now - start)
                    if report is not None:
                        report(progress)
                    window.zero_()
                    in_window, done_at_last, last_report = 0, k, now
        finally:
            prefetch.close()
        self.core.sync_target()  # RL starts with target = the cloned network
        return progress


def log_progress(progress: PretrainProgress) -> None:
    """One line per report: updates, losses, how often the greedy action is the expert's, and the rate."""
    log.info("learner: pretraining %d/%d updates (%.0f%%), loss %.4f, margin loss %.4f, greedy = expert on %.1f%% "
             "of demo rows, %.0f updates/s", progress.updates, progress.total, 100 * progress.updates /
             max(progress.total, 1), progress.loss, progress.margin_loss, 100 * progress.expert_agreement,
             progress.updates_per_second)


def pretrain_from_settings(core: LearnerCore, path: str, updates: int, batch_size: int, *, loss: str, margin: float,
                           margin_weight: float, workers: int, seed: int | None) -> PretrainProgress:
    """Load the set at ``path`` in parallel and pretrain ``core`` for ``updates`` updates, logging progress."""
    data = load_demos(path, core.obs_shape, core.n_actions, workers=workers)
    log.info("learner: loaded %d demonstration transitions (%d episodes of %s, %.1f MB) from %s in %.1f s; "
             "pretraining %d updates of %s (batch %d, margin %.2f x %.2f)", len(data), data.episodes, data.env_id,
             data.observations.nbytes / 1e6, path, data.load_seconds, updates, loss, batch_size, margin, margin_weight)
    trainer = Pretrainer(core, loss=loss, margin=margin, margin_weight=margin_weight)
    result = trainer.run(data, updates, batch_size, report=log_progress, seed=seed)
    log.info("learner: pretraining done: %d updates in %.1f s; greedy = expert on %.1f%% of the last demo rows",
             result.updates, result.seconds, 100 * result.expert_agreement)
    return result
