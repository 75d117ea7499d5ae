"""Every service's telemetry declared once: typed counters and gauges whose field names are the wire keys.

A part is a dataclass of ``Counters`` or ``Gauges``; each field is ``Annotated[float, "help text"]`` (with ``= 0.0``
for a counter a service adds to, ``float | None = None`` for a value reported only when there is one). So
``counters.transitions_received_total += n`` is checked by mypy, a misspelt name is an AttributeError (the parts
have slots), and ``as_dict()`` is the ``{key: value}`` mapping ``TelemetryReporter.send`` takes. Labelled counters
(``rejected_total{where=...,reason=...}``) are ``Family`` objects that render their keys. ``help_text`` gives the
gateway the HELP line of each Prometheus name (``flywheel_<service>_<key>``) from the same declarations.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, fields
from typing import Annotated, ClassVar


@dataclass(frozen=True)
class Unsent:
    """The help text of a counter kept in the process (tests and benchmarks read it) but not reported."""

    text: str


@dataclass(frozen=True)
class Declared:
    """One declared telemetry key: its name, kind (``counter`` or ``gauge``), help text and whether it is sent."""

    name: str
    kind: str
    help: str
    sent: bool = True


class MetricPart:
    """Base of the declared parts: typed values, one field per telemetry key (subclass ``Counters`` or ``Gauges``)."""

    __slots__ = ()
    kind: ClassVar[str] = ""

    @classmethod
    def declared(cls) -> tuple[Declared, ...]:
        """Every field of the part with its help text, in declaration order."""
        return _declared(cls)

    def as_dict(self) -> dict[str, float]:
        """The values to report, by key: unsent counters and values that are None are left out."""
        out: dict[str, float] = {}
        for item in _declared(type(self)):
            value = getattr(self, item.name)
            if item.sent and value is not None:
                out[item.name] = float(value)
        return out


class Counters(MetricPart):
    """A part whose fields are counters (cumulative; the gateway keeps totals across restarts)."""

    __slots__ = ()
    kind = "counter"


class Gauges(MetricPart):
    """A part whose fields are gauges (the value now)."""

    __slots__ = ()
    kind = "gauge"


_DECLARED: dict[type[MetricPart], tuple[Declared, ...]] = {}


def _declared(cls: type[MetricPart]) -> tuple[Declared, ...]:
    known = _DECLARED.get(cls)
    if known is not None:
        return known
    hints = typing.get_type_hints(cls, include_extras=True)
    out: list[Declared] = []
    for f in fields(cls):  # type: ignore[arg-type]  # every concrete part is a dataclass
        notes = getattr(hints[f.name], "__metadata__", ())
        note = next((n for n in notes if isinstance(n, (str, Unsent))), None)
        if note is None:
            raise TypeError(f"{cls.__name__}.{f.name}: declare it as Annotated[float, 'help text']")
        out.append(Declared(f.name, cls.kind, note.text if isinstance(note, Unsent) else note,
                            not isinstance(note, Unsent)))
    _DECLARED[cls] = tuple(out)
    return _DECLARED[cls]


@dataclass(frozen=True)
class Family:
    """A counter reported once per combination of label values, e.g. ``rejected_total{where=...,reason=...}``."""

    name: str
    labels: tuple[str, ...]
    help: str

    def key(self, *values: str) -> str:
        """The telemetry key of one series: ``name{label="value",...}``, values in the order of ``labels``."""
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name} takes {len(self.labels)} label values ({', '.join(self.labels)})")
        return self.name + "{" + ",".join(f'{k}="{v}"' for k, v in zip(self.labels, values, strict=True)) + "}"


# ---- every service ------------------------------------------------------------------------------------------------
MESSAGES_REJECTED = "messages refused on any socket (undecodable, oversized, bad values), all faults together"
TELEMETRY_DROPPED = "telemetry reports dropped because the queue to the gateway was full"
REJECTED = Family("rejected_total", ("where", "reason"), "messages refused, by socket and kind of fault")
CURVE_HANDSHAKES_REFUSED = Family("curve_handshakes_refused_total", ("reason",),
                                  "CURVE handshakes refused, by reason (unknown client key, ...)")


@dataclass(kw_only=True, slots=True)
class ProcessCounters(Counters):
    process_cpu_seconds_total: Annotated[float, "CPU seconds (user and system) of the process"]
    process_children_cpu_seconds_total: Annotated[
        float, "CPU seconds of the process's children (env workers, checkpoint writers), exited ones included"]


@dataclass(kw_only=True, slots=True)
class ProcessGauges(Gauges):
    process_resident_memory_bytes: Annotated[float, "resident memory of the process"]
    process_threads: Annotated[float, "threads of the process"]
    process_children_resident_memory_bytes: Annotated[float, "resident memory of the process's running children"]
    process_children: Annotated[float, "running child processes"]


# ---- replay --------------------------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class ReplayCounters(Counters):
    transitions_received_total: Annotated[float, "transitions inserted into the buffer"] = 0.0
    batches_received_total: Annotated[float, "transition batches inserted"] = 0.0
    transitions_rejected_total: Annotated[float, "transition batches refused (see rejected_total)"] = 0.0
    samples_total: Annotated[float, "rows sent in sample replies"] = 0.0
    sample_batches_total: Annotated[float, "sample replies sent"] = 0.0
    demo_samples_total: Annotated[float, "demonstration rows sent in sample replies"] = 0.0
    priority_updates_total: Annotated[float, "priorities updated (rows)"] = 0.0
    sample_requests_dropped_total: Annotated[
        float, "sample requests dropped: too many pending, or the reply could not be queued"] = 0.0
    rate_limiter_sample_wait_seconds_total: Annotated[
        float, "seconds sample requests waited for the rate limiter, summed over requests"] = 0.0
    rate_limiter_insert_wait_seconds_total: Annotated[float, "seconds the rate limiter held inserts back"] = 0.0
    checkpoints_total: Annotated[float, "checkpoints written"] = 0.0
    checkpoint_failures_total: Annotated[float, "background checkpoints that failed"] = 0.0
    shm_batches_total: Annotated[float, "sample replies written to a client's shared memory"] = 0.0
    socket_batches_total: Annotated[float, "sample replies sent over the socket"] = 0.0
    shm_slots_exhausted_total: Annotated[
        float, "replies sent over the socket because the client's shared-memory slots were all taken"] = 0.0
    compact_batches_total: Annotated[float, "socket replies sent compact (each distinct frame once)"] = 0.0
    packed_batches_total: Annotated[float, "compact replies whose frames were LZ4-packed"] = 0.0
    control_commands_total: Annotated[float, "control commands received"] = 0.0
    messages_rejected_total: Annotated[float, MESSAGES_REJECTED] = 0.0
    telemetry_dropped_total: Annotated[float, TELEMETRY_DROPPED] = 0.0
    stale_priority_updates_total: Annotated[float, "priority updates for rows overwritten since sampled"] = 0.0
    priorities_clamped_total: Annotated[
        float, "priorities (rows, an actor's or the learner's) above max_priority, stored as max_priority"] = 0.0


@dataclass(kw_only=True, slots=True)
class ReplayGauges(Gauges):
    size_transitions: Annotated[float, "transitions held"]
    capacity_transitions: Annotated[float, "transitions the buffer holds at most"]
    demo_size_transitions: Annotated[float, "demonstration transitions held (apart, never evicted)"]
    memory_bytes: Annotated[float, "bytes of the buffer's arrays"]
    resident_bytes: Annotated[float, "resident memory of the replay process"]
    shm_bytes: Annotated[float, "bytes of the shared-memory segments offered to clients"]
    frames_per_transition: Annotated[float, "distinct frames stored per transition (frame deduplication)"]
    evicted_for_frames_transitions: Annotated[float, "transitions evicted early to make room for frames"]
    unpackable_frames: Annotated[float, "frames kept unpacked because LZ4 did not shrink them"]
    insert_rate_per_second: Annotated[float, "transitions inserted per second"]
    sample_rate_per_second: Annotated[float, "rows sampled per second"]
    pending_sample_requests: Annotated[float, "sample requests waiting for the rate limiter"]
    samples_per_insert: Annotated[float, "the rate limiter's target of rows sampled per row inserted"]
    error_buffer: Annotated[float, "how far the rate limiter lets sampling stray from its target (rows)"]
    checkpoint_in_progress: Annotated[float, "1 while a background checkpoint is being written"]
    checkpoint_duration_seconds: Annotated[float, "seconds the last checkpoint took"]
    checkpoint_max_pause_seconds: Annotated[float, "longest pause of the loop to start a checkpoint"]
    checkpoint_max_loop_turn_seconds: Annotated[float, "longest loop turn while a checkpoint was written"]
    paused: Annotated[float, "1 while paused by a control command"]


# ---- actor ---------------------------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class ActorCounters(Counters):
    env_steps_total: Annotated[float, "environment steps taken (every env slot)"]
    episodes_total: Annotated[float, "training episodes finished that began at the level start (all of them unless "
                              "the start-state curriculum restarts some: restarted_episodes_total)"]
    eval_episodes_total: Annotated[float, "greedy evaluation episodes finished"]
    transitions_sent_total: Annotated[float, "transitions sent to the replay"]
    transitions_dropped_total: Annotated[float, "transitions dropped because the replay was not taking them"]
    weights_received_total: Annotated[float, "weight versions loaded"]
    weights_rejected_total: Annotated[float, "weights refused: wrong network, shapes, NaN, undecodable, not newer"]
    weights_stale_total: Annotated[float, "weights skipped because a newer version had arrived"]
    messages_rejected_total: Annotated[float, MESSAGES_REJECTED]
    send_seconds_total: Annotated[float, "seconds spent sending transitions"]
    send_blocked_seconds_total: Annotated[float, "seconds sending waited for the replay (on_full=block)"]
    send_reconnects_total: Annotated[float, "connections to the replay dropped and made again"]
    weights_load_seconds_total: Annotated[float, "seconds spent loading weights"]
    env_seconds_total: Annotated[float, "seconds stepping environments or waiting for their workers"]
    inference_seconds_total: Annotated[float, "seconds in the batched forward passes"]
    bookkeeping_seconds_total: Annotated[float, "seconds in n-step returns, priorities, action choice and copies"]
    telemetry_dropped_total: Annotated[float, TELEMETRY_DROPPED] = 0.0
    clips_sent_total: Annotated[float | None, "episode clips sent to the gateway"] = None
    clips_failed_total: Annotated[float | None, "episode clips that could not be filmed or sent"] = None
    clip_seconds_total: Annotated[float | None, "seconds spent filming clips"] = None
    restarted_episodes_total: Annotated[
        float | None, "training episodes that began at a kept start state (start-state curriculum; not in "
        "episodes_total or the episode gauges)"] = None


@dataclass(kw_only=True, slots=True)
class ActorGauges(Gauges):
    epsilon: Annotated[float, "the highest exploration rate among the actor's env slots"]
    epsilon_min: Annotated[float, "the lowest exploration rate among the actor's env slots"]
    epsilon_max: Annotated[float, "the highest exploration rate among the actor's env slots"]
    exploration_slots: Annotated[float, "env slots the exploration rates are spread over"]
    weight_version: Annotated[float, "the weight version acting"]
    weight_version_newest: Annotated[float, "the newest weight version that arrived"]
    policy_lag_versions: Annotated[float, "versions between the weights acting and the newest published"]
    weight_age_seconds: Annotated[float, "seconds since the weights acting were loaded"]
    env_steps_per_second: Annotated[float, "environment steps per second over the last few seconds"]
    episode_return_mean: Annotated[float, "mean return of the recent training episodes"]
    episode_length_mean: Annotated[float, "mean length of the recent training episodes"]
    lease_index: Annotated[float, "this actor's index among the actors"]
    lease_slots: Annotated[float, "actors sharing the exploration schedule"]
    paused: Annotated[float, "1 while paused by a control command"]
    send_blocked_seconds: Annotated[float, "seconds sending has waited for the replay so far (cumulative)"]
    num_envs: Annotated[float, "environments stepped"]
    slot_groups: Annotated[float, "groups of env slots stepped in turn"]
    n_step: Annotated[float, "steps in the n-step returns being emitted now (falls as an annealed n-step does)"]
    episode_return_last: Annotated[float | None, "return of the last training episode"] = None
    episode_progress_mean: Annotated[
        float | None, "mean progress (the env's progress measure, its maximum in an episode) of the last 100 "
        "training episodes that began at the level start"] = None
    episode_progress_max: Annotated[
        float | None, "furthest progress of the last 100 training episodes that began at the level start"] = None
    episode_success_rate: Annotated[
        float | None, "share of the last 100 training episodes that began at the level start and reached the "
        "env's goal (its success measure)"] = None
    eval_return_mean: Annotated[float | None, "mean return of the recent greedy evaluation episodes"] = None
    eval_return_last: Annotated[float | None, "return of the last greedy evaluation episode"] = None
    start_state_share_actual: Annotated[
        float | None, "share of the last 100 training episodes that began at a kept start state"] = None
    start_state_progress_mean: Annotated[
        float | None, "mean progress (the env's measure) the last 100 restarted episodes began at"] = None
    start_states_kept: Annotated[float | None, "start states kept, summed over the env slots"] = None
    start_state_death_point_mean: Annotated[
        float | None, "start_state_choice deaths: mean progress of the death points the envs draw from (where the "
        "actor's level-start episodes at low exploration ended short of the goal)"] = None
    restarted_return_mean: Annotated[float | None, "mean return of the last 100 restarted episodes"] = None
    restarted_progress_mean: Annotated[
        float | None, "mean progress (the env's measure, its maximum in an episode) of the last 100 restarted "
        "episodes"] = None
    restarted_success_rate: Annotated[
        float | None, "share of the last 100 restarted episodes that reached the env's goal"] = None


# ---- learner -------------------------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class LearnerCounters(Counters):
    updates_total: Annotated[float, "updates applied (skipped ones not counted)"] = 0.0
    samples_total: Annotated[float, "rows trained on"] = 0.0
    weights_published_total: Annotated[float, "weight versions published"] = 0.0
    messages_rejected_total: Annotated[float, MESSAGES_REJECTED] = 0.0
    skipped_updates_total: Annotated[float, "updates skipped (a non-finite loss or gradient)"] = 0.0
    data_wait_seconds_total: Annotated[float, "seconds the training loop waited for a batch"] = 0.0
    checkpoints_total: Annotated[float, "checkpoints written"] = 0.0
    control_rejected_total: Annotated[float, "control commands refused (bad arguments, unknown command)"] = 0.0
    demo_samples_total: Annotated[float, "demonstration rows trained on during RL"] = 0.0
    weights_fanout_bytes_total: Annotated[
        float, "bytes of weights handed to the fan-out: each send's message times the subscribers then"] = 0.0
    weights_publishes_deferred_total: Annotated[
        float, "weight versions that waited for the fan-out budget (a newer one replaces one still waiting)"] = 0.0
    pretrain_updates_total: Annotated[
        float | None, "pretraining updates done before the first weights were published"] = None
    resets_total: Annotated[float | None, "shrink-and-perturb resets of the online network (when scheduled)"] = None


@dataclass(kw_only=True, slots=True)
class ReplayClientCounters(Counters):
    """The sampling client's counts (services/replay/client.py), reported by the learner."""

    sample_batches_total: Annotated[float, "sample batches received (shared memory and socket)"] = 0.0
    shm_batches_total: Annotated[float, "sample batches read from shared memory"] = 0.0
    tcp_batches_total: Annotated[float, "sample batches received over the socket"] = 0.0
    compact_batches_total: Annotated[float, "socket batches received compact (stacks rebuilt here)"] = 0.0
    packed_batches_total: Annotated[float, "compact batches whose frames came LZ4-packed"] = 0.0
    requests_resent_total: Annotated[float, "sample requests sent again (timed out, or the replay reconnected)"] = 0.0
    replay_reconnects_total: Annotated[float, "reconnections to the replay noticed"] = 0.0
    replies_unrequested_total: Annotated[float, "replies dropped because no request of theirs was in flight"] = 0.0
    priority_updates_dropped_total: Annotated[float, "priority updates dropped because the socket was full"] = 0.0
    bad_replies: Annotated[float, Unsent("replies refused (counted in rejected_total{where=\"sample\"})")] = 0.0
    priority_updates: Annotated[float, Unsent("priority update messages sent")] = 0.0


