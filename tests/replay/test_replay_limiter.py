"""RateLimiter: minimum size, samples-per-insert ratio within an error band, blocked inserts."""

from __future__ import annotations

import pytest

from flywheel.services.replay.limiter import RateLimiter


def test_min_size_gates_sampling() -> None:
    limiter = RateLimiter(min_size_to_sample=100)
    assert not limiter.can_sample(32, 0)
    assert not limiter.can_sample(32, 99)
    assert limiter.can_sample(32, 100)
    assert limiter.can_sample(10_000, 100)  # spi 0: no ratio at all


def test_spi_zero_is_unlimited_both_ways() -> None:
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=0.0, error_buffer=0.0, block_inserts=True)
    limiter.record_insert(1)
    for _ in range(1000):
        assert limiter.can_sample(512, 1)
        limiter.record_sample(512)
    assert limiter.can_insert(10**9)


def test_learner_running_ahead_blocks_sampling_within_error_band() -> None:
    # spi 4, min size 10, band 20: diff = 4*inserts - samples must stay >= 40 - 20 = 20.
    limiter = RateLimiter(min_size_to_sample=10, samples_per_insert=4.0, error_buffer=20.0)
    limiter.record_insert(10)  # diff 40
    assert limiter.can_sample(20, 10)  # 40 - 20 = 20 >= 20
    assert not limiter.can_sample(21, 10)
    limiter.record_sample(20)
    assert not limiter.can_sample(1, 10)  # learner ahead: waits
    limiter.record_insert(1)  # diff 24
    assert limiter.can_sample(4, 11) and not limiter.can_sample(5, 11)
    # Over a long run the realised ratio stays within the band of the target.
    for _ in range(1000):
        limiter.record_insert(1)
        while limiter.can_sample(1, 100):
            limiter.record_sample(1)
        assert abs(4.0 * limiter.inserts - limiter.samples - 40) <= 20


def test_block_inserts_when_actors_run_ahead() -> None:
    limiter = RateLimiter(min_size_to_sample=10, samples_per_insert=2.0, error_buffer=10.0, block_inserts=True)
    # Below min size, inserts are always allowed (the table must fill first).
    for _ in range(10):
        assert limiter.can_insert(1)
        limiter.record_insert(1)
    # diff = 2*inserts - samples must stay <= 20 + 10 = 30: up to 15 inserts without samples.
    limiter.record_insert(5)
    assert not limiter.can_insert(1)
    limiter.record_sample(2)  # the learner catches up
    assert limiter.can_insert(1)
    limiter.record_insert(1)
    assert not limiter.can_insert(1)



def test_a_request_larger_than_the_band_is_served_once_inserts_are_blocked() -> None:
    # spi 2, min size 10, band 10: diff must stay in [20 - 10, 20 + 10]; a request of 50 can never fit the band.
    limiter = RateLimiter(min_size_to_sample=10, samples_per_insert=2.0, error_buffer=10.0, block_inserts=True)
    inserts = 0
    while limiter.can_insert(1):
        limiter.record_insert(1)
        inserts += 1
        assert not limiter.can_sample(50, inserts) or not limiter.can_insert(1)
    assert inserts == 15 and limiter.can_sample(50, inserts)  # band full: waiting could only deadlock
    limiter.record_sample(50)
    assert limiter.can_insert(1) and not limiter.can_sample(50, inserts)  # the ratio is paid back by inserts
    # Without block_inserts the actors keep inserting, so the same request simply waits for them.
    free = RateLimiter(min_size_to_sample=10, samples_per_insert=2.0, error_buffer=10.0)
    free.record_insert(15)
    assert not free.can_sample(50, 15)
    free.record_insert(20)  # diff 70: 70 - 50 >= 10
    assert free.can_sample(50, 35)

def test_without_block_inserts_actors_are_never_blocked() -> None:
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=0.0, block_inserts=False)
    limiter.record_insert(10**6)
    assert limiter.can_insert(10**6)


def test_state_round_trip_and_validation() -> None:
    limiter = RateLimiter(min_size_to_sample=5, samples_per_insert=1.0, error_buffer=3.0)
    limiter.record_insert(7)
    limiter.record_sample(4)
    other = RateLimiter(min_size_to_sample=5, samples_per_insert=1.0, error_buffer=3.0)
    other.load_state_dict(limiter.state_dict())
    assert (other.inserts, other.samples) == (7, 4)
    with pytest.raises(ValueError):
        RateLimiter(min_size_to_sample=0)
    with pytest.raises(ValueError):
        RateLimiter(samples_per_insert=-1.0)
    with pytest.raises(ValueError):
        RateLimiter(error_buffer=-1.0)
