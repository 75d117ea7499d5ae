"""Replay settings: FLYWHEEL_REPLAY_* variables or the same-named flags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flywheel.settings import CommonSettings


class ReplaySettings(CommonSettings):
    """Storage size, sampling, rate limiting, sockets, shared memory, demonstrations and checkpoints."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_REPLAY_", extra="forbid", validate_default=True,
                                      env_ignore_empty=True)

    capacity: int = Field(100_000, ge=1, le=50_000_000, description="transitions kept (FIFO eviction)")
    prioritized: bool = Field(True, description="proportional prioritized sampling (false: uniform)")
    alpha: float = Field(0.6, ge=0, le=1, description="priority exponent")
    max_priority: float = Field(
        1000.0, gt=0, le=1e12, allow_inf_nan=False, description="largest priority stored (an |n-step TD error|): "
        "higher ones, an actor's or a learner's, are stored as this and counted (priorities_clamped_total), so one "
        "row is drawn at most (max_priority)^alpha times as often as a row of priority 1 (63x at the defaults). "
        "The presets' rewards are clipped or scaled so that no real TD error comes near 1000")
    min_size_to_sample: int = Field(1000, ge=1, description="transitions stored before the first sample")
    samples_per_insert: float = Field(0.0, ge=0, description="target sampled/inserted ratio (0: unlimited)")
    error_buffer: float = Field(100_000.0, ge=0, description="allowed deviation from the ratio, in transitions")
    block_inserts: bool = Field(False, description="slow actors down when they run ahead of the ratio")
    dedup_frames: bool = Field(True, description="store each pixel frame once and rebuild stacks when sampling")
    frame_ratio: float = Field(1.1, ge=0.05, le=16, description="frame ring size per transition of capacity "
                               "(pixels; about 1 + 1/episode length is used)")
    frame_packing: Literal["off", "lz4"] = Field(
        "off", description="also keep each pixel frame as an LZ4 block (a quarter frame more memory) and send "
        "those to TCP learners: ~5x fewer bytes a batch; for learners on other hosts (shared memory needs none)")
    gather_threads: int = Field(2, ge=1, le=2, description="threads copying a sampled batch (NumPy releases "
                                "the GIL; 2 uses a second core when one is free)")
    transitions_bind: str = Field("tcp://127.0.0.1:5555", description="PULL endpoint(s) actors push transitions to "
                                  "(comma-separated, e.g. ipc:///tmp/flywheel-replay.ipc,tcp://*:5555; an address "
                                  "other hosts reach needs CURVE keys or allow_plaintext)")
    sample_bind: str = Field("tcp://127.0.0.1:5556", description="ROUTER endpoint(s) learners sample from")
    transitions_hwm: int = Field(4, ge=1, description="receive high-water mark for transition batches, per actor "
                                 "connection (a batch is up to 256 rows: what waits for a rate limiter that holds "
                                 "inserts back grows with it and with the actors)")
    transitions_buffer_kb: int = Field(0, ge=0, le=1 << 20, description="kernel receive buffer of each transitions "
                                       "connection, KiB (0: the OS default, which TCP grows to a few MiB)")
    max_pending_requests: int = Field(256, ge=1, description="sample requests queued while the limiter waits")
    max_message_mb: int = Field(256, ge=1, le=4096, description="largest inbound message accepted")
    max_batch_size: int = Field(8192, ge=1, le=65536, description="most rows one sample request may ask for; "
                                "larger ones are refused with a sample_refused reply (the learner asks for "
                                "batch_size x batches_per_request)")
    env_id: str = Field("", max_length=128, description="the actors' environment id: its action count (found at "
                        "start as the learner finds it) bounds stored actions (empty: num_actions or unchecked)")
    max_abs_value: float = Field(1e6, gt=0, description="largest |reward| and |float observation| stored: a larger "
                                 "one, finite but absurd, overflows the loss of every batch it lands in (refused)")
    num_actions: int = Field(0, ge=0, le=1 << 20, description="actions of the environment: batches with an action "
                             "outside 0..num_actions-1 are refused (0: from env_id)")
    shm: bool = Field(True, description="answer same-host clients through shared-memory slots in /dev/shm")
    shm_slots: int = Field(4, ge=1, le=256, description="slots per client when it does not say how many")
    shm_max_slots: int = Field(16, ge=1, le=256, description="most slots one client may hold")
    shm_max_clients: int = Field(4, ge=1, le=256, description="most sampling clients holding a shared-memory "
                                 "segment at once (one learner normally); more are answered over the socket and "
                                 "counted (rejected_total{where=\"sample\",reason=\"shm_full\"})")
    shm_max_mb: int = Field(4096, ge=1, le=1 << 20, description="most MiB of shared-memory segments in all (RAM); a "
                            "segment that would pass it is not made: that client is answered over the socket, counted "
                            "as for shm_max_clients")
    demo_path: Path | None = Field(None, description="demonstrations directory (flywheel.demos format) to load")
    demo_ratio: float = Field(0.0, ge=0, lt=1, description="share of every batch drawn from the demonstrations")
    checkpoint_dir: Path | None = Field(None, description="where checkpoints go (unset: no checkpoints)")
    checkpoint_interval_s: float = Field(0.0, ge=0, description="periodic checkpoints (0: only on request/exit)")
    checkpoint_background: bool = Field(True, description="write checkpoints from a forked child, traffic going on")
    restore: bool = Field(True, description="restore the checkpoint in checkpoint_dir on start, if one exists")
    start_empty_on_bad_checkpoint: bool = Field(
        False, description="when the checkpoint is corrupt or does not fit: set it aside and start empty "
        "(default: refuse to start)")
    seed: int | None = Field(None, ge=0, description="seed of the sampler's draws (unset: random; flywheel run "
                                                     "derives it from --seed)")


@dataclass(frozen=True)
class EnvContract:
    """What every stored transition must fit: the env's action count and its observations (0 / None: unchecked)."""

    num_actions: int = 0
    obs_shape: tuple[int, ...] | None = None
    obs_dtype: str | None = None


def env_contract(settings: ReplaySettings) -> EnvContract:
    """``num_actions``, and with ``env_id`` the action count, observation shape and dtype of the env registry's
    spec (read without building the env where the registry knows it), so that the first peer to send a batch cannot
    decide what the replay stores. Raises ValueError with one line when the id is unknown or disagrees with
    ``num_actions``."""
    if not settings.env_id:
        return EnvContract(settings.num_actions)
    from flywheel.envs import env_spec  # imported late: env packages are heavy

    try:
        spec = env_spec(settings.env_id)
    except Exception as exc:  # unknown ids, missing env packages, a Gymnasium env that fails to build
        raise ValueError(f"replay env_id {settings.env_id!r}: {exc}") from None
    found = int(spec.n_actions)
    if settings.num_actions and settings.num_actions != found:
        raise ValueError(f"replay num_actions {settings.num_actions} disagrees with env_id {settings.env_id!r}, "
                         f"which has {found} actions: set one of them")
    return EnvContract(found, tuple(int(d) for d in spec.obs_shape), str(spec.obs_dtype))
