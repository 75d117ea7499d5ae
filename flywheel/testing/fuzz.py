"""A bounded Hypothesis fuzz of every socket a peer can reach and every HTTP route, on live service processes.

``run_fuzz`` starts a gateway, a replay and a learner (``Cluster``, CartPole shapes), then sends each bound
ZeroMQ socket ``examples`` messages drawn by Hypothesis (well-formed messages of every kind with extreme values,
headers of wrong types, wrong kinds, truncated, duplicated and extra parts, junk, oversized messages) and each
HTTP route ``http_examples`` requests (every method, odd paths, queries, bodies and tokens). It checks, and
returns as figures: no process died, no HTTP answer was a 5xx, each service counted at least every message its
own codec refuses, the peak resident memory growth of each process, and that real traffic still flows afterwards.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import msgpack
import numpy as np
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from flywheel import proto
from flywheel.proto.messages import BOOL, FLOAT, FLOAT_MAP, INT, MESSAGE_TYPES, SCALAR_MAP, STR, STR_MAP, ArraySpec
from flywheel.testing.cluster import Cluster, ClusterError
from flywheel.transport import LEASE_MAX_BYTES, MAX_PARTS, TELEMETRY_MAX_BYTES, make_socket

NAMES = ("gateway-0", "replay-0", "learner-0")
OBS_WIDTH = 4  # CartPole
REPLAY_MAX_MB = 16


@dataclass(frozen=True)
class Target:
    """One bound socket: the peer socket type, the kinds it takes, the limits it decodes with, its byte budget."""

    kind: int
    expect: tuple[type[proto.Message], ...]
    max_bytes: int
    limits: proto.Limits = proto.DEFAULT_LIMITS
    req_delimiter: bool = False  # an empty first frame is a REQ socket's delimiter, not part of the message


TARGETS: dict[str, Target] = {
    "transitions": Target(zmq.PUSH, (proto.TransitionBatch,), REPLAY_MAX_MB << 20,
                          proto.Limits(max_total_bytes=REPLAY_MAX_MB << 20, max_array_bytes=REPLAY_MAX_MB << 20)),
    "sample": Target(zmq.DEALER, (proto.SampleRequest, proto.PriorityUpdate), 64 << 20),
    "telemetry": Target(zmq.PUSH, (proto.Telemetry, proto.ClipChunk), TELEMETRY_MAX_BYTES),
    "lease": Target(zmq.DEALER, (proto.LeaseRequest,), LEASE_MAX_BYTES, req_delimiter=True),
    "weights": Target(zmq.XSUB, (), 4096),  # PUB sockets read subscriptions only
    "control": Target(zmq.XSUB, (), 4096),
}

# ---- strategies ------------------------------------------------------------------------------------------------
EXTREME_FLOATS = st.one_of(st.floats(), st.sampled_from([1.7e308, -1.7e308, 1e-320, 0.0, -0.0, math.nan, math.inf]))
INTS = st.one_of(st.integers(-3, 70_000), st.integers(-(2**63), 2**63 - 1),
                 st.sampled_from([2**64 - 1, 2**63, -(2**63)]))
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", "../../etc/passwd", "gateway", "x" * 300, "\x00",
                                                        "/dev/shm/x", "a" * 255, 'q"uote{}\n']))
ANY_SCALAR = st.one_of(INTS, EXTREME_FLOATS, TEXT, st.booleans(), st.none(), st.binary(max_size=16))


def _scalar(tag: str, strict: bool) -> st.SearchStrategy[Any]:
    """A value for a scalar field: of its type (``strict``, with extreme values), or sometimes of any type."""
    typed = {INT: INTS, FLOAT: EXTREME_FLOATS, STR: TEXT, BOOL: st.booleans(),
             FLOAT_MAP: st.dictionaries(TEXT, EXTREME_FLOATS, max_size=8),
             STR_MAP: st.dictionaries(TEXT, TEXT, max_size=6),
             SCALAR_MAP: st.dictionaries(TEXT, st.one_of(INTS, EXTREME_FLOATS, TEXT, st.booleans()),
                                         max_size=6)}[tag]
    return typed if strict else st.one_of(typed, ANY_SCALAR)


@st.composite
def _array(draw: st.DrawFn, name: str, spec: ArraySpec, rows: int, rest: list[int], strict: bool,
           ) -> tuple[list[Any], bytes]:
    """One array's spec entry and bytes. ``strict``: an allowed dtype and rank, the message's shared inner shape
    and exactly the bytes announced (values still drawn freely); otherwise any of those may be off."""
    dtype = draw(st.sampled_from(spec.dtypes)) if strict else draw(st.sampled_from(
        [*spec.dtypes, "float64", "int8", "bool", "object"]))
    ndim = (min(max(spec.min_ndim, 1 + len(rest)), spec.max_ndim) if strict
            else draw(st.integers(max(1, spec.min_ndim - 1), spec.max_ndim + 1)))
    shape = [rows, *(rest + [OBS_WIDTH] * ndim)[: ndim - 1]]
    size = int(np.prod(shape)) * (np.dtype(dtype).itemsize if dtype != "object" else 8)
    if draw(st.booleans()):
        data = draw(st.binary(min_size=min(size, 256), max_size=min(size, 256))) * (size // 256 + 1)
    else:  # small values: valid actions, indices and priorities, so a message can go deep into a service
        small = np.arange(max(1, size), dtype=np.uint8) % draw(st.integers(1, 4))
        data = small.astype(dtype if dtype in ("float32", "int64", "uint8") else "uint8").tobytes()
    cut = 0 if strict or draw(st.integers(0, 3)) else draw(st.integers(1, 8))
    return [name, dtype, shape], data[: max(0, size - cut)]


@st.composite
def raw_message(draw: st.DrawFn, cls: type[proto.Message]) -> list[bytes]:
    """A header of ``cls`` with drawn scalars and arrays: mostly well formed (so a message reaches the service's
    own checks with extreme values), otherwise with fields missing or of other types, shapes, dtypes or sizes."""
    strict = draw(st.integers(0, 9)) < 7
    fields = {name: draw(_scalar(tag, strict)) for name, tag in cls.SCALARS.items()
              if strict or draw(st.integers(0, 9))}
    rows = draw(st.sampled_from([1, 2, 8, 32] if strict else [0, 1, 8, 32]))
    rest = [OBS_WIDTH] if strict and draw(st.integers(0, 3)) else draw(st.lists(st.sampled_from([1, 3, 4, 0, 84]),
                                                                                 max_size=3))
    specs, frames = [], []
    arrays = dict(cls.ARRAYS)
    if cls.DYNAMIC_ARRAYS is not None:
        names = st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=20)
        arrays = dict.fromkeys(draw(st.lists(names, min_size=1, max_size=3, unique=True)), cls.DYNAMIC_ARRAYS[1])
    for name, spec in arrays.items():
        if spec.optional and draw(st.booleans()):
            continue
        entry, data = draw(_array(name, spec, rows, rest, strict))
        specs.append(entry)
        frames.append(data)
    version = proto.SCHEMA_VERSION if strict else draw(st.sampled_from([proto.SCHEMA_VERSION, 0, 99]))
    header = msgpack.packb({"k": cls.KIND, "v": version, "f": fields, "a": specs}, use_bin_type=True)
    return [header, *frames]


@st.composite
def mutated(draw: st.DrawFn, frames: list[bytes]) -> list[bytes]:
    """``frames`` as they are, or with a part flipped, cut, dropped, doubled, or with many more parts."""
    how = draw(st.sampled_from(["none"] * 12 + ["flip", "cut", "drop", "double", "parts", "bulk"]))
    out = list(frames)
    i = draw(st.integers(0, max(0, len(out) - 1)))
    if how == "flip" and out and out[i]:
        b = bytearray(out[i])
        b[draw(st.integers(0, len(b) - 1))] ^= 1 << draw(st.integers(0, 7))
        out[i] = bytes(b)
    elif how == "cut" and out:
        out[i] = out[i][: draw(st.integers(0, len(out[i])))]
    elif how == "drop" and len(out) > 1:
        del out[i]
    elif how == "double" and out:
        out.insert(i, out[i])
    elif how == "parts":
        out += [b"p"] * draw(st.integers(1, 3 * MAX_PARTS))
    elif how == "bulk":
        out += [bytes(60 * 1024)] * draw(st.integers(1, 20))
    return out


def socket_inputs(target: Target) -> st.SearchStrategy[list[bytes]]:
    """What a hostile or broken peer may send to one socket."""
    every_kind = sorted(MESSAGE_TYPES.values(), key=lambda c: c.KIND)
    own = [raw_message(c) for c in target.expect]
    kinds = st.one_of(*own, *own, *own, st.sampled_from(every_kind).flatmap(raw_message))
    junk = st.lists(st.binary(max_size=64), min_size=1, max_size=6)
    subscriptions = st.lists(st.binary(min_size=1, max_size=80).map(lambda b: bytes([b[0] % 3]) + b[1:]),
                             min_size=1, max_size=3)
    base = st.one_of(kinds, kinds, kinds, junk) if target.expect else st.one_of(junk, subscriptions)
    return base.flatmap(mutated)


def expected_refusal(target: Target, frames: list[bytes]) -> bool:
    """Whether the socket's own budget or codec refuses ``frames`` (a lower bound on what the service counts)."""
    if len(frames) + (target.kind == zmq.DEALER) > MAX_PARTS or sum(map(len, frames)) > target.max_bytes:
        return True
    if target.req_delimiter and len(frames) > 1 and not frames[0]:
        frames = frames[1:]
    try:
        proto.decode(frames, expect=target.expect, limits=target.limits)
    except proto.DecodeError:
        return True
    return False


