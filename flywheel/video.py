"""Watching a policy play: the env to watch, episodes played into a video, and the mp4/gif writer.

A library module: ``flywheel play`` (flywheel/tools/play.py), the end-of-run film (flywheel/tools/film.py) and the
actors' clips for the live page (services/actor/clips.py) all use it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # flywheel.envs is imported when an env is built: flywheel --help stays quick
    from flywheel.envs.measures import Measures

VIDEO_SUFFIXES = (".mp4", ".gif")
GIF_MAX_FPS = 50.0  # GIF delays are whole centiseconds and players slow down anything under 20 ms
ATARI_FPS = 60.0  # the console's frame rate; AtariEnv shows every frame_skip-th of them
DEFAULT_FPS = 30.0  # for an env whose metadata names no render_fps


class PlayError(Exception):
    """A checkpoint, env or video path that cannot be played; the message is one line."""


def number(value: float) -> str:
    """A measure's value for people: whole numbers without decimals (1,820), others with two (0.25)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


@dataclass
class Episode:
    """What one episode did: its return and length and, where the env has them (flywheel.envs.measures), its
    furthest progress and whether it reached the goal."""

    index: int
    ret: float
    length: int
    frames: int = 0  # video frames written for this episode (its reset frame included)
    progress: float | None = None
    success: bool | None = None
    cut: bool = False  # stopped at max_steps before the episode ended
    measures: Measures | None = None  # the env's labels

    def line(self) -> str:
        text = f"episode {self.index}: return {self.ret:.2f}, length {self.length}"
        labels = self.measures.labels() if self.measures is not None else {}
        if self.progress is not None:
            text += f", {labels.get('progress', 'progress')} {number(self.progress)}"
        if self.success is not None:
            text += f", {labels.get('success', 'success')} {'yes' if self.success else 'no'}"
        return text + (" (cut at the step limit)" if self.cut else "")

    def seen(self, info: dict[str, Any]) -> None:
        """Take one step's (or the reset's) info: the furthest progress, and success once reached."""
        from flywheel.envs.measures import measures_so_far

        self.progress, self.success = measures_so_far(info, self.progress, self.success)


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
    if video and family not in ("atari", "snake"):  # Atari draws without asking; Snake draws text only
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
    else:
        fps = float(unwrapped.metadata.get("render_fps") or env.metadata.get("render_fps") or DEFAULT_FPS)
    return env, fps


def play_episodes(policy: Any, env: Any, episodes: int, *, epsilon: float = 0.0, seed: int | None = None,
                  video: VideoWriter | None = None, max_steps: int | None = None,
                  report: Any = None) -> list[Episode]:
    """Play ``episodes`` episodes with ``policy.predict``; frames go to ``video``.

    Each episode's video starts with its reset frame, then one frame per agent step or, for an env with a
    ``frame_hook`` (it calls it with every frame it draws, skipped ones included), every frame at the game's real
    frame rate. ``report`` gets each finished Episode.
    """
    from flywheel.envs.measures import measures_of

    rng = np.random.default_rng(seed)
    unwrapped = env.unwrapped
    measures = measures_of(env)
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
            episode = Episode(index, 0.0, 0, measures=measures)
            episode.seen(info)
            done = False
            while not done:
                if max_steps is not None and episode.length >= max_steps:
                    episode.cut = True
                    break
                action = int(policy.predict(np.asarray(obs)[None], epsilon=epsilon, rng=rng)[0])
                obs, reward, terminated, truncated, info = env.step(action)
                episode.ret += float(reward)
                episode.length += 1
                episode.seen(info)
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
