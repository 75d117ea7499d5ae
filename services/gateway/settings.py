"""Gateway settings: FLYWHEEL_GATEWAY_* variables or the same-named flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from flywheel.settings import CommonSettings
from flywheel.tracking import INSTALL_HINT, Mode, default_mode, parse_tags

from .clips import CLIP_BUFFER_BYTES, CLIP_MAX_BYTES


class GatewaySettings(CommonSettings):
    """The gateway binds the telemetry, control and lease endpoints that every other service connects to."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_GATEWAY_", extra="forbid", validate_default=True,
                                      env_ignore_empty=True)

    http_host: str = Field("127.0.0.1", description="address the HTTP API listens on (0.0.0.0 in containers)")
    http_port: int = Field(8080, ge=0, le=65535, description="port of /metrics, /status, /healthz and /control "
                                                             "(0: one the kernel picks, logged at start)")
    http_fd: int = Field(-1, ge=-1, description="serve on this inherited listening socket instead of binding "
                                                "http_host:http_port (how flywheel run keeps one port across "
                                                "gateway restarts); -1: bind")
    lease_endpoint: str = Field("tcp://127.0.0.1:5560", description="ROUTER endpoint actors ask for leases")
    join_file: Path | None = Field(None, description="the run's join document (flywheel run --listen writes it), "
                                   "served at /join to actors on other hosts (flywheel actor --join URL)")
    control_enabled: bool = Field(
        True, description="false turns POST /control off entirely (then no token is needed on any address)")
    control_token: SecretStr = Field(
        SecretStr(""), description="bearer token for POST /control (at least 16 characters)",
    )
    control_token_file: Path | None = Field(
        None, description="file holding the bearer token, e.g. a mounted Kubernetes Secret; re-read when it changes",
    )
    max_body_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024,
                                description="largest POST /control body accepted (larger: 413)")
    lease_ttl_s: float = Field(10.0, gt=0, le=3600, description="seconds a lease lives without renewal")
    stale_after_s: float = Field(5.0, gt=0, description="seconds of silence before an instance reads as down")
    forget_after_s: float = Field(300.0, gt=0, description="seconds of silence before an instance is dropped")
    sweep_interval_s: float = Field(0.5, gt=0, le=10, description="how often silent instances are looked for")
    rate_window_s: float = Field(10.0, gt=0, le=600, description="window of the per-instance rates in /status")
    control_repeat_s: float = Field(1.0, gt=0, le=60, description="how often retained commands are re-published")
    one_shot_repeat_s: float = Field(5.0, ge=0, le=600, description="how long one-shot commands are repeated")
    history_interval_s: float = Field(2.0, gt=0, le=3600, description="first spacing of learning-curve points")
    history_points: int = Field(1800, ge=16, le=100_000,
                                description="most learning-curve points kept (older ones are thinned, not dropped)")
    curves_dir: Path | None = Field(
        None, description="folder for training curves that outlive the run: TensorBoard events in tb/ and "
                          "progress.csv, continued after a restart (flywheel run: the checkpoint folder)")
    curves_interval_s: float = Field(10.0, gt=0, le=3600, description="seconds between points of the curves")
    # Weights & Biases tracking of the same points (flywheel/tracking.py, docs/TRACKING.md); needs curves_dir
    track_project: str = Field("flywheel", min_length=1, max_length=128, pattern=r"^[^/\\#?%:]+$",
                               description="W&B project of the tracked run")
    track_entity: str = Field("", max_length=128, pattern=r"^[^/\\#?%:]*$",
                              description="W&B entity, a user or team (empty: the API key's default)")
    track_group: str = Field("", max_length=128, description="W&B group of the run (empty: none)")
    track_tags: str = Field("", max_length=4096, description="W&B tags, comma-separated (each at most 64 chars)")
    track_mode: Mode = Field(
        default_factory=lambda: default_mode(),
        description="online, or offline: files in track_dir for `wandb sync` later (default: offline when "
                    "WANDB_MODE is offline, else online)")
    track_dir: Path | None = Field(None, description="where W&B writes its run files (TRACK_DIR/wandb; default: "
                                                     "curves_dir)")
    track: bool = Field(False, description="track the curves' points in Weights & Biases (needs curves_dir and "
                                           f"the wandb package: {INSTALL_HINT})")
    max_instances: int = Field(10_000, ge=1, description="most service instances (and leases) tracked at once")
    max_leases_per_peer: int = Field(
        16, ge=1, le=100_000, description="most exploration leases one connection to the lease socket may hold (an "
        "actor holds one); a request for more is refused and counted (messages_rejected_total fault "
        "leases_per_peer)")
    max_instances_per_service: int = Field(
        1024, ge=1, le=100_000, description="most instances of one service (role) tracked at once; a new one past "
        "it is refused and counted (messages_rejected_total fault instances_per_service)")
    max_series_per_instance: int = Field(
        512, ge=16, le=4096, description="most values (counters, gauges, info entries) kept of one instance; the "
        "rest of a report is left out and counted (fault series_per_instance); a real report has about 50")
    max_series: int = Field(
        20_000, ge=1024, le=1_000_000, description="most series held for all instances together: their values "
        "plus 3 each (up, age, info); past it new values and instances are refused and counted (fault series). "
        "It bounds /metrics's instance lines (rendered in a worker thread) and the registry's memory (about 0.5 "
        "KiB a series with 100-character keys); the default fits about 300 instances of 60 series")
    telemetry_hwm: int = Field(
        1000, ge=1, le=10_000, description="receive high-water mark of the telemetry socket, in messages per "
        "connection: at most this many whole reports of up to 16 KiB each wait (16 MiB at the default)")
    clip_buffer_bytes: int = Field(
        CLIP_BUFFER_BYTES, ge=CLIP_MAX_BYTES, le=1 << 32,
        description="most bytes all filmed clips in flight hold together (at least one whole 16 MiB clip); a "
                    "piece that would pass it pushes out the oldest other clips in flight")

    @field_validator("track_tags")
    @classmethod
    def _tags(cls, value: str) -> str:
        parse_tags(value)  # ValueError names the tag
        return value

    @field_validator("max_series")
    @classmethod
    def _series_hold_one_instance(cls, value: int, info: ValidationInfo) -> int:
        per_instance = info.data.get("max_series_per_instance", 0)
        if value < per_instance + 3:
            raise ValueError(f"max_series ({value}) must hold one whole instance: at least max_series_per_instance "
                             f"+ 3 ({per_instance + 3})")
        return value

    @field_validator("track")
    @classmethod
    def _track_needs_curves(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("curves_dir") is None:
            raise ValueError("tracking logs the curves' points: set curves_dir (FLYWHEEL_GATEWAY_CURVES_DIR) too")
        return value