# ---- HTTP ------------------------------------------------------------------------------------------------------
@st.composite
def http_request(draw: st.DrawFn, routes: list[tuple[str, str]], token: str) -> tuple[str, str, bytes, dict[str, str]]:
    method, path = draw(st.sampled_from(routes))
    method = draw(st.sampled_from([method] * 4 + ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
    segment = quote(draw(st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="/?#%"),
                                 min_size=1, max_size=30)), safe="")
    path = path.replace("{command}", draw(st.sampled_from(["pause", "resume", "set_lr", "checkpoint", segment])))
    if draw(st.integers(0, 5)) == 0:
        path = f"{path.rstrip('/')}/{segment}"
    query = draw(st.dictionaries(st.sampled_from(["interval_s", "limit", "since", "n", "target", segment]),
                                 st.one_of(st.integers(-(2**70), 2**70).map(str), st.sampled_from(["nan", "inf", ""]),
                                           st.text(max_size=12)), max_size=3))
    if query:
        path = f"{path}?{urlencode(query)}"
    body_json = st.dictionaries(TEXT, st.one_of(INTS, st.floats(allow_nan=False, allow_infinity=False), TEXT,
                                                st.booleans(), st.none(), st.lists(INTS, max_size=3)), max_size=5)
    body = draw(st.one_of(st.just(b""), body_json.map(lambda d: json.dumps(d).encode()), st.binary(max_size=200)))
    auth = draw(st.sampled_from([f"Bearer {token}", f"Bearer {token}", "Bearer wrong", "Basic eA==", ""]))
    headers = {"Content-Type": draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-"
                                                     "urlencoded", ""]))}
    if auth:
        headers["Authorization"] = auth
    return method, path, body, headers


