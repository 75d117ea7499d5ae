"""Actor throughput on one core: raw emulator speed, bare random-action loop vs the full actor loop, CartPole x64.

Everything runs in this process pinned to one core with one torch thread. The actor loop is the real
one (ActorCore + TransitionSender): batched inference under ``torch.inference_mode``, epsilon-greedy,
n-step returns and priorities, encoding, and a PUSH over TCP loopback to a sink process that discards
(standing in for replay). Bare loops and actor loops are measured alternately, run after run, so
both see the same machine load; medians are reported.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import zmq

from flywheel.bench.parts.sink import Sink
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median, rate
from flywheel.envs import action_count, env_spec, make_env, make_vector_env
from flywheel.envs.atari import AtariEnv
from flywheel.envs.mario import MarioEnv
from flywheel.services.actor.core import ActorCore
from flywheel.services.actor.malloc import keep_freed_frames
from flywheel.services.actor.policy import TorchPolicy, build_policy
from flywheel.services.actor.transport import TransitionSender, auto_batch_rows

DESCRIPTION = "actor loop vs bare env loop (Mario, Pong) on one core, raw emulator speed, CartPole/Snake x64"
OPTIONS = {
    "seconds": "CPU seconds per measurement (default 4, quick 1)",
    "pixel_envs": "envs per vector for Mario and Pong (default 8)",
    "cpu": "core to pin to (default: the last usable one)",
    "subprocess": "also measure Mario in double-buffered subprocess mode on all cores (1/0, default 1)",
    "cases": "which cases to run, comma separated: mario, pong, vector (CartPole, Snake) (default: all)",
    "freeze": "torch actors run a frozen TorchScript trace (1/0, default 1, as the service does)",
}
PIXEL_IDS = ("SuperMarioBros-1-1-v0", "ALE/Pong-v5")


@contextmanager
def one_core(cpu: int | None) -> Any:
    """Pin this process to one core and torch to one thread for the block."""
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if before is not None:
        os.sched_setaffinity(0, {cpu if cpu is not None else max(before)})
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if before is not None:
            os.sched_setaffinity(0, before)


@dataclass
class Timer:
    """Runs a loop until it has had ``cpu_s`` seconds of this process's CPU (or 30x that in wall time)."""

    cpu_s: float

    def __post_init__(self) -> None:
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def running(self) -> bool:
        return (time.process_time() - self.cpu0 < self.cpu_s
                and time.perf_counter() - self.wall0 < 30 * self.cpu_s)

    def rates(self, work: float) -> tuple[float, float]:
        """(work per CPU second, work per wall second)."""
        return (rate(work, time.process_time() - self.cpu0), rate(work, time.perf_counter() - self.wall0))


def raw_emulator(env_id: str, seconds: float) -> float:
    """Emulator frames per CPU second without any preprocessing (nes-py's or ALE's own step)."""
    env = make_env(env_id, seed=0)
    try:
        emulator = env.unwrapped
        if isinstance(emulator, MarioEnv):
            nes = emulator._nes
            nes.reset()

            def frame(i: int) -> None:
                if nes.step(0b10000010 if i % 16 else 0b10000011)[2]:  # run right, jump now and then
                    nes.reset()
        elif isinstance(emulator, AtariEnv):
            ale, actions = emulator._ale, emulator._actions

            def frame(i: int) -> None:
                ale.act(actions[i % len(actions)])
                if ale.game_over():
                    ale.reset_game()
        else:
            raise BenchError(f"{env_id}: the raw emulator rate is measured for Mario and Atari only")
        count, timer = 0, Timer(seconds)
        while timer.running():
            for _ in range(50):
                frame(count)
                count += 1
        return timer.rates(count)[0]
    finally:
        env.close()


def bare_loop(env_id: str, num_envs: int, seconds: float, seed: int) -> tuple[float, float]:
    """Agent steps per CPU second and per wall second of ``num_envs`` envs stepped with random actions."""
    envs = [make_env(env_id, seed=seed + i) for i in range(num_envs)]
    rng = np.random.default_rng(seed)
    n_actions = action_count(envs[0].action_space)
    try:
        for env in envs:
            env.reset()
        count, timer = 0, Timer(seconds)
        while timer.running():
            actions = rng.integers(n_actions, size=num_envs)
            for i, env in enumerate(envs):
                _, _, terminated, truncated, _ = env.step(int(actions[i]))
                if terminated or truncated:
                    env.reset()
            count += num_envs
        return timer.rates(count)
    finally:
        for env in envs:
            env.close()


