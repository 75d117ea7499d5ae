"""Tuning-only evaluation used for results/mario_tuning.json: the same rules as flywheel.evaluation.

Usage: python docs/benchmarks/mario_tuning_eval.py CHECKPOINT ENV_ID EPISODES PART PARTS. Plays episodes
PART, PART + PARTS, ... of seeds 200000 + i with the checkpoint's online network at epsilon 0.05; an episode ends
at death, flag, the env's limit, or 250 agent steps without a new furthest x_pos. Prints one JSON line each.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from safetensors import safe_open

from flywheel.envs import env_spec, make_env
from flywheel.nets import build_q_network


def main(checkpoint: str, env_id: str, episodes: int, part: int, parts: int) -> None:
    torch.set_num_threads(1)
    spec = env_spec(env_id)
    net = build_q_network(spec.obs_shape, spec.n_actions)
    with safe_open(checkpoint, "pt") as fh:
        net.load_state_dict({k[len("online."):]: fh.get_tensor(k) for k in fh.keys() if k.startswith("online.")})
    net.eval()
    for episode in range(part, episodes, parts):
        seed = 200_000 + episode
        env = make_env(env_id, seed=seed)
        rng = np.random.default_rng(seed)
        obs, info = env.reset(seed=seed)
        best, since, flag, steps = info["x_pos"], 0, False, 0
        while steps < 4500:
            steps += 1
            if rng.random() < 0.05:
                action = int(rng.integers(spec.n_actions))
            else:
                with torch.inference_mode():
                    action = int(net(torch.from_numpy(obs[None])).argmax())
            obs, _, terminated, truncated, info = env.step(action)
            flag = flag or info["flag_get"]
            best, since = (info["x_pos"], 0) if info["x_pos"] > best else (best, since + 1)
            if terminated or truncated or since >= 250:
                break
        env.close()
        print(json.dumps({"seed": seed, "x": best, "flag": flag, "steps": steps}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