def http_routes(port: int) -> list[tuple[str, str]]:
    """Every (method, path) the gateway's OpenAPI schema lists, plus the routes it keeps out of the schema."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/openapi.json")
    schema = json.loads(conn.getresponse().read())
    conn.close()
    routes = [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]
    return sorted({*routes, ("GET", "/"), ("POST", "/control/{command}"), ("GET", "/openapi.json"),
                   ("GET", "/docs")})


# ---- the run -----------------------------------------------------------------------------------------------------
@dataclass
class FuzzFigures:
    """What one fuzz run tried and saw; ``as_dict`` is the raw result."""

    inputs: Counter[str] = field(default_factory=Counter)
    expected_refused: Counter[str] = field(default_factory=Counter)
    cut: Counter[str] = field(default_factory=Counter)  # inputs with a part past the socket's cap: cut by libzmq
    counted_refused: dict[str, float] = field(default_factory=dict)
    http_requests: Counter[str] = field(default_factory=Counter)
    http_status: Counter[str] = field(default_factory=Counter)
    http_5xx: list[str] = field(default_factory=list)
    rss_before_mib: dict[str, float] = field(default_factory=dict)
    rss_peak_growth_mib: dict[str, float] = field(default_factory=dict)
    crashed: list[str] = field(default_factory=list)
    after: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Counter) else v) for k, v in self.__dict__.items()}


def fuzz_cluster(workdir: Path, token: str) -> Cluster:
    cluster = Cluster(workdir, settings={
        "gateway": {"CONTROL_TOKEN": token, "MAX_INSTANCES": "64"},
        "replay": {"CAPACITY": "20000", "MIN_SIZE_TO_SAMPLE": "64", "MAX_MESSAGE_MB": str(REPLAY_MAX_MB)},
        "learner": {"BATCH_SIZE": "32", "HIDDEN": "32", "PUBLISH_INTERVAL_UPDATES": "5", "TORCH_THREADS": "1"},
    })
    for service in ("gateway", "replay", "learner"):
        cluster.add(service)
    return cluster


def run_fuzz(workdir: Path, *, examples: int = 200, http_examples: int = 100, seed: int = 0,
             progress: Callable[[str], None] = lambda _m: None) -> FuzzFigures:
    """Fuzz a live gateway, replay and learner; the figures (raises ClusterError when a process dies)."""
    token = "fuzz-token-0123456789abcdef"
    figures = FuzzFigures()
    cluster = fuzz_cluster(workdir, token)
    ctx = zmq.Context()
    started = time.monotonic()
    try:
        cluster.start_all()
        cluster.wait(lambda: cluster.is_up("replay-0") and cluster.is_up("learner-0"), 120,
                     "the replay and the learner to report", alive=list(NAMES))
        figures.rss_before_mib = {n: cluster.rss(n) / 2**20 for n in NAMES}
        peak = dict(figures.rss_before_mib)

        def watch() -> None:
            cluster.check_alive(list(NAMES))
            for n in NAMES:
                peak[n] = max(peak[n], cluster.rss(n) / 2**20)

        for name, target in TARGETS.items():
            progress(f"socket {name}: {examples} inputs")
            _fuzz_socket(ctx, cluster.endpoint(name), name, target, examples, seed, figures, watch)
        progress(f"HTTP: {http_examples} requests")
        routes = http_routes(cluster.ports["http"])

        @hypothesis_seed(seed)
        @settings(max_examples=http_examples, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(request=http_request(routes, token))
        def call(request: tuple[str, str, bytes, dict[str, str]]) -> None:
            method, path, body, headers = request
            conn = http.client.HTTPConnection("127.0.0.1", cluster.ports["http"], timeout=30)
            try:
                conn.request(method, path, body=body or None, headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            route = path.split("?")[0]
            figures.http_requests[f"{method} {route if route.count('/') < 3 else route.rsplit('/', 1)[0] + '/*'}"] += 1
            figures.http_status[str(status)] += 1
            if status >= 500:
                figures.http_5xx.append(f"{method} {path}: {status}")
            if sum(figures.http_status.values()) % 50 == 0:
                watch()

        call()
        watch()
        figures.rss_peak_growth_mib = {n: peak[n] - figures.rss_before_mib[n] for n in NAMES}
        figures.counted_refused = _counted(cluster)
        _undo_control(cluster.ports["http"], token)
        figures.after = _real_traffic_flows(cluster, ctx)
    except ClusterError:
        figures.crashed = [n for n in NAMES if not cluster.alive(n)]
        raise
    finally:
        figures.seconds = time.monotonic() - started
        ctx.destroy(linger=0)
        cluster.stop()
    return figures


def _fuzz_socket(ctx: zmq.Context, endpoint: str, name: str, target: Target, examples: int, seed: int,
                 figures: FuzzFigures, watch: Callable[[], None]) -> None:
    sock = make_socket(ctx, target.kind, sndhwm=100_000)
    sock.connect(endpoint)
    time.sleep(0.2)

    @hypothesis_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(frames=socket_inputs(target))
    def send(frames: list[bytes]) -> None:
        figures.inputs[name] += 1
        if max(map(len, frames)) > target.max_bytes:  # libzmq cuts the connection at such a part (ZMQ_MAXMSGSIZE)
            figures.cut[name] += 1  # and what followed it in flight: so each goes on a connection of its own
            once = make_socket(ctx, target.kind)
            once.connect(endpoint)
            once.send_multipart(frames, copy=False)
            once.close(linger=2000)
            return
        if not sock.poll(10_000, zmq.POLLOUT):
            raise ClusterError(f"{name}: the socket stayed full for 10 s")
        sock.send_multipart(frames, copy=False)
        figures.expected_refused[name] += bool(target.expect) and expected_refusal(target, frames)
        if figures.inputs[name] % 50 == 0:
            watch()

    try:
        send()
        watch()
    finally:
        sock.close(linger=10_000)  # what is still queued is delivered: every input counts


def _counted(cluster: Cluster) -> dict[str, float]:
    replay = cluster.instance("replay-0") or {}
    counts: dict[str, float] = {}
    for key, value in replay.get("counters", {}).items():
        for where in ("transitions", "sample"):
            if key.startswith(f'rejected_total{{where="{where}"'):
                counts[where] = counts.get(where, 0.0) + value
    conn = http.client.HTTPConnection("127.0.0.1", cluster.ports["http"], timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith("flywheel_gateway_messages_rejected_total{"):
            for where in ("telemetry", "lease"):
                if f'socket="{where}"' in line:
                    counts[where] = counts.get(where, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def _undo_control(port: int, token: str) -> None:
    """The fuzz held the token, so it may have paused training or changed the ratio: put both back, as an operator
    would (each command must be accepted)."""
    ratio = b'{"samples_per_insert": 1000, "error_buffer": 1e12}'
    for path, body in (("/control/resume", b""), ("/control/set_replay_ratio", ratio)):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", path, body=body or None, headers={"Authorization": f"Bearer {token}",
                                                              "Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        if status not in (200, 202):
            raise ClusterError(f"POST {path} after the fuzz answered {status}")


def _real_traffic_flows(cluster: Cluster, ctx: zmq.Context) -> dict[str, float]:
    """After the fuzz: 8 valid transition batches arrive and the learner trains on past where it was."""
    rows_before = cluster.value("replay-0", "transitions_received_total")
    updates_before = cluster.value("learner-0", "updates_total")
    push = make_socket(ctx, zmq.PUSH)
    push.connect(cluster.endpoint("transitions"))
    obs = np.zeros((64, OBS_WIDTH), np.float32)
    for seq in range(8):
        push.send_multipart(proto.encode(proto.TransitionBatch(
            actor="fuzz-probe", weight_version=1, seq=seq, obs=obs, action=np.arange(64, dtype=np.int64) % 2,
            reward=np.ones(64, np.float32), discount=np.full(64, 0.99, np.float32), next_obs=obs + 1,
            priority=np.ones(64, np.float32))))
    cluster.wait(lambda: cluster.value("replay-0", "transitions_received_total") >= rows_before + 512, 60,
                 "the probe's transitions to arrive after the fuzz", alive=list(NAMES))
    try:
        cluster.wait(lambda: cluster.value("learner-0", "updates_total") > updates_before + 10, 120,
                     "the learner to keep training after the fuzz", alive=list(NAMES))
    except ClusterError as exc:
        learner, replay = cluster.instance("learner-0") or {}, cluster.instance("replay-0") or {}
        raise ClusterError(f"{exc}\n--- learner: {learner.get('counters')} {learner.get('gauges')}\n--- replay: "
                           f"{replay.get('counters')} {replay.get('gauges')}") from None
    push.close(0)
    return {"probe_rows_received": cluster.value("replay-0", "transitions_received_total") - rows_before,
            "learner_updates_after": cluster.value("learner-0", "updates_total") - updates_before}
