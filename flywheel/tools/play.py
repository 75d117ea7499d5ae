"""``flywheel play``: a learner checkpoint plays a few episodes, optionally filmed as an mp4 or a gif."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from flywheel.video import Episode, PlayError, VideoWriter, make_play_env, play_episodes


def load_policy(directory: str | Path, env_id: str | None, which: str = "auto") -> Any:
    """The checkpoint's Policy for ``env_id`` (default: the checkpoint's or run.json's), fitting that env;
    ``which``: best, latest or auto (best when the learner kept one, else latest)."""
    from flywheel.envs import env_spec
    from flywheel.policy import Policy

    try:
        policy = Policy.load(directory, env_id=env_id, device="cpu", which=which)
        spec = env_spec(policy.env_id)
    except Exception as exc:  # the policy's own one-line errors: missing, damaged or foreign checkpoints
        text = str(exc).strip()
        first = text.splitlines()[0].replace("pass env_id", "pass --env ENV_ID") if text else type(exc).__name__
        raise PlayError(first) from None
    if (tuple(spec.obs_shape), spec.n_actions) != (tuple(policy.obs_shape), policy.n_actions):
        raise PlayError(f"the checkpoint in {str(directory)!r} is for observations {tuple(policy.obs_shape)} and "
                        f"{policy.n_actions} actions, but {policy.env_id} has {tuple(spec.obs_shape)} and "
                        f"{spec.n_actions}: pass the env it was trained on (--env)")
    return policy


def why(directory: str | Path, which: str, path: Path | None) -> str:
    """Why ``--which auto`` took the file it took, as a clause for the announcement ("" for an explicit choice)."""
    from flywheel.policy import BEST_FILE, preferred

    if which != "auto" or path is None:
        return ""
    choice = preferred(directory)
    if choice is not None:
        kind = "newest" if choice[0] == "latest" else "kept best"
        return f": the {kind} weights, which evaluated better ({choice[1]})"
    if path.name == BEST_FILE:
        return ": the learner's kept best (not compared with the newest weights at the end of the run; --which " \
               "latest takes those)"
    return ": the newest weights (the run kept no best)"


def play(directory: str | Path, *, env_id: str | None = None, episodes: int = 3, epsilon: float = 0.0,
         seed: int | None = None, video_path: str | Path | None = None, max_steps: int | None = None,
         report: Any = None, which: str = "auto", announce: Any = None) -> list[Episode]:
    """Load the checkpoint in ``directory`` and play; the library form of ``flywheel play``."""
    if video_path is not None:
        VideoWriter(video_path, 1.0)  # a bad suffix or folder fails before any loading
    policy = load_policy(directory, env_id, which)
    if announce is not None:  # which file (best or latest), and why
        announce(f"playing {policy.path} (weight version {policy.weight_version}, update {policy.updates})"
                 f"{why(directory, which, policy.path)}")
    env, fps = make_play_env(policy.env_id, video_path is not None)
    try:
        if video_path is None:
            return play_episodes(policy, env, episodes, epsilon=epsilon, seed=seed, max_steps=max_steps,
                                 report=report)
        with VideoWriter(video_path, fps) as video:
            return play_episodes(policy, env, episodes, epsilon=epsilon, seed=seed, video=video,
                                 max_steps=max_steps, report=report)
    finally:
        env.close()


def add_play_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", type=Path, metavar="CHECKPOINT_DIR",
                        help="a flywheel run --checkpoint-dir (or its learner/ folder)")
    parser.add_argument("--episodes", type=int, default=3, help="episodes to play (default 3)")
    parser.add_argument("--which", choices=("auto", "best", "latest"), default="auto",
                        help="best: the weights that did best in the learner's evaluations; latest: the "
                             "newest; auto (default): best when the run kept one, else latest")
    parser.add_argument("--epsilon", type=float, default=0.0, help="random-action probability (default 0: greedy)")
    parser.add_argument("--seed", type=int, default=None, help="seeds the first reset and the random actions")
    parser.add_argument("--env", default=None, help="environment id (default: the one in CHECKPOINT_DIR/run.json)")
    parser.add_argument("--max-steps", type=int, default=None, help="cut each episode after this many agent steps")
    parser.add_argument("--video", type=Path, default=None, metavar="FILE",
                        help="write what a person would see, at the game's real speed, to FILE.mp4 or FILE.gif")


def run_play(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        print(f"error: flywheel play: --episodes must be at least 1, got {args.episodes}", file=sys.stderr)
        return 2
    if not 0.0 <= args.epsilon <= 1.0:
        print(f"error: flywheel play: --epsilon must be in [0, 1], got {args.epsilon}", file=sys.stderr)
        return 2
    if args.max_steps is not None and args.max_steps < 1:
        print(f"error: flywheel play: --max-steps must be at least 1, got {args.max_steps}", file=sys.stderr)
        return 2
    from flywheel.envs import UnknownEnvironmentError

    try:
        results = play(args.checkpoint_dir, env_id=args.env, episodes=args.episodes, epsilon=args.epsilon,
                       seed=args.seed, video_path=args.video, max_steps=args.max_steps,
                       which=args.which, report=lambda e: print(e.line(), flush=True),
                       announce=lambda line: print(line, flush=True))
    except (PlayError, UnknownEnvironmentError) as exc:
        print(f"error: flywheel play: {exc}", file=sys.stderr)
        return 2
    returns = [e.ret for e in results]
    summary = f"mean return {sum(returns) / len(returns):.2f} over {len(results)} episodes"
    if args.video is not None:
        summary += f"; video {args.video} ({sum(e.frames for e in results)} frames)"
    print(summary, flush=True)
    return 0
