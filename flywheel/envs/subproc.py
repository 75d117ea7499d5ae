"""Env slots stepped in worker processes over shared memory, double-buffered as in Sample Factory.

The vector is split into two groups (halves). Every worker owns a contiguous run of slots in each
group, so while the workers step group A the caller computes actions for group B, and no core
idles. Observations, rewards, flags and actions live in one shared-memory file mapped by every
process; the pipes carry only a short command (a step's may carry the start-state curriculum's death points
as JSON) and a short JSON reply (the episodes that ended), never an observation and never a pickle. A worker
that dies or raises is reported as :class:`EnvWorkerError` naming the worker, its slots and the cause, never as
a hang.
"""

from __future__ import annotations

import json
import math
import mmap
import multiprocessing as mp
import os
import signal
import tempfile
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from flywheel.envs.vector import EpisodeEnd, PoolReport, VectorEnv, VectorStep
from flywheel.processes import die_with_parent, stop_children

_FIELDS = ("obs", "final_obs", "reward", "terminated", "truncated", "action")


class EnvWorkerError(RuntimeError):
    """An env worker process died, raised, or stopped answering."""


def _layout(num_envs: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> dict[str, tuple[int, str, tuple]]:
    """Byte offset, dtype and shape of every shared array (64-byte aligned)."""
    specs = {
        "obs": (obs_dtype.str, (num_envs, *obs_shape)),
        "final_obs": (obs_dtype.str, (num_envs, *obs_shape)),
        "reward": ("<f4", (num_envs,)),
        "terminated": ("|b1", (num_envs,)),
        "truncated": ("|b1", (num_envs,)),
        "action": ("<i8", (num_envs,)),
    }
    layout, offset = {}, 0
    for name in _FIELDS:
        dtype, shape = specs[name]
        layout[name] = (offset, dtype, shape)
        offset += -(-np.dtype(dtype).itemsize * math.prod(shape) // 64) * 64
    layout["_size"] = (offset, "", ())
    return layout


def _views(buf: mmap.mmap, layout: dict[str, tuple[int, str, tuple]]) -> dict[str, np.ndarray]:
    return {name: np.ndarray(shape, dtype=np.dtype(dtype), buffer=buf, offset=offset)
            for name, (offset, dtype, shape) in layout.items() if name != "_size"}


def _worker_main(index: int, env_id: str, options_json: str, path: str, layout_json: str,
                 ranges: list[list[int]], seed: int | None, conn: Connection,
                 make_vector_env: Callable[..., VectorEnv]) -> None:
    """Build this worker's sub-vectors (one per group) with ``make_vector_env`` (the registry's, passed by
    reference: this module does not import the registry, which imports it), then serve step commands."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop

    vectors: list[VectorEnv | None] = []
    try:
        layout = {k: (v[0], v[1], tuple(v[2])) for k, v in json.loads(layout_json).items()}
        with open(path, "r+b") as fh:
            buf = mmap.mmap(fh.fileno(), layout["_size"][0])
        arrays = _views(buf, layout)
        options = json.loads(options_json)
        for start, stop in ranges:
            vectors.append(None if stop <= start else make_vector_env(
                env_id, stop - start, seed=None if seed is None else seed + start, mode="inprocess",
                slot_offset=start, **options))
        conn.send_bytes(b'{"ready": true}')
        while True:
            try:
                command = conn.recv_bytes()
            except EOFError:
                break
            if command == b"q":
                break
            if command == b"r":
                for (start, stop), vec in zip(ranges, vectors, strict=True):
                    if vec is not None:
                        arrays["obs"][start:stop] = vec.reset()
                conn.send_bytes(b"[]")
                continue
            if command[:1] in (b"p", b"l"):  # save or load the start-state pools: {"directory": ..., "key": ...}
                where = json.loads(command[1:])
                report = PoolReport()
                for vec in vectors:
                    if vec is not None:
                        report += (vec.save_start_states if command[:1] == b"p" else vec.load_start_states)(
                            where["directory"], where["key"])
                conn.send_bytes(json.dumps(report.to_json()).encode())
                continue
            group = command[1]
            start, stop = ranges[group]
            vec = vectors[group]
            assert vec is not None
            if len(command) > 2:  # death points for the start-state curriculum ride on a step: a JSON list
                vec.set_start_targets(json.loads(command[2:]))
            result = vec.step(arrays["action"][start:stop])
            arrays["obs"][start:stop] = result.obs
            arrays["final_obs"][start:stop] = result.final_obs
            arrays["reward"][start:stop] = result.reward
            arrays["terminated"][start:stop] = result.terminated
            arrays["truncated"][start:stop] = result.truncated
            conn.send_bytes(json.dumps([e.to_json() for e in result.episodes]).encode())
    except BaseException as exc:  # report anything, then exit non-zero
        message = f"{type(exc).__name__}: {exc}"
        tail = traceback.format_exc().strip().splitlines()[-3:]
        try:
            conn.send_bytes(json.dumps({"error": message, "where": " | ".join(tail)}).encode())
        except OSError:
            pass
        os._exit(1)
    finally:
        for vec in vectors:
            if vec is not None:
                vec.close()


def _split(count: int, parts: int, atom: int) -> list[int]:
    """Split ``count`` slots (a multiple of ``atom``) into ``parts`` sizes, each a multiple of ``atom``."""
    units = count // atom
    base, extra = divmod(units, parts)
    return [(base + (1 if i < extra else 0)) * atom for i in range(parts)]


class SubprocessVector(VectorEnv):
    """``num_envs`` slots of ``env_id`` in ``workers`` processes; slot ``i`` is seeded with ``seed + i``.

    ``groups`` is 2 for double buffering (default) or 1. ``atom`` is the smallest unit of slots a
    worker may own (the agents of one MettaGrid simulation). ``step_timeout_s`` bounds how long a
    step may take before the worker is declared stuck. ``make_vector_env`` builds each worker's in-process
    sub-vectors: ``flywheel.envs.make_vector_env``, given by the registry (a module-level function, so the spawned
    workers import it by name).
    """

    reuses_buffers = True  # views of the shared memory, rewritten by the group's next step

    def __init__(self, env_id: str, num_envs: int, *, obs_shape: tuple[int, ...], obs_dtype: np.dtype | str,
                 n_actions: int, seed: int | None = None, workers: int = 2, groups: int = 2, atom: int = 1,
                 step_timeout_s: float = 120.0, options: dict[str, Any] | None = None,
                 make_vector_env: Callable[..., VectorEnv]) -> None:
        """Start the workers and wait until each has built its envs."""
        if num_envs < 1 or num_envs % atom:
            raise ValueError(f"num_envs {num_envs} must be a positive multiple of {atom}")
        units = num_envs // atom
        groups = max(1, min(groups, units))
        workers = max(1, min(workers, units // groups))
        self.env_id, self.num_envs, self.n_actions = env_id, num_envs, n_actions
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype)
        self.step_timeout_s = step_timeout_s
        group_sizes = _split(num_envs, groups, atom)
        self._groups: list[range] = []
        start = 0
        for size in group_sizes:
            self._groups.append(range(start, start + size))
            start += size
        # ranges[w][g]: worker w's slots within group g
        self._ranges: list[list[list[int]]] = [[] for _ in range(workers)]
        for grp in self._groups:
            begin = grp.start
            for w, size in enumerate(_split(len(grp), workers, atom)):
                self._ranges[w].append([begin, begin + size])
                begin += size
        layout = _layout(num_envs, self.obs_shape, self.obs_dtype)
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="flywheel-vec-", dir=directory)
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._in_flight: set[int] = set()  # groups stepped and not yet waited for
        self._targets = b""  # the start-state curriculum's death points, as JSON (set_start_targets)
        self._targets_due: set[tuple[int, int]] = set()  # (worker, group) whose next step carries them
        self._closed = False
        try:
            os.ftruncate(fd, layout["_size"][0])
            self._buf = mmap.mmap(fd, layout["_size"][0])
            self._arrays = _views(self._buf, layout)
            ctx = mp.get_context("spawn")
            layout_json = json.dumps(layout)
            options_json = json.dumps(options or {})
            for w in range(workers):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, name=f"flywheel-env-{w}", daemon=True,
                                   args=(w, env_id, options_json, path, layout_json, self._ranges[w], seed, child,
                                         make_vector_env))
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
            for w in range(workers):
                self._reply(w, timeout_s=max(step_timeout_s, 300.0))
        except BaseException:
            self.close()
            raise
        finally:
            os.close(fd)
            os.unlink(path)  # every process has it mapped: nothing is left behind, whatever happens next

    @property
    def groups(self) -> list[range]:
        """The two halves (or one whole) of the vector."""
        return list(self._groups)

    @property
    def workers(self) -> int:
        """Number of worker processes."""
        return len(self._procs)

    def _describe(self, w: int) -> str:
        slots = ", ".join(f"{a}-{b - 1}" for a, b in self._ranges[w] if b > a)
        return f"env worker {w} (pid {self._procs[w].pid}, {self.env_id} slots {slots})"

    def _reply(self, w: int, timeout_s: float | None = None) -> Any:
        conn, proc = self._conns[w], self._procs[w]
        ready = wait([conn, proc.sentinel], timeout_s if timeout_s is not None else self.step_timeout_s)
        if not ready:
            raise EnvWorkerError(f"{self._describe(w)} did not answer within {self.step_timeout_s:.0f} s")
        try:
            data = json.loads(conn.recv_bytes()) if conn in ready or conn.poll() else None
        except (EOFError, OSError):
            data = None
        if data is None:
            proc.join(1.0)
            raise EnvWorkerError(f"{self._describe(w)} died (exit code {proc.exitcode})")
        if isinstance(data, dict) and "error" in data:
            proc.join(1.0)
            raise EnvWorkerError(f"{self._describe(w)} failed: {data['error']} [{data.get('where', '')}]")
        return data

    def _workers_in(self, group: int) -> list[int]:
        return [w for w in range(len(self._procs)) if self._ranges[w][group][1] > self._ranges[w][group][0]]

    def _send(self, w: int, command: bytes) -> None:
        try:
            self._conns[w].send_bytes(command)
        except OSError as exc:
            self._procs[w].join(1.0)
            raise EnvWorkerError(f"{self._describe(w)} is gone (exit code {self._procs[w].exitcode})") from exc

    def reset(self) -> np.ndarray:
        """Reset every slot with its seed."""
        for w in range(len(self._procs)):
            self._send(w, b"r")
        for w in range(len(self._procs)):
            self._reply(w)
        return self._arrays["obs"].copy()

    def step_async(self, group: int, actions: np.ndarray) -> None:
        """Write the group's actions to shared memory and tell its workers to step."""
        grp = self._groups[group]
        actions = np.asarray(actions)
        if actions.shape != (len(grp),):
            raise ValueError(f"group {group} has {len(grp)} slots, got actions of shape {actions.shape}")
        self._arrays["action"][grp.start:grp.stop] = actions
        for w in self._workers_in(group):
            targets = self._targets if (w, group) in self._targets_due else b""
            self._targets_due.discard((w, group))
            self._send(w, b"s" + bytes([group]) + targets)
        self._in_flight.add(group)

    def set_start_targets(self, targets: list[float]) -> None:
        """Send ``targets`` with each worker's next step of each of its groups (no step is held up for them)."""
        self._targets = json.dumps([float(t) for t in targets]).encode()
        self._targets_due = {(w, g) for w in range(len(self._procs)) for g in range(len(self._groups))
                             if self._ranges[w][g][1] > self._ranges[w][g][0]}

    def step_wait(self, group: int) -> VectorStep:
        """Wait for the group's workers; the arrays returned are views valid until the group's next step."""
        episodes: list[EpisodeEnd] = []
        self._in_flight.discard(group)
        for w in self._workers_in(group):
            episodes += [EpisodeEnd.from_json(e) for e in self._reply(w)]
        grp = slice(self._groups[group].start, self._groups[group].stop)
        a = self._arrays
        return VectorStep(a["obs"][grp], a["reward"][grp], a["terminated"][grp], a["truncated"][grp],
                          a["final_obs"][grp], episodes)

    def _pools(self, command: bytes, directory: str, key: str) -> PoolReport:
        if self._in_flight:
            raise RuntimeError(f"start-state pools are saved and loaded between steps, not with group(s) "
                               f"{sorted(self._in_flight)} in flight")
        where = json.dumps({"directory": directory, "key": key}).encode()
        for w in range(len(self._procs)):
            self._send(w, command + where)
        report = PoolReport()
        for w in range(len(self._procs)):
            report += PoolReport.from_json(self._reply(w, timeout_s=max(self.step_timeout_s, 300.0)))
        return report

    def save_start_states(self, directory: str, key: str) -> PoolReport:
        """Each worker writes the pools of its slots."""
        return self._pools(b"p", directory, key)

    def load_start_states(self, directory: str, key: str) -> PoolReport:
        """Each worker reads the pools of its slots (Mario: replaying each state's frames, a few seconds at most)."""
        return self._pools(b"l", directory, key)

    def close(self) -> None:
        """Tell workers to quit, wait briefly, then terminate stragglers; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        stop_children(self._conns, self._procs, b"q")
        for conn in self._conns:
            conn.close()
        if hasattr(self, "_arrays"):
            self._arrays = {}
            try:
                self._buf.close()
            except BufferError:  # a caller still holds a view; the mapping goes when it does
                pass

    def __del__(self) -> None:
        """Do not leave workers behind if the owner forgot to close."""
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