@dataclass(kw_only=True, slots=True)
class LearnerGauges(Gauges):
    weight_version: Annotated[float, "the last weight version published"]
    beta: Annotated[float, "the importance-sampling exponent asked for"]
    lr: Annotated[float, "the learning rate"]
    paused: Annotated[float, "1 while paused by a control command"]
    requests_in_flight: Annotated[float, "sample requests sent and not yet answered"]
    batches_waiting: Annotated[float, "batches received and checked but not yet trained on"]
    update_step: Annotated[float, "updates done (skipped ones included)"]
    replay_size: Annotated[float, "transitions the replay held at the last batch"]
    publish_interval_updates: Annotated[float, "weights are published every this many updates"]
    publish_interval_seconds: Annotated[float, "... or every this many seconds"]
    weights_subscribers: Annotated[float, "subscribers of the weights PUB (actors and other readers)"]
    weights_min_interval_seconds: Annotated[
        float, "seconds between weight sends the fan-out budget asks for now: subscribers x message bytes / "
        "budget (0: not shaped)"]
    achieved_tflops: Annotated[float | None, "TFLOPS the updates' convolutions and matmuls achieved (CUDA)"] = None


@dataclass(kw_only=True, slots=True)
class TrainingGauges(Gauges):
    """Means and rates over the window since the last report (services/learner/metrics.py's MetricsWindow)."""

    loss: Annotated[float, "mean loss (NaN until the first update)"]
    td_error_mean: Annotated[float, "mean absolute TD error"]
    q_mean: Annotated[float, "mean Q value of the actions taken"]
    margin_loss: Annotated[float, "mean DQfD large-margin loss over the demonstration rows"]
    updates_per_second: Annotated[float, "updates per second"]
    samples_per_second: Annotated[float, "rows trained on per second"]
    data_wait_ratio: Annotated[float, "share of the time the training loop waited for a batch"]


