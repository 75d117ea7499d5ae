"""``flywheel play``: a learner checkpoint plays a few episodes, optionally filmed as an mp4 or a gif."""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

CHECKPOINT_FILE = "learner.safetensors"
VIDEO_SUFFIXES = (".mp4", ".gif")
GIF_MAX_FPS = 50.0  # GIF delays are whole centiseconds and players slow down anything under 20 ms
ATARI_FPS = 60.0  # the console's frame rate; AtariEnv shows every frame_skip-th of them
DEFAULT_FPS = 30.0  # for an env whose metadata names no render_fps


class PlayError(Exception):
    """A checkpoint, env or video path that cannot be played; the message is one line."""


@dataclass
class Episode:
    """What one episode did: its return and length, Mario's furthest x and whether it got the flag."""

    index: int
    ret: float
    length: int
    frames: int = 0  # video frames written for this episode (its reset frame included)
    x_pos_max: int | None = None
    flag: bool | None = None
    cut: bool = False  # stopped at max_steps before the episode ended

    def line(self) -> str:
        text = f"episode {self.index}: return {self.ret:.2f}, length {self.length}"
        if self.x_pos_max is not None:
            text += f", max x_pos {self.x_pos_max}, flag {'yes' if self.flag else 'no'}"
        return text + (" (cut at the step limit)" if self.cut else "")


class VideoWriter:
    """RGB frames to an H.264 yuv420p mp4 (imageio-ffmpeg's ffmpeg) or an animated gif (Pillow), at ``fps``.

    A gif shows at most GIF_MAX_FPS: faster sources keep every k-th frame, and the delays (whole centiseconds)
    alternate so the clip still plays at real speed (Pillow stores a frame equal to the one before as a longer delay
    of that one). Odd mp4 sizes are padded by one edge row or column.
    """

    def __init__(self, path: str | Path, fps: float) -> None:
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in VIDEO_SUFFIXES:
            raise PlayError(f"cannot write video {str(self.path)!r}: use a file name ending in .mp4 or .gif")
        if not (math.isfinite(fps) and fps > 0):
            raise PlayError(f"video frame rate must be > 0, got {fps!r}")
        self.kind = suffix[1:]
        self.source_fps = float(fps)
        self.keep_every = max(1, math.ceil(fps / GIF_MAX_FPS - 1e-9)) if self.kind == "gif" else 1
        self.fps = self.source_fps / self.keep_every
        self.frames = 0  # frames written to the file
        self._seen = 0
        self._size: tuple[int, int] | None = None  # (height, width) of the first frame
        self._ffmpeg: Any = None
        self._gif: list[Any] = []
        if not self.path.parent.is_dir():
            raise PlayError(f"cannot write video {str(self.path)!r}: folder {str(self.path.parent)!r} does not exist")
        try:
            import imageio_ffmpeg  # noqa: F401
            import PIL  # noqa: F401
        except ImportError as exc:
            from flywheel.extras import MissingExtra

            raise PlayError(str(MissingExtra("video", "writing a video", exc))) from None

    def append(self, frame: np.ndarray) -> None:
        """Add one (H, W, 3) uint8 RGB frame; every frame must have the first one's size."""
        self._seen += 1
        if (self._seen - 1) % self.keep_every:
            return
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise PlayError(f"video frames must be RGB (H, W, 3); the env rendered {frame.shape}")
        if self._size is None:
            self._size = (frame.shape[0], frame.shape[1])
            if self.kind == "mp4":
                self._open_mp4()
        elif frame.shape[:2] != self._size:
            raise PlayError(f"video frame size changed from {self._size} to {frame.shape[:2]}")
        if self.kind == "mp4":
            height, width = self._size
            if height % 2 or width % 2:  # yuv420p needs even sizes
                frame = np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")
            self._ffmpeg.send(np.ascontiguousarray(frame, dtype=np.uint8))
        else:
            from PIL import Image

            self._gif.append(Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)).quantize(256))
        self.frames += 1

    def _open_mp4(self) -> None:
        import imageio_ffmpeg

        assert self._size is not None
        height, width = self._size
        self._ffmpeg = imageio_ffmpeg.write_frames(
            str(self.path), (width + width % 2, height + height % 2), fps=self.source_fps, codec="libx264",
            pix_fmt_in="rgb24", pix_fmt_out="yuv420p", macro_block_size=1, quality=None,
            ffmpeg_log_level="error", output_params=["-crf", "20", "-preset", "veryfast"])
        self._ffmpeg.send(None)  # start the generator (and ffmpeg)

    def gif_delays_ms(self, count: int) -> list[int]:
        """Whole-centisecond delays whose running sum tracks ``count`` frames at ``self.fps``."""
        edges = [round(i * 100 / self.fps) * 10 for i in range(count + 1)]
        return [max(10, b - a) for a, b in zip(edges, edges[1:], strict=False)]

    def close(self) -> None:
        """Finish the file; a writer that got no frame writes nothing."""
        if self._ffmpeg is not None:
            self._ffmpeg.close()
            self._ffmpeg = None
        if self._gif:
            first, *rest = self._gif
            first.save(self.path, save_all=True, append_images=rest, duration=self.gif_delays_ms(len(self._gif)),
                       loop=0, disposal=1)
            self._gif = []

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def make_play_env(env_id: str, video: bool) -> tuple[Any, float]:
    """The env to watch (Atari: whole games scored unclipped) and the frame rate of the frames it shows."""
    from flywheel.envs import env_family, evaluation_env_id, make_env, split_env_id
    from flywheel.envs.atari import AtariEnv

    base = split_env_id(env_id)[0]
    family = env_family(base)
    if family == "mettagrid":
        raise PlayError(f"{base} is multi-agent; flywheel play watches single-agent envs")
    options = split_env_id(evaluation_env_id(env_id))[1]  # Atari: a whole game with its real score
    if video and family in ("mario", "gymnasium"):
        options["render_mode"] = "rgb_array"
    if video and family == "gymnasium":  # pygame draws off-screen: no display, no banner, no XDG_RUNTIME_DIR error
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    from flywheel.extras import MissingExtra

    try:
        if video and family == "gymnasium":
            import pygame  # noqa: F401  # Gymnasium's classic-control renderer
        env = make_env(base, **options)
    except (TypeError, ValueError) as exc:
        raise PlayError(f"cannot build {env_id!r}: {exc}") from None
    except MissingExtra as exc:
        raise PlayError(str(exc)) from None
    except ImportError as exc:
        raise PlayError(str(MissingExtra("video", f"rendering {base}", exc))) from None
    unwrapped = env.unwrapped
    if isinstance(unwrapped, AtariEnv):
        fps = ATARI_FPS / unwrapped.config.frame_skip
    elif family == "mario":
        fps = float(unwrapped.metadata.get("render_fps", 60))
    else:
        fps = float(env.metadata.get("render_fps") or DEFAULT_FPS)
    return env, fps


