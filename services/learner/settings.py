"""Learner settings: flags --field-name, environment FLYWHEEL_LEARNER_FIELD_NAME."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from flywheel.netspec import NetworkSpec
from flywheel.presets import DEFAULT_ENV
from flywheel.settings import CommonSettings


class LearnerSettings(CommonSettings, NetworkSpec):
    """How the learner trains, where it gets batches, where it publishes weights and keeps checkpoints; the network
    it trains is NetworkSpec's fields (dueling, hidden, head, num_quantiles, c51_atoms)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_LEARNER_", extra="forbid", validate_default=True,
                                      env_ignore_empty=True)

    env_id: str = Field(DEFAULT_ENV, min_length=1, max_length=128,
                        description="environment id; fixes the observation shape and number of actions")
    batch_size: int = Field(512, ge=1, le=65536, description="transitions per update (per sample request)")
    lr: float = Field(1e-4, gt=0, le=1, description="Adam learning rate")
    lr_final: float = Field(0.0, ge=0, le=1, description="Adam's learning rate after lr_decay_updates updates "
                            "(it goes linearly from lr; 0 = no schedule)")
    lr_decay_updates: int = Field(0, ge=0, le=1_000_000_000, description="updates over which the learning rate "
                                  "goes linearly from lr to lr_final, then stays (0 = lr throughout; a set_lr "
                                  "command ends the schedule)")
    adam_eps: float = Field(1.5e-4, gt=0, le=1, description="Adam epsilon")
    weight_decay: float = Field(0.0, ge=0, le=1, description="decoupled weight decay (AdamW's: each update takes "
                                "lr x this share of every weight away; 0 = plain Adam)")
    reset_interval_updates: int = Field(0, ge=0, le=1_000_000_000, description="shrink-and-perturb every this many "
                                        "updates from reset_start_updates on: each online weight becomes reset_shrink "
                                        "x itself + (1 - reset_shrink) x a fresh initialisation's (0 = never)")
    reset_start_updates: int = Field(0, ge=0, le=1_000_000_000, description="the update of the first "
                                     "shrink-and-perturb (with reset_interval_updates > 0)")
    reset_shrink: float = Field(0.8, ge=0, le=1, description="shrink-and-perturb: the share of each weight kept")
    reset_end_updates: int = Field(0, ge=0, le=1_000_000_000, description="no shrink-and-perturb after this update "
                                   "(0 = none: every reset_interval_updates for good)")
    grad_clip_norm: float = Field(10.0, ge=0, description="clip the gradient's global L2 norm to this (0 = off)")
    target_update_interval: int = Field(2500, ge=1, le=10_000_000,
                                        description="copy online -> target network every K updates (when tau = 0)")
    tau: float = Field(0.0, ge=0, le=1, description="Polyak factor per update for the target network (0 = hard copies)")
    acting_ema: float = Field(0.0, ge=0, lt=1, description="Polyak rate per update of an averaged copy of the "
                              "online network that the actors act with, checkpoints and the kept best hold, and "
                              "evaluation plays (0 = off: the online network itself)")
    munchausen: bool = Field(
        False, description="Munchausen-DQN targets: a log-policy bonus on the taken action and a soft bootstrap from "
                           "the target network, in place of double DQN's (head q only)")
    munchausen_alpha: float = Field(0.9, ge=0, le=1, description="Munchausen: scale of the log-policy bonus")
    munchausen_tau: float = Field(0.03, gt=0, le=100, description="Munchausen: entropy temperature of the softmax "
                                                                  "policy of the target network")
    munchausen_clip: float = Field(-1.0, ge=-1000, lt=0, description="Munchausen: lower clip of tau * log pi")
    double: bool = Field(True, description="double DQN targets (online argmax, target evaluation)")
    c51_v_min: float = Field(-10.0, ge=-1e6, le=1e6, description="c51 head: the lowest atom's return (the actors "
                             "take the support with the weights)")
    c51_v_max: float = Field(10.0, ge=-1e6, le=1e6, description="c51 head: the highest atom's return")
    huber_kappa: float = Field(1.0, gt=0, le=1000, description="Huber threshold of the TD / quantile Huber loss")
    grad_accum_steps: int = Field(1, ge=1, le=1024,
                                  description="sampled batches whose gradients are summed per optimizer step")
    requests_in_flight: int = Field(4, ge=1, le=64, description="sample requests kept outstanding at the replay "
                                                                 "(up to twice as many batches are buffered)")
    batches_per_request: int = Field(
        0, ge=0, le=64, description="training batches fetched per sample request, their priorities sent back in "
                                    "one message (0 = auto: enough for ~4096 transitions with vector "
                                    "observations, 1 with pixels)")
    request_timeout_s: float = Field(60.0, gt=0, le=3600,
                                     description="re-send sample requests when no batch arrived for this long")
    publish_interval_updates: int = Field(50, ge=1, le=1_000_000, description="publish weights every K updates")
    publish_interval_s: float = Field(10.0, ge=0, le=86400,
                                      description="also publish when this many seconds passed since the last "
                                                  "version and training moved on (0 = only every K updates)")
    metrics_interval_updates: int = Field(100, ge=1, le=1_000_000,
                                          description="read loss/TD/Q sums from the device every N updates")
    weights_republish_s: float = Field(
        5.0, gt=0, le=3600,
        description="re-send the latest weights (same version) when idle this long; a joining subscriber gets "
                    "them at once")
    weights_fanout_mb_per_s: float = Field(
        64.0, ge=0, le=1_000_000, description="the weights fan-out budget: MB (10^6 bytes) a second the weights PUB "
        "may send over all its subscribers together. Sends (republishes too) are at least subscribers x message "
        "bytes / budget apart; a version due earlier waits and a newer one replaces it (0 = no budget; "
        "docs/LEARNER.md)")
    sample_endpoint: str = Field("tcp://127.0.0.1:5556", min_length=1, description="replay sample ROUTER to connect")
    sample_transport: Literal["auto", "shm", "tcp"] = Field(
        "auto", description="how batches arrive: auto (through the replay's shared memory when it runs on this host "
                            "and shares /dev/shm, else TCP), shm (insist: stop if it cannot) or tcp (never ask)")
    sample_packed: bool = Field(
        True, description="over TCP, take a frame_packing=lz4 replay's frames as LZ4 blocks (~5x fewer bytes, ~1 us "
                          "of this process's CPU a frame to unpack); false: plain frames")
    weights_bind: str = Field("tcp://127.0.0.1:5557", min_length=1, description="address the weights PUB socket "
                              "binds (one other hosts reach needs CURVE keys or allow_plaintext)")
    checkpoint_dir: str | None = Field(None, description="directory for learner checkpoints (unset = none)")
    checkpoint_interval_s: float = Field(600.0, gt=0, le=86400, description="seconds between periodic checkpoints")
    best_eval_interval_s: float = Field(
        300.0, ge=0, le=86400, description="evaluate the newest weights greedily this often in a low-priority child "
        "process and keep the best as best.safetensors beside the checkpoint (needs checkpoint_dir; 0: never)")
    best_eval_episodes: int = Field(5, ge=1, le=1000, description="greedy episodes per evaluation, on fixed seeds")
    best_eval_seed: int = Field(1_000_000, ge=0, le=2**31 - 1, description="the evaluations' first seed")
    best_eval_max_steps: int = Field(0, ge=0, description="agent steps an evaluation episode is cut at (0: none)")
    best_eval_epsilon: float = Field(0.0, ge=0.0, le=1.0, description="the evaluations' exploration rate (0: "
                                     "greedy; a preset may play its evaluation protocol's rate, e.g. 0.05)")
    best_eval_noop_max: int = Field(0, ge=0, le=1000, description="each evaluation episode of an env that "
                                    "takes no-op starts begins with 0..N NOOPs drawn from its seed (0: none; a preset "
                                    "sets it for a deterministic emulator, so that its episodes differ)")
    resume: bool | Literal["auto"] = Field(
        False, description="start from the checkpoint in checkpoint_dir: true (it must exist), false (start fresh) "
                           "or auto (resume when one exists, else start fresh)")
    max_updates: int = Field(0, ge=0, description="stop after this many updates in total (0 = unlimited)")
    beta_start: float = Field(0.4, ge=0, le=1, description="importance-sampling exponent at update 0")
    beta_end: float = Field(1.0, ge=0, le=1, description="importance-sampling exponent after annealing")
    beta_anneal_updates: int = Field(100_000, ge=0, description="updates over which beta goes linearly start -> end")
    torch_threads: int = Field(0, ge=0, le=1024, description="torch CPU threads (0 = sized from the cores: under "
                               "flywheel run the cores its local actors and replay leave or the preset's "
                               "run.learner_core_share of them; alone, its container's CPU quota, else every core but "
                               "one; 1 to 8)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto (cuda when present), cpu or cuda")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="autocast dtype: auto = bf16 on a GPU that has it (else fp16 with a gradient "
                            "scaler), fp32 on CPU")
    compile: Literal["auto", "on", "off"] = Field(
        "auto", description="torch.compile the loss (auto = on with a GPU); falls back to eager if it fails")
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "auto", description="torch.compile mode (auto = reduce-overhead, i.e. CUDA graphs, on a GPU: 2.3x the "
                            "updates/s of default on an H200, docs/LEARNER.md; default on a CPU)")
    channels_last: Literal["auto", "on", "off"] = Field(
        "auto", description="convolutional networks in channels-last memory order (auto = on a GPU, or on a CPU "
                            "when compiled: measured faster with inductor, docs/LEARNER.md)")
    host_staging: Literal["pinned", "direct"] = Field(
        "pinned", description="GPU only: how a host batch reaches the device: pinned = copied into a pinned ring "
                              "buffer, then sent asynchronously; direct = sent straight from the batch's own memory "
                              "(one host copy fewer; docs/LEARNER.md)")
    seed: int | None = Field(None, ge=0, description="torch seed for network initialisation "
                                                     "(unset = random; flywheel run derives it from --seed)")
    demos_path: str | None = Field(None, description="demonstrations set (flywheel demos collect) to pretrain on "
                                                     "before RL starts (docs/DEMOS.md)")
    pretrain_updates: int = Field(0, ge=0, le=10_000_000, description="behaviour-cloning updates on demos_path "
                                                                      "before the first weights go out (0 = none)")
    pretrain_loss: Literal["dqfd", "bc"] = Field(
        "dqfd", description="pretraining loss: dqfd = n-step TD + demo_loss_weight x large-margin loss (DQfD); "
                            "bc = cross-entropy of softmax(Q) against the expert's actions")
    demo_margin: float = Field(0.8, gt=0, le=1000, description="margin l(a_E, a) of the large-margin loss")
    demo_loss_weight: float = Field(1.0, ge=0, le=1000,
                                    description="weight (lambda) of the large-margin loss on rows the replay marks "
                                                "as demonstrations, in pretraining and RL (0 = off)")
    demos_load_workers: int = Field(0, ge=0, le=256, description="threads reading demonstration files (0 = cores)")

    @field_validator("compile", "channels_last", mode="before")
    @classmethod
    def _compile_bool(cls, value: object) -> object:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return "on" if value.lower() in ("true", "1", "yes") else "off"
        return value

    @field_validator("sample_transport", mode="before")
    @classmethod
    def _transport_word(cls, value: object) -> object:
        return _one_of(value, ("auto", "shm", "tcp"), "must be auto, shm or tcp (got {value!r}): auto takes the "
                       "replay's shared memory when it runs on this host, tcp between hosts")

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_word(cls, value: object) -> object:
        return _one_of(value, ("auto", "true", "false", "1", "0", "yes", "no", "on", "off"),
                       "must be auto, true or false")

    @field_validator("resume")
    @classmethod
    def _resume_needs_dir(cls, value: bool | str, info: ValidationInfo) -> bool | str:
        if value is True and not info.data.get("checkpoint_dir"):
            raise ValueError("resume needs --checkpoint-dir (resume=auto starts fresh without one)")
        return value

    @model_validator(mode="after")
    def _lr_schedule_is_whole(self) -> LearnerSettings:
        if (self.lr_decay_updates > 0) != (self.lr_final > 0):
            raise ValueError("an lr schedule needs both lr_final > 0 and lr_decay_updates > 0 "
                             f"(got lr_final={self.lr_final}, lr_decay_updates={self.lr_decay_updates})")
        return self

    @model_validator(mode="after")
    def _c51_support_is_an_interval(self) -> LearnerSettings:
        if self.c51_v_min >= self.c51_v_max:
            raise ValueError(f"c51_v_min must be below c51_v_max (got {self.c51_v_min} and {self.c51_v_max})")
        return self

    @model_validator(mode="after")
    def _munchausen_needs_q_head(self) -> LearnerSettings:
        if self.munchausen and self.head != "q":
            raise ValueError("munchausen needs head q (its soft bootstrap is over Q-values, not quantiles)")
        return self

    @model_validator(mode="after")
    def _pretraining_needs_demos(self) -> LearnerSettings:
        if self.pretrain_updates > 0 and not self.demos_path:
            raise ValueError("pretrain_updates > 0 needs --demos-path (a set written by flywheel demos collect)")
        if self.demos_path and self.pretrain_updates == 0:
            raise ValueError("demos_path is read only for pretraining: set --pretrain-updates (the replay's "
                             "--demo-path feeds demonstrations during RL)")
        return self


def _one_of(value: object, words: tuple[str, ...], problem: str) -> object:
    """A word setting as written (any case, spaces around) checked against ``words``; other types pass on to
    pydantic's own check. ``problem`` may name the value as ``{value!r}``."""
    if isinstance(value, str):
        value = value.strip().lower()
        if value not in words:
            raise ValueError(problem.format(value=value))
    return value