@dataclass
class ActorRun:
    """One actor loop: agent steps per CPU second and per wall second, and CPU seconds per agent step by part."""

    steps_per_cpu_s: float
    steps_per_s: float
    env: float  # stepping the envs (or waiting for workers), main thread
    inference: float  # the forward passes, main thread
    bookkeeping: float  # n-step returns, priorities, epsilon-greedy, main thread
    send: float  # concatenating, encoding, handing to ZeroMQ, main thread
    rest: float  # everything else the process spent: ZeroMQ's I/O thread, the loop, telemetry-free glue


def actor_loop(env_id: str, num_envs: int, seconds: float, seed: int, ctx: zmq.Context, endpoint: str,
               mode: Literal["inprocess", "subprocess"] = "inprocess", freeze: bool = True) -> ActorRun:
    """The real acting loop (ActorCore + TransitionSender), its parts timed in thread CPU time."""
    spec = env_spec(env_id)
    torch.manual_seed(seed)
    policy = build_policy(spec.obs_shape, spec.n_actions, threads=1, seed=seed, freeze=freeze,
                          obs_dtype=spec.obs_dtype)  # as the service builds it
    vec = make_vector_env(env_id, num_envs, seed, mode=mode)
    clock = time.perf_counter if mode == "subprocess" else time.thread_time
    core = ActorCore(vec, policy, n_step=3, gamma=0.99, seed=seed, clock=clock)
    core.epsilon = 0.4  # Ape-X actor 0
    row_bytes = 2 * int(np.prod(spec.obs_shape)) * np.dtype(spec.obs_dtype).itemsize
    sender = TransitionSender(ctx, endpoint, "bench", hwm=64, on_full="block",
                              batch_rows=auto_batch_rows(num_envs, row_bytes), clock=clock)  # as the service does
    try:
        for _ in range(2 * len(core.groups)):  # fill the n-step window edge and the pipeline
            sender.add(core.step(), 1, lambda: True)
        steps0, times0, send0 = core.env_steps, dict(vars(core.times)), sender.send_s
        timer = Timer(seconds)
        while timer.running():
            sender.add(core.step(), 1, lambda: True)
        steps = max(core.env_steps - steps0, 1)
        cpu_rate, wall_rate = timer.rates(steps)
        per = {k: (v - times0[k]) / steps for k, v in vars(core.times).items()}
        send = (sender.send_s - send0) / steps
        rest = max(0.0, 1.0 / cpu_rate - per["env"] - per["inference"] - per["other"] - send)
        return ActorRun(cpu_rate, wall_rate, per["env"], per["inference"], per["other"], send, rest)
    finally:
        sender.close()
        core.close()


def forward_pair(env_id: str, batch: int, seconds: float, seed: int) -> tuple[float, float]:
    """CPU seconds per batched forward pass, (frozen TorchScript trace, eager module), same weights, alternating."""
    spec = env_spec(env_id)
    torch.manual_seed(seed)
    frozen = build_policy(spec.obs_shape, spec.n_actions, threads=1, freeze=True, obs_dtype=spec.obs_dtype)
    eager = build_policy(spec.obs_shape, spec.n_actions, threads=1, freeze=False, obs_dtype=spec.obs_dtype)
    if not isinstance(frozen, TorchPolicy) or not isinstance(eager, TorchPolicy):
        raise BenchError(f"{env_id}: the acting network is not a torch module, so there is no trace to compare")
    eager.net.load_state_dict(frozen.net.state_dict())
    obs = np.random.default_rng(seed).integers(0, 256, size=(batch, *spec.obs_shape)).astype(spec.obs_dtype)
    if not np.array_equal(frozen.q_values(obs), eager.q_values(obs)):
        raise BenchError("the frozen trace and the eager network disagree")
    spent = {"frozen": 0.0, "eager": 0.0}
    calls = 0
    timer = Timer(seconds)
    while timer.running():
        for name, policy in (("frozen", frozen), ("eager", eager)):
            start = time.thread_time()
            for _ in range(5):
                policy.q_values(obs)
            spent[name] += time.thread_time() - start
        calls += 5
    return spent["frozen"] / calls, spent["eager"] / calls


def _median_run(runs: list[ActorRun]) -> ActorRun:
    return ActorRun(*(median([getattr(r, f) for r in runs]) for f in ActorRun.__dataclass_fields__))