def play_episodes(policy: Any, env: Any, episodes: int, *, epsilon: float = 0.0, seed: int | None = None,
                  video: VideoWriter | None = None, max_steps: int | None = None,
                  report: Any = None) -> list[Episode]:
    """Play ``episodes`` episodes with ``policy.predict``; frames go to ``video`` (every emulator frame for Mario).

    Each episode's video starts with its reset frame, then one frame per agent step, or for Mario one per
    emulator frame (``frame_skip`` per agent step). ``report`` gets each finished Episode.
    """
    rng = np.random.default_rng(seed)
    unwrapped = env.unwrapped
    hooked = video is not None and hasattr(unwrapped, "frame_hook")
    if video is not None and hooked:
        unwrapped.frame_hook = video.append
    results: list[Episode] = []
    try:
        for index in range(1, episodes + 1):
            obs, info = env.reset(seed=seed if index == 1 else None)
            before = video.frames if video is not None else 0
            if video is not None:
                _append_render(env, video)
            episode = Episode(index, 0.0, 0)
            _mario_progress(episode, info)
            done = False
            while not done:
                if max_steps is not None and episode.length >= max_steps:
                    episode.cut = True
                    break
                action = int(policy.predict(np.asarray(obs)[None], epsilon=epsilon, rng=rng)[0])
                obs, reward, terminated, truncated, info = env.step(action)
                episode.ret += float(reward)
                episode.length += 1
                _mario_progress(episode, info)
                if video is not None and not hooked:
                    _append_render(env, video)
                done = bool(terminated or truncated)
            episode.frames = (video.frames - before) if video is not None else 0
            results.append(episode)
            if report is not None:
                report(episode)
    finally:
        if hooked:
            unwrapped.frame_hook = None
    return results


def _append_render(env: Any, video: VideoWriter) -> None:
    frame = env.render()
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise PlayError(f"{getattr(env.unwrapped, 'env_id', env)} renders no RGB frames; play it without --video")
    video.append(frame)


def _mario_progress(episode: Episode, info: dict[str, Any]) -> None:
    if "x_pos" in info:
        x = int(info["x_pos"])
        episode.x_pos_max = x if episode.x_pos_max is None else max(episode.x_pos_max, x)
        episode.flag = bool(episode.flag) or bool(info.get("flag_get", False))


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
