"""`flywheel bench mario --opt checkpoint_steps`: the marks' parsing, what a resumed part still takes, when the polls
come as a mark nears, and how the report shows a checkpoint taken at agent steps beside the minute ones."""

from __future__ import annotations

from typing import Any

import pytest

from flywheel.bench.parts import mario_report
from flywheel.bench.parts.mario_state import STEPS_POLL_MIN_S, MarioState, parse_steps, steps_wait
from flywheel.bench.runner import BenchError
from flywheel.bench.suites import mario


def test_step_marks_are_whole_increasing_numbers_above_zero() -> None:
    assert parse_steps("250000, 500000,750000,1000000") == [250_000, 500_000, 750_000, 1_000_000]
    assert parse_steps("3000") == [3000]
    for bad in (",", "1e6", "2500.5", "250k", "500000,abc"):
        with pytest.raises(BenchError, match="expected whole numbers of agent steps separated by commas"):
            parse_steps(bad)
    for bad in ("0", "-5,10", "500,250", "500,500"):
        with pytest.raises(BenchError, match="each must be > 0 and larger than the one before"):
            parse_steps(bad)


def test_a_resumed_part_takes_only_the_marks_no_earlier_part_took() -> None:
    state = MarioState(recipe={}, evaluation={}, env_steps=12_000.0)
    state.checkpoints = [{"minute": 0.4}, {"minute": 0.2, "steps_mark": 3000, "deploy": "run"}]
    assert state.steps_to_take([3000, 20_000], "run") == [20_000]  # 3,000: taken in an earlier part, kept
    assert MarioState(recipe={}, evaluation={}).steps_to_take([3000], "compose") == [3000]
    with pytest.raises(BenchError, match=r"1000, 5000 lie within the training so far \(12,000 agent steps\)"):
        state.steps_to_take([1000, 3000, 5000, 20_000], "run")  # passed in the earlier part without a checkpoint
    with pytest.raises(BenchError, match="3000 lie within"):
        state.steps_to_take([3000], "compose")  # another deploy's mark is not this one's


def test_a_part_adds_its_step_counts_to_the_polled_and_written_steps() -> None:
    state = MarioState(recipe={}, evaluation={}, env_steps=10_000.0)
    state.add_part(1.0, [{"t": 5.0, "env_steps": 500.0}],
                   [{"t": 5.0, "asked_t": 4.0, "env_steps": 800.0, "steps_mark": 10_500, "polled_env_steps": 600.0}],
                   {})
    [c] = state.checkpoints
    assert (c["env_steps"], c["polled_env_steps"], c["steps_mark"]) == (10_800.0, 10_600.0, 10_500)


def test_polls_come_sooner_as_a_mark_nears_but_never_later_than_poll_s() -> None:
    points = [{"t": 0.0, "env_steps": 0.0}, {"t": 15.0, "env_steps": 1500.0}]  # 100 agent steps/s
    assert steps_wait(points, 100_000, 15.0) == 15.0  # far away: the usual poll
    assert steps_wait(points, 2000, 15.0) == pytest.approx(4.0)  # 5 s away: 80% of the way
    assert steps_wait(points, 1550, 15.0) == STEPS_POLL_MIN_S  # half a second away: no sooner than the telemetry
    assert steps_wait(points[:1], 2000, 15.0) == 15.0  # one poll: no rate yet
    assert steps_wait([points[1], {"t": 30.0, "env_steps": 1500.0}], 2000, 15.0) == 15.0  # stalled: no prediction


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class _Run:
    started = 0.0

    def check_alive(self) -> None:
        pass

    def snapshot(self) -> object:
        return object()


class _Ctx:
    def progress(self, line: str) -> None:
        pass


