"""The gateway's JSON bodies as pydantic models: the response model of every JSON route of the HTTP API.

The views build plain dicts; FastAPI checks each against its route's model and writes it in the models' field
order, so these declare the fields in the order the views write them. A number keeps the type it was computed as
(``Number``: 0 stays 0, 0.0 stays 0.0), so a body is byte for byte what the view built.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
"""A JSON number, kept as the int or float it was computed as."""
ArgValue = Annotated[int | float | str, WithJsonSchema({"type": ["number", "string"]})]
"""A control command argument's value as sent: a number or a tag."""

# The actors' own measures, as /status's summary and each /history point both give them (null: none reports it)
ProgressMean = Annotated[Number | None, Field(description="the env's progress measure: mean over the live actors "
                                              "of their last 100 level-start episodes (null for envs without one)")]
ProgressMax = Annotated[Number | None, Field(description="the furthest any live actor got in its last 100 "
                                             "level-start episodes")]
SuccessRate = Annotated[Number | None, Field(description="share of those episodes that reached the env's goal, "
                                             "mean over the live actors")]
RestartedProgressMean = Annotated[Number | None, Field(
    description="mean progress of the last 100 episodes each live actor restarted at a kept start state (the "
                "start-state curriculum), shown apart from the level-start ones")]


class ErrorBody(BaseModel):
    """Every refused request gets this, with the reason."""

    error: str = Field(examples=["lr must be in (0, 1], got 5"])


class Health(BaseModel):
    """/healthz: whether every background task of the gateway runs, and if not, which stopped."""

    ok: bool
    detail: str


class Accepted(BaseModel):
    """A command as published on the control channel."""

    seq: int = Field(description="sequence number; subscribers drop repeats by it")
    command: str
    target: str = Field(description="'*', a service name or an instance name")
    args: dict[str, ArgValue] = Field(description="the checked arguments, as sent")


class IssuedCommand(BaseModel):
    """A command the gateway sent: as published, with when (Unix time) and who sent it."""

    seq: int
    command: str
    target: str
    args: dict[str, ArgValue]
    time: float
    by: dict[str, str] = Field(description="client address, token fingerprint and, when given, the operator")


class ControlState(BaseModel):
    """GET /control: the commands re-published to late joiners, the latest ones sent, and every command's help."""

    retained: list[IssuedCommand]
    recent: list[IssuedCommand]
    commands: dict[str, str]


class ClipInfo(BaseModel):
    """What the newest filmed greedy episode showed."""

    instance: str
    weight_version: int
    env_id: str
    fps: Number
    frames: int
    episode_return: Number
    length: int
    progress: Number | None = Field(description="the episode's progress measure (its maximum; the env's label: "
                                    "summary.progress_label), null for envs without one")
    success: bool = Field(description="whether the episode reached the env's goal (summary.success_label)")
    sent_time: Number
    received_time: Number
    bytes: int


class LastReport(BaseModel):
    """When an instance last reported (its own clock and the gateway's) and that report's sequence number."""

    sent_time: Number | None
    received_time: Number
    seq: int


class LeaseSlot(BaseModel):
    """An actor's exploration lease: it is actor ``index`` of ``count``."""

    index: int
    count: int


class InstanceStatus(BaseModel):
    """One instance of a service as its telemetry last described it."""

    instance: str
    role: str
    version: str | None
    up: bool
    age_s: Number
    last_report: LastReport
    restarts: int
    rates: dict[str, Number] = Field(description="per-second rates of the counters over rate_window_s")
    counters: dict[str, Number]
    gauges: dict[str, Number]
    info: dict[str, str]
    lease: LeaseSlot | None = Field(None, description="present only while the instance holds a lease")


class ServiceStatus(BaseModel):
    """Every known instance of one service, how many are up, and the service's counter totals."""

    up: int
    down: int
    totals: dict[str, Number]
    instances: list[InstanceStatus]


class PolicyLag(BaseModel):
    """How many weight versions the live actors are behind the learner."""

    max: Number | None
    mean: Number | None


class ActorExploration(BaseModel):
    """One actor's range of exploration rates over its env slots."""

    min: Number | None
    max: Number | None
    slots: int | None


class Exploration(BaseModel):
    """The spread of exploration rates over every live actor's env slots (Ape-X over N x E slots)."""

    slots: int | None
    min: Number | None
    max: Number | None
    actors: dict[str, ActorExploration]


