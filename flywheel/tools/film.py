"""The end-of-run film: the run's weights played under its evaluation protocol, the furthest episode filmed.

At the end of ``flywheel run`` the newest weights, and the learner's kept best when there is one, each play
``FILM_EPISODES`` seeded episodes with flywheel/evaluation.py under the protocol the run's learner evaluates with
(its ``best_eval_epsilon`` after 0..``best_eval_noop_max`` no-ops: an emulated game's preset may play epsilon 0.05
after 0-30 no-ops; others play greedily). The weights with the higher mean return are written to
CHECKPOINT_DIR/learner/preferred.json, which ``flywheel play``, ``Policy.load`` and ``flywheel export`` then take
by default (``--which auto``), and their episode that went furthest (the env's progress measure, else its return)
is played again, frame for frame (an episode depends only on policy, env, seed and protocol), into
CHECKPOINT_DIR/video.mp4 with a caption line under the picture: weights version, epsilon, how far, how it ended.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.checkpoints import CHECKPOINT_FILE, write_atomically
from flywheel.evaluation import Protocol, run_episode
from flywheel.evaluation import run_protocol as play_protocol
from flywheel.policy import BEST_FILE, PREFERRED_FILE, file_version
from flywheel.video import number

FILM_EPISODES = 6  # per candidate weights
FILM_SEED = 900_000  # the film's seeds: apart from the learner's (1,000,000+) and the benchmarks' (200,000-500,099)
FILM_MAX_STEPS = 3_000  # agent steps; a platformer level's clock ends an episode at about 2,400
CAPTION_PX = 14


def run_protocol(checkpoint_dir: Path) -> Protocol:
    """The learner's evaluation protocol from CHECKPOINT_DIR/run.json (greedy, no no-ops, when it names none), over
    the film's seeds."""
    try:
        saved = json.loads((checkpoint_dir / "run.json").read_text())
        learner = saved.get("settings", {}).get("learner")  # what the learner ran with, its preset read
        if learner is None:  # a run.json of an earlier version: the preset's values among the variables
            learner = {k.lower(): v for k, v in saved["services"]["learner"].items()}
        epsilon, noop_max = float(learner.get("best_eval_epsilon", 0.0)), int(learner.get("best_eval_noop_max", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        epsilon, noop_max = 0.0, 0
    return Protocol(episodes=FILM_EPISODES, seed=FILM_SEED, epsilons=(epsilon,), noop_max=noop_max,
                    max_steps=FILM_MAX_STEPS)


def _progress(record: dict[str, Any]) -> tuple[float, ...]:
    """How far an episode went: success first, then the env's progress measure, then its return."""
    progress = record.get("progress")
    return (float(bool(record.get("success"))), float(progress) if progress is not None else float("-inf"),
            float(record["return"]))


def caption(version: int, which: str, protocol: Protocol, record: dict[str, Any],
            labels: dict[str, str] | None = None) -> str:
    """One short line: weights, epsilon, how far the episode went (the env's progress measure with its label from
    ``labels``, else the return) and how it ended."""
    parts = [f"v{version} {which}", f"eps {protocol.epsilons[0]:g}"]
    if record.get("progress") is not None:
        parts.append(f"{(labels or {}).get('progress', 'progress')} {number(float(record['progress']))}")
    else:
        parts.append(f"return {float(record['return']):.1f}")
    parts.append(str(record.get("end") or "end"))
    return " | ".join(parts)


class CaptionedFrames:
    """Adds a caption strip under every frame before it goes to a video writer."""

    def __init__(self, append: Callable[[np.ndarray], None], text: str) -> None:
        self.append_to, self.text = append, text
        self._strip: np.ndarray | None = None

    def _make_strip(self, width: int) -> np.ndarray:
        from PIL import Image, ImageDraw

        image = Image.new("RGB", (width, CAPTION_PX), (0, 0, 0))
        ImageDraw.Draw(image).text((3, 1), self.text, fill=(255, 255, 255))
        return np.asarray(image, dtype=np.uint8)

    def append(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if self._strip is None or self._strip.shape[1] != frame.shape[1]:
            self._strip = self._make_strip(frame.shape[1])
        self.append_to(np.concatenate([frame, self._strip], axis=0))


def film_workers(env_id: str) -> int:
    """Processes that play the film's episodes: two for an env with image observations, whose episodes take
    seconds each; one (this process) otherwise, where starting a pool of interpreters that import torch would take
    longer than the episodes."""
    from flywheel.envs import env_spec

    return 2 if len(env_spec(env_id).obs_shape) > 1 else 1


def compare(checkpoint_dir: Path, env_id: str, protocol: Protocol, *, workers: int | None = None) -> dict[str, Any]:
    """Play the newest weights and the kept best (if any) on the same seeds; the choice and every record.
    ``workers``: processes per candidate (None: ``film_workers``)."""
    workers = film_workers(env_id) if workers is None else workers
    learner = checkpoint_dir / "learner"
    candidates = {"latest": learner / CHECKPOINT_FILE}
    if (learner / BEST_FILE).is_file():
        candidates["best"] = learner / BEST_FILE
    results: dict[str, Any] = {}
    labels: dict[str, str] = {}
    for which, path in candidates.items():
        played = play_protocol(env_id, str(path), protocol, workers=workers)
        [row], labels = played["rows"], played["measures"]
        results[which] = {"version": file_version(path), "records": row["records"],
                          "mean_return": float(row["return"]["mean"])}
    chosen = max(results, key=lambda w: (results[w]["mean_return"], w == "latest"))
    scores = ", ".join(f"{w} v{r['version']} {r['mean_return']:.2f}" for w, r in results.items())
    why = (f"mean return over {protocol.episodes} episodes at the end of the run, epsilon {protocol.epsilons[0]:g}"
           f" after 0-{protocol.noop_max} no-ops: {scores}" if len(results) > 1 else "the run kept no best weights")
    return {"which": chosen, "why": why, "results": results, "protocol": protocol, "measures": labels}


def write_preferred(learner: Path, comparison: dict[str, Any]) -> Path:
    """learner/preferred.json: which weights ``--which auto`` takes, why, and the versions compared."""
    results, protocol = comparison["results"], comparison["protocol"]
    document = {"which": comparison["which"], "why": comparison["why"], "written_at": time.time(),
                "versions": {w: r["version"] for w, r in results.items()},
                "mean_return": {w: r["mean_return"] for w, r in results.items()},
                "episodes": protocol.episodes, "seeds": protocol.seeds, "epsilon": protocol.epsilons[0],
                "noop_max": protocol.noop_max}
    path = learner / PREFERRED_FILE
    write_atomically(path, (json.dumps(document, indent=1) + "\n").encode())
    return path


def film(checkpoint_dir: Path, env_id: str, comparison: dict[str, Any], path: Path) -> dict[str, Any]:
    """Play the chosen weights' furthest episode again into ``path``, captioned; its record (as filmed)."""
    from flywheel.envs import action_count
    from flywheel.tools.play import load_policy
    from flywheel.video import VideoWriter, make_play_env

    which, protocol = comparison["which"], comparison["protocol"]
    chosen = comparison["results"][which]
    best = max(chosen["records"], key=_progress)
    policy = load_policy(checkpoint_dir, env_id, which)
    env, fps = make_play_env(env_id, True)
    unwrapped = env.unwrapped
    hooked = hasattr(unwrapped, "frame_hook")  # every frame the env draws, as flywheel play films it
    try:
        with VideoWriter(path, fps) as video:
            frames = CaptionedFrames(video.append, caption(chosen["version"], which, protocol, best,
                                                           comparison.get("measures")))
            if hooked:
                unwrapped.frame_hook = frames.append

            def render() -> None:
                frames.append(env.render())

            record = run_episode(env, policy, action_count(env.action_space), int(best["seed"]),
                                 epsilon=protocol.epsilons[0], noop_max=protocol.noop_max or 0,
                                 max_steps=FILM_MAX_STEPS,
                                 after_reset=render, after_step=None if hooked else render)
    finally:
        if hooked:
            unwrapped.frame_hook = None
        env.close()
    if (record["return"], record.get("progress")) != (best["return"], best.get("progress")):
        print(f"warning: the filmed episode (seed {best['seed']}) did not repeat its evaluation: return "
              f"{record['return']:.2f} against {best['return']:.2f}", file=sys.stderr, flush=True)
    return {**record, "frames": video.frames, "caption": frames.text}


def film_run(checkpoint_dir: Path, env_id: str) -> None:
    """End of ``flywheel run``: compare, write preferred.json and film; a failure is a warning, never the run's."""
    if not (checkpoint_dir / "learner" / CHECKPOINT_FILE).is_file():
        return
    protocol = run_protocol(checkpoint_dir)
    path = checkpoint_dir / "video.mp4"
    print(f"flywheel: playing the newest weights and the kept best, {protocol.describe(protocol.noop_max or 0)}, "
          f"to film the furthest into {path} (--no-video skips)", flush=True)
    try:
        comparison = compare(checkpoint_dir, env_id, protocol)
        write_preferred(checkpoint_dir / "learner", comparison)
        filmed = film(checkpoint_dir, env_id, comparison, path)
    except Exception as exc:  # a film is a bonus: the run's checkpoints are what matters
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"warning: no end-of-run video: {first}", file=sys.stderr, flush=True)
        return
    print(f"flywheel: {comparison['which']} weights chosen ({comparison['why']}); flywheel play takes them by "
          "default", flush=True)
    print(f"flywheel: filmed {filmed['caption']} ({filmed['length']} steps); video {path} ({filmed['frames']} "
          "frames)", flush=True)