def _pair(ctx: BenchContext, label: str, env_id: str, num_envs: int, seconds: float, runs: int,
          zctx: zmq.Context, endpoint: str, freeze: bool = True) -> tuple[list[tuple[float, float]], list[ActorRun]]:
    """Bare loop and actor loop, alternately, warm-up runs discarded."""
    bare, actor = [], []
    for i in range(ctx.warmup + runs):
        ctx.progress(f"{label}: bare loop / actor loop, run {i + 1}/{ctx.warmup + runs}")
        b = bare_loop(env_id, num_envs, seconds, ctx.seed)
        a = actor_loop(env_id, num_envs, seconds, ctx.seed, zctx, endpoint, freeze=freeze)
        if i >= ctx.warmup:
            bare.append(b)
            actor.append(a)
    return bare, actor


def run(ctx: BenchContext) -> SuiteResult:
    seconds = float(ctx.option("seconds", "1" if ctx.quick else "4"))
    pixel_envs = int(ctx.option("pixel_envs", "8"))
    cpu = ctx.option("cpu", "")
    with_subprocess = ctx.option("subprocess", "0" if ctx.quick else "1") == "1"
    runs = 1 if ctx.quick else ctx.runs
    cases = set(ctx.option("cases", "mario,pong,vector").split(","))
    if not cases <= {"mario", "pong", "vector"}:
        raise BenchError(f"--opt cases: expected mario, pong and/or vector, got {','.join(sorted(cases))}")
    freeze = ctx.option("freeze", "1") == "1"
    keep_freed_frames()  # as the actor service does at start; the bare loops get it too
    result = SuiteResult(suite="actor", title="Actor: agent steps per CPU second on one core")
    extra: dict[str, Any] = {}
    zctx = zmq.Context()
    sink = Sink(int(cpu) if cpu else None)
    try:
        with one_core(int(cpu) if cpu else None):
            for env_id in PIXEL_IDS:
                short = "Mario 1-1" if env_id.startswith("Super") else "Pong"
                if short.split()[0].lower() not in cases:
                    continue
                ctx.progress(f"{short}: raw emulator frames per CPU second")
                raw = [raw_emulator(env_id, seconds) for _ in range(runs)]
                result.rows.append(Row(f"{short}: raw emulator, no preprocessing (the ceiling)", "frames per CPU s",
                                       "frames/s", median(raw), flywheel_runs=raw))
                result.rows.append(Row(f"{short}: raw emulator / 4, the agent-step ceiling", "steps per CPU s",
                                       "steps/s", median(raw) / 4))
                bare, actor = _pair(ctx, f"{short} x{pixel_envs}", env_id, pixel_envs, seconds, runs, zctx,
                                    sink.endpoint, freeze)
                m = _median_run(actor)
                bare_cpu = median([b[0] for b in bare])
                result.rows.append(Row(
                    f"{short} x{pixel_envs}: actor loop vs bare random loop", "agent steps per CPU s", "steps/s",
                    m.steps_per_cpu_s, bare_cpu, "bare random-action loop",
                    flywheel_runs=[r.steps_per_cpu_s for r in actor], peer_runs=[b[0] for b in bare],
                    goal="actor >= 0.91x bare (<= 10% overhead)"))
                bare_step = 1.0 / bare_cpu
                framework = 1.0 / m.steps_per_cpu_s - m.inference - bare_step  # below 0: within the noise
                result.rows.append(Row(f"{short} x{pixel_envs}: actor overhead besides the forward pass",
                                       "share of a bare step", "%", framework / bare_step * 100,
                                       higher_is_better=False, goal="<= 10%"))
                result.rows.append(Row(f"{short} x{pixel_envs}: Nature CNN forward pass (batch {pixel_envs})",
                                       "share of a bare step", "%", m.inference / bare_step * 100,
                                       higher_is_better=False))
                ctx.progress(f"{short}: forward pass, frozen trace vs eager module")
                pairs = [forward_pair(env_id, pixel_envs, seconds, ctx.seed) for _ in range(runs)]
                result.rows.append(Row(
                    f"{short} x{pixel_envs}: Nature CNN forward (batch {pixel_envs}), same weights and results",
                    "CPU ms per batch", "ms", median([p[0] * 1e3 for p in pairs]), median([p[1] * 1e3 for p in pairs]),
                    "eager nn.Module", higher_is_better=False, flywheel_runs=[p[0] * 1e3 for p in pairs],
                    peer_runs=[p[1] * 1e3 for p in pairs]))
                extra[short] = {"bare_steps_per_cpu_s_and_wall_s": bare, "actor": [vars(r) for r in actor],
                                "forward_frozen_eager_s": pairs}
            for env_id, label in (("CartPole-v1", "CartPole x64"), ("Snake-v0", "Snake 10x10 x64")):
                if "vector" not in cases:
                    continue
                bare, actor = _pair(ctx, label, env_id, 64, seconds, runs, zctx, sink.endpoint)
                m = _median_run(actor)
                goal = ">= 20,000 steps/s on one core" if env_id == "CartPole-v1" else "natively vectorised"
                result.rows.append(Row(
                    f"{label}: full actor loop, inference included", "agent steps per CPU s", "steps/s",
                    m.steps_per_cpu_s, median([b[0] for b in bare]), "bare random loop (one env at a time)",
                    flywheel_runs=[r.steps_per_cpu_s for r in actor], peer_runs=[b[0] for b in bare], goal=goal))
                extra[label] = {"bare_steps_per_cpu_s_and_wall_s": bare, "actor": [vars(r) for r in actor]}
        if with_subprocess and "mario" in cases:
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            torch.set_num_threads(1)
            inproc, subproc = [], []
            for i in range(ctx.warmup + runs):
                ctx.progress(f"Mario x{pixel_envs}: in-process vs subprocess ({workers} workers), run {i + 1}")
                a = actor_loop(PIXEL_IDS[0], pixel_envs, seconds, ctx.seed, zctx, sink.endpoint, freeze=freeze)
                b = actor_loop(PIXEL_IDS[0], pixel_envs, seconds, ctx.seed, zctx, sink.endpoint, mode="subprocess",
                               freeze=freeze)
                if i >= ctx.warmup:
                    inproc.append(a.steps_per_s)
                    subproc.append(b.steps_per_s)
            result.rows.append(Row(
                f"Mario 1-1 x{pixel_envs}: double-buffered subprocess vector, {workers} cores",
                "agent steps per wall s", "steps/s", median(subproc), median(inproc), "in-process vector (same cores)",
                flywheel_runs=subproc, peer_runs=inproc, goal="scales with cores"))
    finally:
        sink.close()
        zctx.term()
    result.extra = extra
    result.notes += [
        "Rates are per CPU second of the measuring process (time.process_time, ZeroMQ's I/O thread included): on a "
        "shared machine that is what one dedicated core would do. Wall-clock rates are in the JSON "
        "(steps_per_s). The subprocess row is wall-clock, since it is about using more cores.",
        "One core (sched_setaffinity) and one torch thread for the actor; the sink that receives and discards the "
        "messages, standing in for replay, is a separate process on the other core.",
        "The actor loop is ActorCore + TransitionSender: the Nature CNN forward for the whole vector (a frozen "
        "TorchScript trace under torch.inference_mode, as the service runs it; --opt freeze=0: the eager module), "
        "epsilon 0.4, 3-step returns and priorities, msgpack+raw-frame encoding, ZeroMQ PUSH "
        "over TCP loopback, with the service's own batch size. The bare loop steps the same number of envs with "
        "random actions and nothing else.",
        "'Actor overhead besides the forward pass' = (actor CPU per agent step - forward pass - bare CPU per agent "
        "step) / bare CPU per agent step; the forward pass is its own row, since a random loop has no network. "
        "It is a difference of two noisy medians: a value below zero means the overhead is within the noise.",
    ]
    _plot(result, ctx)
    return result


def _plot(result: SuiteResult, ctx: BenchContext) -> None:
    """A bar chart of actor vs bare steps/s per case (skipped if matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    pairs = [(r, r.peer) for r in result.rows if r.peer is not None and r.unit == "steps/s"]
    if not pairs:
        return
    rows = [r for r, _ in pairs]
    fig, ax = plt.subplots(figsize=(9, 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [peer for _, peer in pairs], 0.4, label="peer (bare loop / in-process)")
    ax.bar(x + 0.2, [r.flywheel for r in rows], 0.4, label="Flywheel actor")
    ax.set_xticks(x, [r.case.split(":")[0] for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("agent steps/s")
    ax.legend()
    fig.tight_layout()
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.out_dir / "actor.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    result.plots.append(path.name)
