"""Time until a ``flywheel run`` on CartPole reaches a greedy target, evaluated from its published weights."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flywheel.bench.runner import BenchContext
from flywheel.testing.run import FlywheelRun, greedy_returns
from flywheel.testing.weights import WeightsWatcher

EVAL_SEED = 10_000  # evaluation k uses seeds EVAL_SEED + 100 k + i (sb3 uses the same for its side)


def flywheel_time_to_target(ctx: BenchContext, env_id: str, seed: int, cap_s: float, opts: dict[str, Any],
                            workdir: Path, *, label: str = "flywheel", sets: Sequence[str] = ()) -> dict[str, Any]:
    """Start ``flywheel run`` and evaluate its newest weights greedily every ``eval_interval_s`` seconds until the
    mean of ``eval_episodes`` returns reaches ``target`` or ``cap_s`` passes.

    ``opts``: actors, eval_interval_s, eval_episodes, target, sets (``--set`` items, ``sets`` adds more). Returns
    ``{"side": label, "seed", "reached": {"s", "steps", "cpu_s"} | None, "first_step_s", "first_weights_s",
    "curve": [(s, env steps, mean return)]}``, times from process start. ``cpu_s`` is the user + system CPU of
    ``flywheel run`` and every service until the passing evaluation began (the evaluator, this process, excluded).
    """
    import gymnasium

    from flywheel.envs import action_count

    probe = gymnasium.make(env_id)
    obs_shape, n_actions = tuple(probe.observation_space.shape or ()), action_count(probe.action_space)
    probe.close()
    run = FlywheelRun(env_id, workdir / f"{label}-seed{seed}", actors=int(opts["actors"]),
                      sets=[*opts.get("sets", ()), *sets])
    curve: list[tuple[float, float, float]] = []
    out: dict[str, Any] = {"side": label, "seed": seed, "reached": None, "first_step_s": None,
                           "first_weights_s": None}
    interval, evals = float(opts["eval_interval_s"]), 0
    with run:
        watcher = WeightsWatcher(run.weights_endpoint, obs_shape, n_actions)
        try:
            next_eval = run.started + interval
            while time.monotonic() - run.started < cap_s:
                run.check_alive()
                watcher.poll(max(0, int(1000 * (next_eval - time.monotonic()))))
                now = time.monotonic()
                if out["first_weights_s"] is None and watcher.version > 0:
                    out["first_weights_s"] = now - run.started
                if now < next_eval:
                    continue
                next_eval = now + interval
                snap = run.snapshot()
                steps = snap.total("actor", "env_steps_total") if snap else 0.0
                if out["first_step_s"] is None and steps > 0:
                    out["first_step_s"] = now - run.started
                if watcher.version == 0:
                    continue
                returns = greedy_returns(watcher.q_values, env_id, int(opts["eval_episodes"]), EVAL_SEED + 100 * evals)
                evals += 1
                curve.append((now - run.started, steps, float(returns.mean())))
                ctx.progress(f"{label} seed {seed}: {curve[-1][0]:6.1f} s, {steps:,.0f} steps, weights "
                             f"v{watcher.version}, greedy {returns.mean():.1f}")
                if returns.mean() >= float(opts["target"]):
                    cpu = sum(snap.cpu.values()) + run.launcher_cpu_seconds() if snap else None
                    out["reached"] = {"s": curve[-1][0], "steps": steps, "cpu_s": cpu}
                    break
        finally:
            watcher.close()
    out["curve"] = curve
    return out
