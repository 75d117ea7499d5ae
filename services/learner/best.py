"""The best policy so far (SB3's EvalCallback best_model): the learner's weights evaluated on a schedule.

Every ``interval_s`` the learner writes its online network to a candidate file and a child process (spawned once,
``SPAWN_LEAD_S`` before the first round is due, at a lower CPU priority than the actors, one torch thread) plays
``episodes`` episodes of it with flywheel/evaluation.py, the code the benchmarks evaluate with: greedy by default,
or at ``epsilon`` after 0..``noop_max`` no-ops (an emulated game's preset: its evaluation protocol, since a greedy
policy on a deterministic emulator plays one episode however many seeds it is given; a best.json scored another way
is not compared with). The success rate and progress of each evaluation are the env's own measures
(flywheel.envs.measures). Each round plays new seeds (``seed + episodes * k`` for round k), as ``flywheel bench
sb3`` does. A candidate whose round reaches the best so far (ties it or beats it) is played once more on the next
round's seeds before it is kept, and its score is the mean of both rounds: picking the maximum of many noisy rounds
on the same few seeds keeps a policy that was lucky on those seeds (seen on CartPole: a kept best that scored 500 on
its 10 seeds averaged 359 on 10 fresh ones). A confirmed candidate whose score beats the best (strictly, as SB3's)
replaces DIR/best.safetensors, and DIR/best.json says which version it is, how it did, on which seeds, and each
episode. The kept best plays each confirmation's seeds too, before the choice, and its score becomes the mean of
every episode it has played: the maximum of many rounds is still lucky (in a benchmarked platformer run a kept best
that scored 162 on its 10 episodes before 250k agent steps was still kept past 500k, where it reached the goal in 1%
of 100 fresh episodes against the newest weights' 39%); pooled this way, a kept score regresses to what the policy
does. A best.json of an earlier version, with no episodes, is compared as it is. The learner never waits for an
evaluation: it checks for a result each turn. ``flywheel play``, ``Policy.load`` and ``flywheel export`` take
best.safetensors by default (``--which latest``: the newest weights).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import save as st_save

from flywheel.checkpoints import write_atomically
from flywheel.envs.measures import Measures
from flywheel.metrics_spec import GreedyEvalCounters, GreedyEvalGauges
from flywheel.policy import BEST_FILE

from .checkpoint import FORMAT, FORMAT_VERSION
from .core import LearnerCore
from .evalchild import EvaluatorChild
from .state import network_spec

BEST_JSON = "best.json"
CANDIDATE_FILE = ".best-candidate.safetensors"
EPISODE_KEYS = ("seed", "return", "progress", "success", "end")  # what best.json keeps of each episode
SPAWN_LEAD_S = 30.0  # the child is spawned this long before the first round is due (at once for shorter intervals)
EVAL_TIMEOUT_S = 1800.0  # an evaluation with no result after this long (or 3 intervals) is given up
log = logging.getLogger("flywheel.learner")


def write_policy(path: Path, core: LearnerCore, weight_version: int, env_id: str) -> None:
    """The acting network alone (the online one, or its average), in the checkpoint format ``Policy.load`` reads;
    tmp + fsync + os.replace.

    ``weight_version`` is the version published last; the network may be a few updates past it (``updates``
    says exactly where)."""
    tensors = {f"online.{k}": v.detach().to("cpu", copy=True).contiguous()
               for k, v in core.acting.state_dict().items()}
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "network": core.name, "updates": int(core.updates),
            "network_spec": network_spec(core.online), "weight_version": int(weight_version),
            "saved_at": time.time(), "env_id": env_id, "policy_only": True}
    write_atomically(path, st_save(tensors, metadata={"flywheel": json.dumps(meta)}))


def evaluable(env_id: str) -> bool:
    """Whether flywheel/evaluation.py can play ``env_id``: single-agent envs (not MettaGrid's)."""
    from flywheel.envs import env_family

    try:
        return env_family(env_id) != "mettagrid"
    except (ValueError, ImportError):
        return False


def measures(records: list[dict[str, Any]], labels: Measures) -> dict[str, float]:
    """The episodes' success rate and mean and median progress, those the env has (``labels``, its measures:
    flywheel/evaluation.py's ``score``); empty for an env that has neither."""
    from flywheel.evaluation import score

    row = score(records, 0.0, labels)
    out: dict[str, float] = {}
    if row["success"] is not None:
        out["success_rate"] = float(row["success"]["rate"])
    if row["progress"] is not None:
        out["progress_mean"] = float(row["progress"]["mean"])
        out["progress_median"] = float(row["progress"]["median"])
    return out


@dataclass
class Round:
    """One evaluation in flight: the candidate's version and seeds; when it confirms a round, that round's records;
    when it is the kept best's replay of a confirmation's seeds, the candidate's records of those seeds."""

    version: int
    started: float
    seeds: list[int]
    first: list[dict[str, Any]] = field(default_factory=list)
    challenger: list[dict[str, Any]] | None = None
    took: float = 0.0  # a replay's: the seconds the candidate's confirmation took

    def what(self, kind: str) -> str:
        """The log's name for this round."""
        if self.challenger is not None:
            return f"the kept best's replay of weight version {self.version}'s seeds"
        return f"{kind} of weight version {self.version}"


def figures(records: list[dict[str, Any]], labels: Measures) -> dict[str, Any]:
    """What best.json and the gauges say of a policy's episodes: mean, min and max return, the seeds, the env's
    measures, and each episode (seed, return, progress, success, end) so that later episodes can be pooled in."""
    returns = [float(r["return"]) for r in records]
    return {"mean_return": sum(returns) / len(returns), "min_return": min(returns), "max_return": max(returns),
            "episodes": len(returns), "seeds": [int(r["seed"]) for r in records], **measures(records, labels),
            "records": [{k: r.get(k) for k in EPISODE_KEYS} for r in records]}


class BestKeeper:
    """Schedules evaluations of the learner's weights and keeps the best (see the module docstring)."""

    def __init__(self, directory: str | Path, env_id: str, *, interval_s: float, episodes: int, seed: int,
                 max_steps: int | None = None, epsilon: float = 0.0, noop_max: int = 0,
                 resumed: bool = True) -> None:
        self.directory = Path(directory)
        self.env_id, self.interval_s, self.episodes, self.max_steps = env_id, interval_s, episodes, max_steps
        self.epsilon, self.noop_max = float(epsilon), int(noop_max)
        self.kind = "greedy evaluation" if self.epsilon == 0 else f"evaluation at epsilon {self.epsilon:g}"
        self.seed = seed
        self.rounds = 0  # rounds started: round k plays seeds seed + episodes * k ...
        self.candidate = self.directory / CANDIDATE_FILE
        self.child: EvaluatorChild | None = None
        self.pending: Round | None = None
        self.next_at = time.monotonic() + interval_s
        self.evaluated_version = -1
        self.evaluations = 0
        self.failures = 0
        self.last: dict[str, Any] | None = None
        self._measures: Measures | None = None  # the env's (flywheel.envs.measures), read once when first asked
        if not resumed:  # a new run in this folder: its best starts over, as its checkpoints do
            self._forget_best()
        self.best = self._read_best()
        if self.best is not None and self.best.get("records"):  # a resumed run: every round on seeds not yet played
            highest = max(int(r["seed"]) for r in self.best["records"])
            self.rounds = max(0, (highest - self.seed) // self.episodes + 1)

    @property
    def measures(self) -> Measures:
        """The labels of the env's progress and success measures (none where the env cannot be described)."""
        if self._measures is None:
            from flywheel.evaluation import env_measures

            try:
                self._measures = env_measures(self.env_id)
            except Exception as exc:  # an env that cannot be described has no labels; its evaluations fail alone
                log.warning("learner: the measures of %s are unknown (%s)", self.env_id, exc)
                self._measures = Measures()
        return self._measures

    def labels(self) -> dict[str, str]:
        """The learner's telemetry info about its evaluations: ``eval_progress_label``, ``eval_success_label``."""
        return {f"eval_{key}_label": label for key, label in self.measures.labels().items()}

    def _forget_best(self) -> None:
        old = [self.directory / name for name in (BEST_FILE, BEST_JSON) if (self.directory / name).exists()]
        for path in old:
            path.unlink(missing_ok=True)
        if old:
            log.info("learner: a fresh start: removed the earlier run's best policy from %s", self.directory)

    def _read_best(self) -> dict[str, Any] | None:
        """The best so far from an earlier learner on this folder (a resumed run goes on comparing with it)."""
        path = self.directory / BEST_JSON
        if not (self.directory / BEST_FILE).is_file() or not path.is_file():
            return None
        try:
            best = json.loads(path.read_text())
            float(best["mean_return"])
            int(best["weight_version"])
            scored = (float(best.get("epsilon", 0.0)), int(best.get("noop_max", 0)))
            for record in best.get("records", []):  # each episode, to pool its replays with (older files: none)
                float(record["return"]), int(record["seed"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("learner: %s is unreadable (%s); the next evaluation sets the best anew", path, exc)
            return None
        if scored != (self.epsilon, self.noop_max):
            log.warning("learner: the best policy in %s was scored at epsilon %g with 0..%d no-ops, these evaluations "
                        "play epsilon %g with 0..%d: not comparable, so the next evaluation sets the best anew",
                        self.directory, *scored, self.epsilon, self.noop_max)
            return None
        log.info("learner: best policy so far: weight version %d, mean return %.2f over %d episodes",
                 best["weight_version"], best["mean_return"], best.get("episodes", 0))
        return dict(best)

    def tick(self, now: float, core: LearnerCore, version: int) -> None:
        """Take a finished round; start the next one when due and the weights are new since the last."""
        if self.child is None and now >= self.next_at - SPAWN_LEAD_S:
            self.child = EvaluatorChild()  # its imports take seconds: done while the interval runs out
        if self.pending is not None and self.child is not None and self.child.ready():
            done, self.pending = self.pending, None
            self._finish(done, now)
        elif self.pending is not None and now - self.pending.started > max(EVAL_TIMEOUT_S, 3 * self.interval_s):
            stuck, self.pending = self.pending, None
            self.failures += 1  # a child killed mid-task (e.g. out of memory) never answers
            log.error("learner: %s gave no result in %.0f s; restarting its process", stuck.what(self.kind),
                      now - stuck.started)
            self._stop_child()
            if stuck.challenger is not None:  # the candidate's two rounds stand: the kept score decides
                self._decide(stuck, stuck.first + stuck.challenger, now, replay=None)
        if self.pending is not None or now < self.next_at or version <= self.evaluated_version or version <= 0:
            return
        self.next_at = now + self.interval_s
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            write_policy(self.candidate, core, version, self.env_id)
        except OSError as exc:
            self.failures += 1
            log.error("learner: cannot write the evaluation candidate %s: %s", self.candidate, exc)
            return
        self._start(version, now)
        self.evaluated_version = version

    def _start(self, version: int, now: float, first: list[dict[str, Any]] | None = None) -> None:
        """Play the candidate file on the next round's seeds (a confirmation of the round ``first`` when given)."""
        seeds = list(range(self.seed + self.episodes * self.rounds, self.seed + self.episodes * (self.rounds + 1)))
        self.rounds += 1
        self._play(self.candidate, seeds)
        self.pending = Round(version, now, seeds, first or [])

    def _play(self, policy: Path, seeds: list[int]) -> None:
        """Hand the child one round: the policy file played on the seeds under these evaluations' conditions."""
        if self.child is None:  # a child that gave no result was stopped
            self.child = EvaluatorChild()
        self.child.submit((self.env_id, str(policy), seeds, self.max_steps, self.epsilon, self.noop_max))

    def _finish(self, done: Round, now: float) -> None:
        records = self._result(done)
        if done.challenger is not None:  # the kept best's replay of a confirmation's seeds (None: it failed)
            self._decide(done, done.first + done.challenger, now, replay=records)
        elif records is not None and done.first and self.best is not None and "records" in self.best:
            self._play(self.directory / BEST_FILE, done.seeds)
            self.pending = Round(done.version, now, done.seeds, done.first, challenger=records,
                                 took=now - done.started)
        elif records is not None:
            self._decide(done, done.first + records, now, replay=None)

    def _result(self, done: Round) -> list[dict[str, Any]] | None:
        """The finished round's records; None (counted and logged) when it failed."""
        child = self.child
        assert child is not None  # a round is pending only with its child
        try:
            records = child.result()
        except RuntimeError as exc:  # the env or the policy failed in the child: counted, the run goes on
            if not child.process.is_alive():
                self._stop_child()  # the next round starts a fresh one
            self.failures += 1
            log.error("learner: %s failed: %s", done.what(self.kind),
                      str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            return None
        self.evaluations += 1
        return records

    def _decide(self, done: Round, records: list[dict[str, Any]], now: float,
                replay: list[dict[str, Any]] | None) -> None:
        """A candidate's round (both, when confirming) against the best: confirm, keep, or leave the best."""
        took = done.took if done.challenger is not None else now - done.started
        self.last = {"weight_version": done.version, **figures(records, self.measures), "epsilon": self.epsilon,
                     "noop_max": self.noop_max, "seconds": took, "evaluated_at": time.time()}
        mean = float(self.last["mean_return"])
        replayed = self._rescore(replay) if replay is not None else ""
        kept = None if self.best is None else float(self.best["mean_return"])
        if not done.first and (kept is None or mean >= kept):  # the next seeds say whether it was luck (a tie too:
            # a kept score at the env's ceiling is re-measured only when a round reaches it)
            log.info("learner: %s of weight version %d: mean return %.2f over %d episodes; playing it on %d more "
                     "seeds before it is kept", self.kind, done.version, mean, len(records), self.episodes)
            self._start(done.version, now, records)
            return
        better = kept is None or mean > kept
        if better and not self._keep():
            better = False  # said by _keep; the best stays
        log.info("learner: %s of weight version %d: mean return %.2f over %d episodes (%.0f s)%s%s",
                 self.kind, done.version, mean, len(records), self.last["seconds"], replayed,
                 "; the best so far, kept as " + str(self.directory / BEST_FILE) if better else
                 f"; the best stays version {self.best['weight_version']} ({self.best['mean_return']:.2f})"
                 if self.best else "")

    def _rescore(self, replay: list[dict[str, Any]]) -> str:
        """Pool the kept best's replay into its score and best.json; the log's words for it."""
        assert self.best is not None
        before, episodes = float(self.best["mean_return"]), len(self.best["records"])
        self.best = {**self.best, **figures([*self.best["records"], *replay], self.measures),
                     "rescored_at": time.time()}
        try:
            write_atomically(self.directory / BEST_JSON, (json.dumps(self.best, indent=1) + "\n").encode())
        except OSError as exc:
            self.failures += 1
            log.error("learner: cannot rewrite %s with the kept best's new score: %s", self.directory / BEST_JSON, exc)
        return (f"; the kept best, version {self.best['weight_version']}, played the same seeds: "
                f"{sum(float(r['return']) for r in replay) / len(replay):.2f}, its score {before:.2f} over {episodes} "
                f"episodes now {self.best['mean_return']:.2f} over {self.best['episodes']}")

    def _keep(self) -> bool:
        """The candidate file becomes best.safetensors and ``last`` best.json; False (logged) when they cannot."""
        assert self.last is not None
        tmp = self.directory / f".{BEST_JSON}.{os.getpid()}.tmp"
        try:  # both written before either is replaced: the pair changes together (but for a crash between)
            tmp.write_text(json.dumps(self.last, indent=1) + "\n")
            os.replace(self.candidate, self.directory / BEST_FILE)
            os.replace(tmp, self.directory / BEST_JSON)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self.failures += 1
            log.error("learner: cannot keep weight version %d as the best policy: %s", self.last["weight_version"],
                      exc)
            return False
        self.best = self.last
        return True

    def gauges(self) -> GreedyEvalGauges:
        """The last evaluation and the best kept (each left out until there is one)."""
        out = GreedyEvalGauges()
        if self.last is not None:
            out.eval_greedy_return = float(self.last["mean_return"])
            out.eval_greedy_version = float(self.last["weight_version"])
            out.eval_episodes = float(self.last["episodes"])
            out.eval_success_rate = self.last.get("success_rate")
            out.eval_progress_mean = self.last.get("progress_mean")
            out.eval_progress_median = self.last.get("progress_median")
        if self.best is not None:
            out.best_greedy_return = float(self.best["mean_return"])
            out.best_weight_version = float(self.best["weight_version"])
        return out

    def counters(self) -> GreedyEvalCounters:
        """Evaluations finished and failed."""
        return GreedyEvalCounters(greedy_evaluations_total=float(self.evaluations),
                                  greedy_evaluation_failures_total=float(self.failures))

    def _stop_child(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None

    def close(self) -> None:
        """Stop the child (an evaluation in progress is dropped) and remove the candidate."""
        self._stop_child()
        self.candidate.unlink(missing_ok=True)