@dataclass(kw_only=True, slots=True)
class GpuGauges(Gauges):
    gpu_memory_allocated_bytes: Annotated[float, "GPU memory held by tensors"]
    gpu_memory_reserved_bytes: Annotated[float, "GPU memory reserved by the caching allocator"]
    gpu_memory_peak_bytes: Annotated[float, "most GPU memory held by tensors so far"]
    gpu_utilization_ratio: Annotated[float | None, "share of the time the GPU was busy (NVML)"] = None


@dataclass(kw_only=True, slots=True)
class GreedyEvalCounters(Counters):
    greedy_evaluations_total: Annotated[float, "evaluation rounds finished (the newest weights' and the kept best's "
                                                "replays)"]
    greedy_evaluation_failures_total: Annotated[float, "greedy evaluations that failed"]


@dataclass(kw_only=True, slots=True)
class GreedyEvalGauges(Gauges):
    eval_greedy_return: Annotated[float | None, "mean return of the last greedy evaluation"] = None
    eval_greedy_version: Annotated[float | None, "weight version of the last greedy evaluation"] = None
    eval_episodes: Annotated[float | None, "episodes the last evaluation played"] = None
    eval_success_rate: Annotated[float | None, "share of the last evaluation's episodes that reached the env's "
                                 "goal (its success measure)"] = None
    eval_progress_mean: Annotated[float | None, "mean progress of the last evaluation's episodes (the env's "
                                  "progress measure, its maximum in an episode)"] = None
    eval_progress_median: Annotated[float | None, "median progress of the last evaluation's episodes"] = None
    best_greedy_return: Annotated[float | None, "mean return of the best weights kept"] = None
    best_weight_version: Annotated[float | None, "weight version of the best weights kept"] = None