class Summary(BaseModel):
    """The numbers the live page and `flywheel run` show, from live instances only (null: none reports it)."""

    env_steps_per_s: Number | None
    transitions_sent_per_s: Number | None
    transitions_received_per_s: Number | None
    samples_per_s: Number | None
    replay_size: Number | None
    replay_capacity: Number | None
    updates_per_s: Number | None
    weight_version: Number | None
    policy_lag_versions: PolicyLag | None
    data_wait_ratio: Number | None
    loss: Number | None
    episode_return_mean: Number | None
    eval_return_mean: Number | None
    eval_version: Number | None = Field(description="weight version of the learner's last evaluation")
    eval_return: Number | None = Field(description="mean return of the learner's last evaluation (its preset's "
                                       "protocol)")
    eval_success_rate: Number | None = Field(description="share of that evaluation's episodes that reached the "
                                             "env's goal; null for envs without one")
    eval_progress_mean: Number | None = Field(description="mean progress of that evaluation (the env's progress "
                                              "measure)")
    eval_progress_median: Number | None = Field(description="median progress of that evaluation")
    eval_success_label: str | None = Field(description="what success is called for the learner's env (its "
                                           "telemetry info eval_success_label, e.g. flag)")
    eval_progress_label: str | None = Field(description="what progress is called for the learner's env (its "
                                            "telemetry info eval_progress_label, e.g. furthest x)")
    progress_mean: ProgressMean
    progress_max: ProgressMax
    success_rate: SuccessRate
    restarted_progress_mean: RestartedProgressMean
    restarted_success_rate: Number | None = Field(description="share of those restarted episodes that reached the "
                                                  "goal")
    progress_label: str | None = Field(description="what progress is called for the actors' env (their telemetry "
                                       "info progress_label, e.g. furthest x); null: no measure")
    success_label: str | None = Field(description="what success is called for the actors' env (success_label, "
                                      "e.g. flag)")
    epsilon: dict[str, Number | None]
    exploration: Exploration | None


class GatewayInfo(BaseModel):
    """The gateway itself: version, uptime, endpoints, settings that shape /status, and what it refused."""

    instance: str
    version: str
    uptime_s: Number
    time: Number
    endpoints: dict[str, str]
    control_enabled: bool
    stale_after_s: Number
    forget_after_s: Number
    telemetry_received: int
    rejected: dict[str, int] = Field(description="messages refused, by 'socket:fault'")
    internal_errors: int = Field(description="telemetry messages whose handling raised (a bug, logged with its trace)")
    missed_wakeups: int = Field(description="receives that timed out with a message waiting (taken a second late)")
    invalid_metric_keys: dict[str, str] = Field(description="'service:key' -> why it is not exported")


class Leases(BaseModel):
    """The live exploration leases: actor i of N holds slot i of ``actors``."""

    count: int
    actors: list[str]
    ttl_s: Number


class Status(BaseModel):
    """GET /status: the gateway, a summary, every instance of every service, leases, control and the newest clip."""

    gateway: GatewayInfo
    summary: Summary
    services: dict[str, ServiceStatus]
    leases: Leases
    control: ControlState
    clip: ClipInfo | None


class CurvePoint(BaseModel):
    """One point of the learning curve (null: no live instance reported it)."""

    t: Number = Field(description="Unix time")
    env_steps: Number
    episodes: Number
    return_mean: Number | None
    eval_return_mean: Number | None
    progress_mean: ProgressMean
    progress_max: ProgressMax
    success_rate: SuccessRate
    restarted_progress_mean: RestartedProgressMean
    updates: Number
    weight_version: Number | None


class History(BaseModel):
    """GET /history: the learning curve's points and their current spacing."""

    interval_s: Number
    thinned: int = Field(description="times every other point was dropped to stay within the bound")
    points: list[CurvePoint]


class JoinDocument(BaseModel):
    """GET /join: what an actor on another host runs with (flywheel/launch/remote.py writes it; no secrets).

    ``flywheel actor --join`` needs ``format`` and ``actor``; the rest is served when the document has it.
    """

    model_config = ConfigDict(extra="allow")

    format: str = Field(examples=["flywheel-join"])
    endpoints: dict[str, str] | None = Field(None, description="the run's endpoints as other hosts reach them")
    advertise: str | None = Field(None, description="the address other hosts reach the run at")
    env_id: str | None = None
    preset: dict[str, str] | None = None
    actor: dict[str, str | bool | int | float] = Field(
        description="actor settings, FLYWHEEL_ACTOR_* names without the prefix")
