"""CPU variants of the learner's update, side by side: eager, channels-last, inductor, smaller inputs."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from flywheel import proto
from flywheel.bench.runner import Row, median
from flywheel.services.learner.core import CoreConfig, LearnerCore

BATCH = 32  # the pixel preset's CPU batch
N_ACTIONS = 7  # Mario's simple action set
# (key, label, input side, channels_last, compile); the first is the baseline every other is divided by
VARIANTS = (
    ("eager84", "eager, 84x84", 84, False, False),
    ("cl84", "channels-last, 84x84", 84, True, False),
    ("compile84", "inductor, 84x84", 84, False, True),
    ("clcompile84", "inductor + channels-last, 84x84 (the pixel preset)", 84, True, True),
    ("clcompile64", "inductor + channels-last, 64x64 input", 64, True, True),
    ("clcompile42", "inductor + channels-last, 42x42 input", 42, True, True),
)


def pixel_batch(obs_shape: tuple[int, ...], size: int, rng: np.random.Generator,
                n_actions: int = N_ACTIONS) -> proto.SampleBatch:
    """A replay's answer of ``size`` random uint8 frames, as the learner core takes it."""
    shape = (size, *obs_shape)
    return proto.SampleBatch(
        request_id=0, replay_size=10_000, index=np.arange(size, dtype=np.int64),
        weight=rng.uniform(0.1, 1.0, size).astype(np.float32),
        obs=rng.integers(0, 256, shape, dtype=np.uint8), action=rng.integers(0, n_actions, size).astype(np.int64),
        reward=rng.normal(size=size).astype(np.float32), discount=np.full(size, 0.9**3, dtype=np.float32),
        next_obs=rng.integers(0, 256, shape, dtype=np.uint8))


def cpu_variant_rows(runs: int, updates: int, progress: Callable[[str], None]) -> tuple[list[Row], list[str]]:
    """Updates/s of each variant (the real LearnerCore, in-memory batches), alternating within every run."""
    rng = np.random.default_rng(0)
    cores: dict[str, tuple[LearnerCore, proto.SampleBatch]] = {}
    notes: list[str] = []
    for key, label, side, channels_last, compiled in VARIANTS:
        config = CoreConfig(lr=1e-4, compile=compiled, channels_last=channels_last)
        core = LearnerCore((4, side, side), N_ACTIONS, config, "cpu")
        batch = pixel_batch((4, side, side), BATCH, rng)
        start = time.perf_counter()
        for _ in range(3):  # warm-up; the first compiled call compiles
            core.update(batch).priorities()
        notes.append(f"{label}: warm-up {time.perf_counter() - start:.1f} s (compile state {core.compile_state})")
        cores[key] = (core, batch)
    rates: dict[str, list[float]] = {key: [] for key in cores}
    chunk = max(1, updates // 8)
    for run in range(runs):
        spent = dict.fromkeys(cores, 0.0)
        for r in range(8):  # alternate in chunks so load swings hit every variant alike; rotate the order
            keys = list(cores)
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                core, batch = cores[key]
                start = time.perf_counter()
                for _ in range(chunk):
                    core.update(batch).priorities()
                spent[key] += time.perf_counter() - start
        for key in cores:
            rates[key].append(8 * chunk / spent[key])
        progress(f"CPU variants run {run + 1}/{runs}: " + ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in rates.items()))
    base = VARIANTS[0][0]
    rows = []
    for key, label, *_ in VARIANTS[1:]:
        ratios = [a / b for a, b in zip(rates[key], rates[base], strict=True)]
        rows.append(Row(case=f"Nature CNN, batch {BATCH}, CPU: {label}", metric="updates/s", unit="1/s",
                        flywheel=median(rates[key]), peer=median(rates[base]), peer_name="eager, 84x84",
                        flywheel_runs=rates[key], peer_runs=rates[base]))
        notes.append(f"{label}: median per-run ratio to eager 84x84 {median(ratios):.3f}")
    return rows, notes
