"""The loops the learner benchmark compares: its cases, the bare PyTorch loop, the learner service and turns."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import zmq
from torch.nn import functional as F

from flywheel.bench.runner import BenchError
from flywheel.nets import build_q_network
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.loop import LearnerLoop, LoopConfig
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.learner.transport import open_sockets

ROUNDS = 20  # chunks per run, alternating between the loops (finer: load swings hit every loop alike)


@dataclass
class Case:
    key: str
    label: str
    obs_shape: tuple[int, ...]
    n_actions: int
    batch: int
    updates: int  # per measured run on CPU (GPU runs use GPU_UPDATES)
    fill: int  # transitions put into the replay before measuring


CASES = [
    Case("mlp128", "CartPole MLP, batch 128", (4,), 2, 128, 320, 20_000),
    Case("mlp512", "CartPole MLP, batch 512", (4,), 2, 512, 160, 20_000),
    Case("nature32", "Nature CNN 4x84x84, batch 32", (4, 84, 84), 7, 32, 24, 2_000),
    Case("nature512", "Nature CNN 4x84x84, batch 512", (4, 84, 84), 7, 512, 8, 2_000),
]
LR, ADAM_EPS, CLIP, GAMMA_N = 1e-4, 1.5e-4, 10.0, 0.99**3


def random_batch(case: Case, rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    if len(case.obs_shape) == 3:
        obs = rng.integers(0, 256, (size, *case.obs_shape), dtype=np.uint8)
        next_obs = rng.integers(0, 256, (size, *case.obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((size, *case.obs_shape)).astype(np.float32)
        next_obs = rng.standard_normal((size, *case.obs_shape)).astype(np.float32)
    return {"obs": obs, "next_obs": next_obs, "action": rng.integers(0, case.n_actions, size, dtype=np.int64),
            "reward": rng.standard_normal(size).astype(np.float32),
            "discount": np.full(size, GAMMA_N, dtype=np.float32)}


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class BareLoop:
    """What one writes by hand: online/target QNetwork, fused Adam, double-DQN weighted Huber, |td| kept."""

    def __init__(self, case: Case, device: torch.device, amp: torch.dtype | None, seed: int) -> None:
        torch.manual_seed(seed)
        self.device, self.amp = device, amp
        self.online = build_q_network(case.obs_shape, case.n_actions).to(device)
        self.target = build_q_network(case.obs_shape, case.n_actions).to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.opt = torch.optim.Adam(self.online.parameters(), lr=LR, eps=ADAM_EPS, fused=True)
        data = random_batch(case, np.random.default_rng(seed), case.batch)
        self.t = {k: torch.from_numpy(v).to(device) for k, v in data.items()}
        self.t["weight"] = torch.rand(case.batch, device=device)

    def step(self) -> torch.Tensor:
        t = self.t
        with torch.autocast(self.device.type, dtype=self.amp or torch.bfloat16, enabled=self.amp is not None):
            q = self.online(t["obs"])
            with torch.no_grad():
                best = self.online(t["next_obs"]).argmax(1, keepdim=True)
                q_next = self.target(t["next_obs"]).float().gather(1, best).squeeze(1)
        q_sa = q.float().gather(1, t["action"].unsqueeze(1)).squeeze(1)
        y = t["reward"] + t["discount"] * q_next
        loss = (t["weight"] * F.huber_loss(q_sa, y, reduction="none")).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), CLIP)
        self.opt.step()
        return (y - q_sa).detach().abs()  # the priorities a PER loop needs

    def seconds(self, n: int) -> float:
        """Wall time of ``n`` steps."""
        sync_device(self.device)
        start = time.perf_counter()
        for _ in range(n):
            td = self.step()
            if self.device.type == "cpu":
                td.numpy()
        sync_device(self.device)
        return time.perf_counter() - start


def start_learner(case: Case, config: CoreConfig, device: torch.device, endpoint: str, ctx: zmq.Context,
                  threads: int, seed: int, transport: str = "tcp") -> LearnerLoop:
    """A started learner loop sampling ``case.batch`` from the replay at ``endpoint`` over ``transport``."""
    settings = LearnerSettings.model_validate({
        "instance": "bench-learner", "env_id": "bench", "batch_size": case.batch, "lr": LR, "adam_eps": ADAM_EPS,
        "grad_clip_norm": CLIP, "sample_endpoint": endpoint, "sample_transport": transport,
        "weights_bind": "tcp://127.0.0.1:0", "telemetry_endpoint": f"inproc://bench-telemetry-{seed}",
        "control_endpoint": f"inproc://bench-control-{seed}", "torch_threads": threads, "device": device.type,
        "requests_in_flight": 4})
    torch.manual_seed(seed)
    core = LearnerCore(case.obs_shape, case.n_actions, config, device)
    service = LearnerLoop(LoopConfig.of(settings), core, open_sockets(settings, core, ctx))
    service.start()
    return service


def service_seconds(service: LearnerLoop, n: int) -> tuple[float, float]:
    """(wall time, time spent waiting for data) of ``n`` updates of the running service."""
    core = service.core
    goal = core.steps + n
    waited = service.counters.data_wait_seconds_total
    start = time.perf_counter()
    while core.steps < goal:
        if service.feeder.error is not None:
            raise BenchError(f"the learner's sampling failed: {service.feeder.error}")
        service.step(100)
    sync_device(core.device)
    return time.perf_counter() - start, service.counters.data_wait_seconds_total - waited


def interleaved(loops: dict[str, Callable[[int], float]], n: int, rounds: int) -> dict[str, float]:
    """Updates/s of each loop over ``n`` updates, run in ``rounds`` alternating chunks so load swings hit all;
    the order rotates every round, so no loop always goes first (or always follows the learner's refills)."""
    chunk = max(1, n // rounds)
    spent = dict.fromkeys(loops, 0.0)
    names = list(loops)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            spent[name] += loops[name](chunk)
    return {name: chunk * rounds / total for name, total in spent.items()}