# ---- by service ----------------------------------------------------------------------------------------------------
COMMON_PARTS: tuple[type[MetricPart], ...] = (ProcessCounters, ProcessGauges)
COMMON_FAMILIES = (REJECTED, CURVE_HANDSHAKES_REFUSED)
SERVICE_PARTS: dict[str, tuple[type[MetricPart], ...]] = {
    "replay": (ReplayCounters, ReplayGauges),
    "actor": (ActorCounters, ActorGauges),
    "learner": (LearnerCounters, ReplayClientCounters, GreedyEvalCounters,
                LearnerGauges, TrainingGauges, GpuGauges, GreedyEvalGauges),
}


@functools.cache
def _help_by_key() -> dict[tuple[str, str, str], str]:
    """(service or "", kind, key) -> help text; "" for what every service reports."""
    out: dict[tuple[str, str, str], str] = {("", "counter", f.name): f.help for f in COMMON_FAMILIES}
    for service, parts in (("", COMMON_PARTS), *SERVICE_PARTS.items()):
        for cls in parts:
            for item in cls.declared():
                if item.sent:
                    out[(service, item.kind, item.name)] = item.help
    return out


def help_text(service: str, kind: str, key: str) -> str | None:
    """The declared help of a reported key (its name without labels) of ``service``; None when not declared."""
    table = _help_by_key()
    return table.get((service, kind, key)) or table.get(("", kind, key))
