"""What ``flywheel run`` watches while it runs: the gateway's /status, the progress line printed from it, and the
stop rules (--target-return over the run's own reports)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def fetch_status(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The gateway's /status at ``url``; None when it does not answer or answers no JSON."""
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def progress_line(elapsed: float, s: dict[str, Any]) -> str:
    """One line of the run's figures from ``curves.summarize``: the env's own measures under the labels its actors
    and learner report (e.g. "| furthest x 1,820 (restarted 2,400)"), none for an env without measures."""

    def num(value: float | None, fmt: str = ",.0f") -> str:
        return "-" if value is None else format(value, fmt)

    eps = "-" if s["epsilon_min"] is None else f"{s['epsilon_min']:.4f}-{s['epsilon_max']:.2f}"
    best = "" if s.get("best_return") is None else f" best {s['best_return']:.1f} (v{num(s.get('best_version'))})"
    line = (f"[{elapsed:7.0f}s] env steps {num(s['env_steps'])} ({num(s['env_steps_per_second'])}/s) | "
            f"updates {num(s['updates'])} ({num(s['updates_per_second'], ',.1f')}/s) | "
            f"return {num(s['return'], '.1f')} greedy {num(s['greedy_return'], '.1f')}{best} | eps {eps} | "
            f"replay {num(s['replay_size'])} | weights v{num(s['weight_version'])} | actors {num(s['actors_up'])}")
    if s.get("progress_label") and s.get("progress_mean") is not None:  # level-start episodes, restarted ones apart
        line += f" | {s['progress_label']} {num(s['progress_mean'])}"
        if s.get("restarted_progress_mean") is not None:
            line += f" (restarted {num(s['restarted_progress_mean'])})"
    if s.get("eval_return") is not None:  # the learner's last evaluation under its preset's protocol
        line += f" | eval v{num(s.get('eval_version'))}: "
        if s.get("eval_success_rate") is not None:
            success, progress = s.get("eval_success_label") or "success", s.get("eval_progress_label") or "progress"
            line += (f"{success} {s['eval_success_rate']:.0%}, {progress} {num(s.get('eval_progress_mean'))} "
                     f"(median {num(s.get('eval_progress_median'))})")
        else:
            line += f"return {s['eval_return']:.1f}"
    return line


def target_reached(summary: dict[str, Any], target: float | None) -> str | None:
    """Why the run stops for --target-return: the actors' rolling greedy return or the learner's kept best (its
    greedy evaluation on fixed seeds, what play and export then use) reached ``target``; None while neither has."""
    if target is None:
        return None
    steps = f"at {summary.get('env_steps') or 0:.0f} env steps"
    if (summary.get("greedy_return") or float("-inf")) >= target:
        return f"greedy return {summary['greedy_return']:.1f} reached the target {target:g} {steps}"
    if (summary.get("best_return") or float("-inf")) >= target:
        return (f"the learner's kept best policy (v{summary.get('best_version') or 0:.0f}) scored "
                f"{summary['best_return']:.1f} in its greedy evaluation: reached the target {target:g} {steps}")
    return None


OWN_KEYS = ("actor", "client")  # the run's own actors' CURVE keys (flywheel/security.py): local, not joined


def own_reports(status: dict[str, Any]) -> dict[str, Any]:
    """/status with only the instances whose reports may stop the run: the learner (the gateway admits only the
    learner's own key for it) and the run's own actors (plain local peers, or the keys folder's own actor key),
    never an actor that joined from another host with a key of its own (its ``curve_key`` names that key)."""
    services = dict(status.get("services", {}))
    if "actor" in services:
        actors = services["actor"]
        services["actor"] = {**actors, "instances": [
            i for i in actors.get("instances", []) if i.get("info", {}).get("curve_key", "client") in OWN_KEYS]}
    return {**status, "services": services}
