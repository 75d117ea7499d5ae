"""flywheel.stats against scipy.stats on fixed data: bootstrap and Wilson intervals, IQM, the runs x episodes one."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from flywheel.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    across_runs,
    bootstrap_ci,
    interquartile_mean,
    median_order_interval,
    paired_difference,
    summarize,
    wilson_interval,
)

DATA = np.random.default_rng(3).normal(2_000.0, 600.0, size=37)  # fixed: 37 furthest-x-like values


def scipy_percentile_ci(data: np.ndarray, statistic: str, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    result = scipy_stats.bootstrap((data,), {"mean": np.mean, "median": np.median}[statistic],
                                   n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                                   rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_bootstrap_intervals_are_scipys_percentile_bootstrap(statistic: str) -> None:
    expected = scipy_percentile_ci(DATA, statistic)
    assert bootstrap_ci(DATA, statistic) == pytest.approx(expected, rel=1e-12)
    s = summarize(DATA)  # one resampling serves both intervals: the same figures as one bootstrap each
    key = "ci" if statistic == "mean" else "median_ci"
    assert (s[f"{key}_low"], s[f"{key}_high"]) == pytest.approx(expected, rel=1e-12)
    assert bootstrap_ci(DATA, statistic, seed=7) == pytest.approx(scipy_percentile_ci(DATA, statistic, 7), rel=1e-12)
    with pytest.raises(ValueError, match="statistic"):
        bootstrap_ci(DATA, "mode")


def test_the_summarys_figures_are_pinned() -> None:
    """The figures published with the bootstrap before flywheel.stats existed do not move (same seed, resamples)."""
    s = summarize([1.0, 2.0, 3.0, 4.0], [True, False, False, False])
    assert (s["n"], s["mean"], s["median"], s["flag_rate"]) == (4, 2.5, 2.5, 0.25)
    assert (s["ci_low"], s["ci_high"], s["median_ci_low"], s["median_ci_high"]) == (1.5, 3.5, 1.0, 4.0)
    wide = summarize(DATA, DATA > 2000)  # as flywheel.evaluation.summarize gave them before this module
    assert (wide["ci_low"], wide["ci_high"]) == (1775.4000950681643, 2227.9432928837555)
    assert (wide["median_ci_low"], wide["median_ci_high"]) == (1824.9678605360816, 2250.859308035467)
    assert (wide["flag_ci_low"], wide["flag_ci_high"]) == (0.28671719177381483, 0.5908581902777351)
    assert summarize([1.0, 2.0, 3.0, 4.0]) == {**s, "flag_rate": None, "flag_ci_low": None, "flag_ci_high": None}
    assert summarize([7.0] * 5)["ci_low"] == summarize([7.0] * 5)["ci_high"] == 7.0
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, 2.0], [True])


@pytest.mark.parametrize(("successes", "n"), [(0, 100), (44, 100), (78, 100), (100, 100), (1, 3), (5, 9)])
def test_wilson_interval_is_scipys(successes: int, n: int) -> None:
    expected = scipy_stats.binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(successes, n) == pytest.approx((expected.low, expected.high), abs=1e-8)
    s = summarize(list(range(n)), [i < successes for i in range(n)])
    assert (s["flag_ci_low"], s["flag_ci_high"]) == wilson_interval(successes, n)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_interquartile_mean_is_scipys_trim_mean() -> None:
    for data in (DATA, DATA[:8], DATA[:3], [100, 1, 2, 3, -50, 4, 5, 6]):
        assert interquartile_mean(data) == pytest.approx(scipy_stats.trim_mean(data, 0.25), rel=1e-12)


def test_across_runs_interval_over_runs_is_scipys_bootstrap_of_the_run_scores() -> None:
    """rliable's stratified bootstrap for one task resamples runs: scipy's bootstrap of the run means, same seed."""
    rng = np.random.default_rng(11)
    runs = [rng.normal(mu, 300.0, size=20).tolist() for mu in (1500.0, 1900.0, 2100.0, 2600.0, 3000.0)]
    flags = [(rng.random(20) < p).tolist() for p in (0.1, 0.2, 0.3, 0.4, 0.5)]
    out = across_runs(runs, flags)
    scores = np.array([np.mean(r) for r in runs])
    assert out["median_mean_ci"] == pytest.approx(scipy_percentile_ci(scores, "median"), rel=1e-12)
    iqm = scipy_stats.bootstrap((scores,), lambda x, axis: scipy_stats.trim_mean(x, 0.25, axis=axis),
                                n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                                rng=np.random.default_rng(BOOTSTRAP_SEED)).confidence_interval
    assert out["iqm_mean_ci"] == pytest.approx([iqm.low, iqm.high], rel=1e-12)
    assert out["iqm_mean"] == pytest.approx(scipy_stats.trim_mean(scores, 0.25))
    assert out["confidence"] == 0.95


def test_across_runs_pooled_interval_coverage_with_four_runs() -> None:
    """The two-level bootstrap's coverage, measured: 200 made-up experiments of 4 runs x 15 episodes whose run
    means vary around a known mean. Nominal 95%; with 4 runs a percentile bootstrap over runs is too narrow (it
    sees a spread of n-1 over n of the runs' variance): 175 of 200 (87.5%) hold the mean. The bounds keep the
    binomial noise of 200 draws (2 standard errors: about 5 points)."""
    rng = np.random.default_rng(2024)
    hits = 0
    for _ in range(200):
        means = rng.normal(1000.0, 150.0, size=4)
        runs = [rng.normal(m, 400.0, size=15).tolist() for m in means]
        low, high = across_runs(runs, [[False] * 15] * 4, resamples=1000, seed=int(rng.integers(2**31)))[
            "pooled_mean_ci"]
        hits += low <= 1000.0 <= high
    assert 165 <= hits <= 185, hits  # 175 with NumPy 2 (fixed seeds); the bounds allow another draw of the data


def test_median_order_interval_picks_order_statistics_by_their_exact_coverage() -> None:
    """k-th lowest to k-th highest, k the largest with binomial coverage >= 95%; under 6 values the range."""
    assert median_order_interval([3.0]) is None
    assert median_order_interval([0.3, 0.1, 0.2]) == (0.1, 0.3, 0.75)
    assert median_order_interval([5, 1, 4, 2, 3]) == (1.0, 5.0, 0.9375)
    low, high, coverage = median_order_interval(list(range(10)))
    assert (low, high) == (1.0, 8.0) and coverage == pytest.approx(1 - 2 * 11 / 1024)  # k=3 would cover 89%
    assert scipy_stats.binom.cdf(1, 10, 0.5) * 2 == pytest.approx(1 - coverage)


def test_median_order_interval_coverage_is_what_it_says() -> None:
    """2,000 made-up experiments of 5 runs from a skewed distribution whose median is known (an exponential's,
    ln 2): the range holds it in 93.75% of them, whatever the distribution. Binomial noise of 2,000 draws: 4
    standard errors are 2.2 points."""
    rng = np.random.default_rng(72)
    hits = 0
    for _ in range(2000):
        low, high, coverage = median_order_interval(rng.exponential(1.0, size=5))
        hits += low <= np.log(2) <= high
    assert coverage == 0.9375
    assert abs(hits / 2000 - 0.9375) < 0.022, hits
    out = across_runs([[float(i)] * 4 for i in range(5)], [[i < k for i in range(4)] for k in (0, 1, 2, 3, 4)])
    assert out["median_mean_order"] == {"low": 0.0, "high": 4.0, "coverage": 0.9375}
    assert out["median_flag_rate_order"] == {"low": 0.0, "high": 1.0, "coverage": 0.9375}


def test_paired_difference_pairs_runs_and_episodes() -> None:
    """Per-pair differences are exact; a constant shift of every episode gives an interval of that shift alone
    (episodes are paired: an unpaired bootstrap would be as wide as the episodes' spread); A against itself is 0."""
    rng = np.random.default_rng(5)
    a = [rng.normal(1000.0, 400.0, size=20) for _ in range(3)]
    a_flags = [rng.random(20) < 0.3 for _ in range(3)]
    shifted = paired_difference(a, [x + 25.0 for x in a], a_flags, a_flags, resamples=500)
    assert shifted["pair_mean_differences"] == pytest.approx([25.0] * 3)
    assert shifted["mean_difference_ci"] == pytest.approx([25.0, 25.0])
    assert (shifted["mean_b_ahead"], shifted["mean_b_behind"]) == (3, 0)
    assert shifted["flag_rate_difference"] == 0.0 and shifted["flag_rate_difference_ci"] == [0.0, 0.0]
    b_flags = [np.ones(20, dtype=bool), a_flags[1], np.zeros(20, dtype=bool)]
    out = paired_difference(a, a, a_flags, b_flags, resamples=500)
    expected = [1.0 - a_flags[0].mean(), 0.0, -a_flags[2].mean()]
    assert out["pair_flag_rate_differences"] == pytest.approx(expected)
    assert out["median_flag_rate_difference"] == pytest.approx(0.0)
    assert (out["flag_rate_b_ahead"], out["flag_rate_b_behind"]) == (1, 1)
    low, high = out["flag_rate_difference_ci"]
    assert low < out["flag_rate_difference"] < high
    with pytest.raises(ValueError, match="as many runs"):
        paired_difference(a, a[:2], a_flags, a_flags[:2])


@pytest.mark.parametrize("pairs,measured", [(3, 151), (5, 167)])
def test_paired_difference_coverage_with_few_pairs(pairs: int, measured: int) -> None:
    """The paired interval's coverage, measured: 200 made-up experiments where an arm's effect varies from seed to
    seed (sd 150 around 50) more than 15 episodes' noise (sd 100). Nominal 95%; 151 of 200 (75.5%) hold the true
    mean effect with 3 pairs, 167 (83.5%) with 5: the interval over few pairs is too narrow, as documented. The
    bounds keep the binomial noise of 200 draws."""
    rng = np.random.default_rng(2024)
    hits = 0
    for _ in range(200):
        seeds, effects = rng.normal(1000.0, 150.0, size=pairs), rng.normal(50.0, 150.0, size=pairs)
        a = [rng.normal(m, 100.0, size=15) for m in seeds]
        b = [rng.normal(m + e, 100.0, size=15) for m, e in zip(seeds, effects, strict=True)]
        none = [[False] * 15] * pairs
        low, high = paired_difference(a, b, none, none, resamples=1000, seed=int(rng.integers(2**31)))[
            "mean_difference_ci"]
        hits += low <= 50.0 <= high
    assert measured - 12 <= hits <= measured + 12, hits
