"""The learner's evaluation child: a spawned, low-priority process that plays policy files one evaluation at a time."""

from __future__ import annotations

import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from typing import Any

import torch

from flywheel.processes import die_with_parent


def _evaluator_main(conn: Connection) -> None:
    """The child process: below the actors in CPU priority, one torch thread, gone with the learner, and deaf to
    the terminal's Ctrl-C (the learner stops it); it plays the evaluations it is sent, one at a time."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(10)
    torch.set_num_threads(1)
    import flywheel.evaluation  # noqa: F401  (imported while the first interval runs, not when the first round is due)

    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the learner closed its end
            return
        try:
            conn.send(("ok", _evaluate(*task)))
        except Exception as exc:  # the env or the policy failed: said to the learner, the child goes on
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class EvaluatorChild:
    """One spawned child that plays evaluations over a pipe of its own. Stopping it kills it: no lock is shared
    with it (multiprocessing.Pool's terminate could hang for good on its task queue's lock)."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_end = ctx.Pipe()
        self.process = ctx.Process(target=_evaluator_main, args=(child_end,), name="flywheel-evaluator", daemon=True)
        self.process.start()
        child_end.close()

    def submit(self, task: tuple[Any, ...]) -> None:
        """Send one evaluation's arguments (``_evaluate``'s)."""
        self.conn.send(task)

    def ready(self) -> bool:
        """A result is waiting (or the child is gone, which ``result`` then says)."""
        return self.conn.poll(0)

    def result(self) -> list[dict[str, Any]]:
        """The records of the evaluation sent last; RuntimeError when it failed or the child died."""
        try:
            status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"the evaluation process ended (exit code {self.process.exitcode})") from exc
        if status != "ok":
            raise RuntimeError(str(value))
        return list(value)

    def stop(self) -> None:
        """Kill the child (an evaluation in progress is dropped) and close the pipe."""
        self.process.kill()
        self.process.join(10)
        self.conn.close()


def _evaluate(env_id: str, candidate: str, seeds: list[int], max_steps: int | None, epsilon: float,
              noop_max: int) -> list[dict[str, Any]]:
    """One evaluation's records: ``candidate`` (a policy file) played on ``seeds`` by flywheel/evaluation.py."""
    from flywheel.evaluation import STALL_STEPS, evaluate

    # the stall rule (an episode ends after 250 agent steps with no new progress) keeps each round short while the
    # actors have the cores; it can only cut an episode that stopped getting anywhere
    return evaluate(env_id, seeds, checkpoint=candidate, epsilon=epsilon, workers=1, max_steps=max_steps,
                    noop_max=noop_max, stall_steps=STALL_STEPS)