def test_each_mark_is_taken_at_the_first_poll_that_reads_it_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(mario, "time", clock)
    points: list[dict[str, Any]] = []
    taken: list[tuple[float, float, float]] = []
    minutes: list[float] = []

    def point(_snap: object) -> dict[str, Any]:  # 100 agent steps a second
        return {"t": clock.now, "env_steps": 100.0 * clock.now, "updates": 0.0, "load": [0.0, 0.0, 0.0]}

    def at_steps(mark: float, polled: float) -> None:
        taken.append((mark, polled, clock.now))
        clock.now += 2.0  # the checkpoint takes two seconds

    mario.train_and_poll(_Ctx(), _Run(), 1.0, 15.0, points, point, lambda p: "", [0.5], minutes.append,  # type: ignore[arg-type]
                         [2000, 2050, 5000], at_steps)
    assert minutes == [0.5]
    # no rate at the first poll: 2,000 at the second (30 s); 2,050 read again at once after its checkpoint (32 s);
    # 5,000 approached at 80% of the predicted way each time (34 s: 16 s away, 46.8 s: 3.2 s away) and read past at
    # the next poll, no sooner than a second later (50.36 s)
    assert [(m, round(p)) for m, p, _ in taken] == [(2000, 3000), (2050, 3200), (5000, 5036)]
    assert [round(p["t"], 2) for p in points][:7] == [15.0, 30.0, 32.0, 34.0, 46.8, 49.36, 50.36]
    assert all(b["t"] - a["t"] <= 15.0 + 1e-9 for a, b in zip(points, points[1:], strict=False))


def _episodes(xs: list[float], flags: int = 0) -> list[dict[str, Any]]:
    return [{"seed": 100 + i, "x_pos_max": x, "flag": i < flags, "return": x / 10, "length": 100, "end": "death",
             "seconds": 1.0} for i, x in enumerate(xs)]


def test_step_checkpoints_sit_beside_the_minute_ones_with_their_overshoot() -> None:
    assert [mario_report.checkpoint_label(c) for c in (
        {"minute": 15.0}, {"minute": 1.0, "steps_mark": 250_000}, {"minute": 1.0, "steps_mark": 1_000_000},
        {"minute": 1.0, "steps_mark": 1_500_000}, {"minute": 1.0, "steps_mark": 2500})] == \
        ["15 min", "250k steps", "1M steps", "1.5M steps", "2,500 steps"]
    settings = {"env_id": "SuperMarioBros-1-1-v0?size=42", "minutes": 60.0, "actors": 1, "sets": [],
                "eval_episodes": 100, "eval_epsilon": 0.05, "also_epsilon": 0.001, "eval_workers": 2,
                "noop_max": 30, "stall_steps": 0, "seeds": list(range(100_000, 100_100)),
                "checkpoint_steps": [250_000, 1_000_000]}
    by_steps = {"minute": 60.0, "steps_mark": 250_000, "env_steps": 251_200, "polled_env_steps": 250_300,
                "episodes": _episodes([2400.0, 2600.0] * 50, flags=10),
                "episodes_also": _episodes([2800.0] * 100, flags=40)}
    by_minute = {"minute": 60.0, "env_steps": 700_000, "episodes": _episodes([2400.0, 2600.0] * 50, flags=30),
                 "episodes_also": _episodes([2900.0] * 100, flags=50)}
    result = mario_report.summarize(settings, [], [by_steps, by_minute], _episodes([400.0, 600.0] * 50),
                                    {"start": [0.5, 0.5, 0.5]})
    cases = [r.case for r in result.rows]
    assert cases[0] == "checkpoint at 250k steps (251,200 agent steps, +1,200 over the mark; 60 min)"
    assert cases[1] == "checkpoint at 60 min (700,000 agent steps)"
    [goal] = [r for r in result.rows if r.case.startswith("goal:")]
    assert goal.flywheel == 30.0  # the goals judge the minute checkpoint, not a step mark's at the same minute
    policy, also = result.sections[:2]
    assert "| run 250k steps | 251,200 | 2,500 (" in policy and "| run 60 min | 700,000 | 2,500 (" in policy
    assert "| run 250k steps | 2,800 (" in also and "| 2,500 | 10% |" in also
    [note] = [n for n in result.notes if n.startswith("Checkpoints at agent-step marks")]
    assert "run 250k steps +1,200 (+0.5%; the poll that reached it +300)" in note
    assert note.endswith("Not reached in the training: run 1M steps.")
