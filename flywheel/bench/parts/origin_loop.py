"""The single-process DQN loop the origin reports started from, measured: one env, act -> learn -> act.

What it keeps from them, on purpose: one environment stepped one action at a time; a replay memory of Python tuples
behind a ``threading.Lock`` taken for every add and every sample (000's experience processor, 003's shared buffer);
batches built with list comprehensions (001's "before"); an acting copy of the network refreshed from the learner
by cloning the state dict every ``sync_epochs`` epochs and comparing weights on each sync (000's model updates
every 3 epochs, 003's weight comparison). Learning happens in the same loop every ``learn_every`` env steps, so the
environment waits while the network trains. Everything is timed: acting, learning, syncing, lock waits and every
epoch (``epoch_steps`` env steps with their training).

Run as ``python -m flywheel.bench.parts.origin_loop CONFIG_JSON`` (``flywheel bench origins`` does); prints one
JSON line with the measurement.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections import deque
from typing import Any

import numpy as np


class LockedMemory:
    """A deque of (obs, action, reward, next_obs, done) tuples behind one lock, as the originals had it."""

    def __init__(self, capacity: int) -> None:
        self.items: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self.lock = threading.Lock()
        self.lock_wait_s = 0.0

    def _acquire(self) -> None:
        began = time.perf_counter()
        self.lock.acquire()
        self.lock_wait_s += time.perf_counter() - began

    def add(self, item: tuple[Any, ...]) -> None:
        self._acquire()
        try:
            self.items.append(item)
        finally:
            self.lock.release()

    def sample(self, batch: int) -> list[tuple[Any, ...]]:
        self._acquire()
        try:
            return random.sample(self.items, batch)
        finally:
            self.lock.release()

    def __len__(self) -> int:
        return len(self.items)


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Warm up (fill ``min_size``), then run the loop for ``seconds`` and return rates, shares and epoch times."""
    import torch
    from torch.nn import functional as F

    from flywheel.envs import env_spec, make_env
    from flywheel.nets import build_q_network

    if int(config.get("threads", 1)) > 0:  # 0: torch's default (all cores)
        torch.set_num_threads(int(config.get("threads", 1)))
    seed = int(config.get("seed", 0))
    random.seed(seed)
    torch.manual_seed(seed)
    env_id, batch, gamma = config["env"], int(config["batch"]), float(config.get("gamma", 0.99))
    spec = env_spec(env_id)
    hidden = int(config.get("hidden", 256))
    online = build_q_network(spec.obs_shape, spec.n_actions, hidden=hidden)
    target = build_q_network(spec.obs_shape, spec.n_actions, hidden=hidden)
    acting = build_q_network(spec.obs_shape, spec.n_actions, hidden=hidden)
    target.load_state_dict(online.state_dict())
    acting.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=float(config.get("lr", 1e-4)))
    memory = LockedMemory(int(config["capacity"]))
    env = make_env(env_id, seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    eps = float(config.get("epsilon", 0.1))
    learn_every, min_size = int(config["learn_every"]), int(config["min_size"])
    epoch_steps, sync_epochs = int(config.get("epoch_steps", 4096)), int(config.get("sync_epochs", 3))
    target_every = int(config.get("target_update_interval", 500))
    t: dict[str, float] = {"act": 0.0, "learn": 0.0, "sync": 0.0}
    counts = {"steps": 0, "updates": 0, "episodes": 0}
    epoch_times: list[float] = []
    measuring = False

    def act_once() -> None:
        nonlocal obs
        began = time.perf_counter()
        if rng.random() < eps:
            action = int(rng.integers(spec.n_actions))
        else:
            with torch.no_grad():
                action = int(acting(torch.tensor(np.asarray(obs)[None])).argmax(dim=1).item())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        memory.add((obs, action, float(reward), next_obs, bool(terminated)))
        if terminated or truncated:
            next_obs, _ = env.reset()
            counts["episodes"] += measuring
        obs = next_obs
        t["act"] += (time.perf_counter() - began) * measuring

    def learn_once() -> None:
        began = time.perf_counter()
        items = memory.sample(batch)
        states = torch.tensor(np.array([i[0] for i in items]))
        actions = torch.tensor([i[1] for i in items])
        rewards = torch.tensor([i[2] for i in items], dtype=torch.float32)
        next_states = torch.tensor(np.array([i[3] for i in items]))
        dones = torch.tensor([i[4] for i in items], dtype=torch.float32)
        q = online(states).gather(1, actions[:, None]).squeeze(1)
        with torch.no_grad():
            q_next = target(next_states).max(dim=1).values
        loss = F.smooth_l1_loss(q, rewards + gamma * (1 - dones) * q_next)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(online.parameters(), 10.0)
        optimizer.step()
        counts["updates"] += measuring
        if (counts["updates"] + 1) % target_every == 0:
            target.load_state_dict(online.state_dict())
        t["learn"] += (time.perf_counter() - began) * measuring

    def sync() -> None:
        began = time.perf_counter()
        cloned = {k: v.clone() for k, v in online.state_dict().items()}
        before = next(iter(acting.state_dict().values())).clone()
        acting.load_state_dict(cloned)
        after = next(iter(acting.state_dict().values()))
        config["_last_weight_diff"] = float((after - before).abs().mean())  # 003 logged this on every sync
        t["sync"] += (time.perf_counter() - began) * measuring

    while len(memory) < max(min_size, batch):
        act_once()
    measuring = True
    memory.lock_wait_s = 0.0
    started = epoch_start = time.perf_counter()
    cpu_started = time.process_time()
    step = 0
    while time.perf_counter() - started < float(config["seconds"]):
        act_once()
        step += 1
        counts["steps"] += 1
        if step % learn_every == 0:
            learn_once()
        if step % epoch_steps == 0:
            now = time.perf_counter()
            epoch_times.append(now - epoch_start)
            epoch_start = now
            if len(epoch_times) % sync_epochs == 0:
                sync()
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    env.close()
    return {
        "seconds": elapsed, "env_steps": counts["steps"], "updates": counts["updates"],
        "samples": counts["updates"] * batch, "episodes": counts["episodes"],
        "act_s": t["act"], "learn_s": t["learn"], "sync_s": t["sync"], "lock_wait_s": memory.lock_wait_s,
        "epoch_times": epoch_times, "drops": 0, "cpu_s": cpu_s, "threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m flywheel.bench.parts.origin_loop CONFIG_JSON (started by flywheel bench origins)")
    print(json.dumps(measure(json.loads(sys.argv[1]))), flush=True)
