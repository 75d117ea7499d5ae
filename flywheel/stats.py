"""Flywheel's statistics: percentile-bootstrap and Wilson intervals, the interquartile mean, runs x episodes.

Every interval is a 95% interval (``CONFIDENCE``). The bootstraps are percentile bootstraps with a fixed seed, so
the same values always give the same interval; each is the interval ``scipy.stats.bootstrap(..., method=
"percentile", n_resamples=BOOTSTRAP_RESAMPLES, rng=numpy.random.default_rng(seed))`` gives (tests/test_stats.py
checks it). The Wilson interval is ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``; the IQM is
``scipy.stats.trim_mean(x, 0.25)``, as rliable computes it. Only NumPy is needed at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import comb
from typing import Any

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20240601  # fixed, so the same values always give the same interval
WILSON_Z = 1.959964  # the normal quantile of a 95% interval, to 6 decimals (figures published with it stay put)
_PERCENTILES = [2.5, 97.5]  # the 95% interval's ends
_STATISTICS: dict[str, Callable[..., Any]] = {"mean": np.mean, "median": np.median}


def _values(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or len(data) == 0:
        raise ValueError(f"{what} needs a non-empty sequence of numbers")
    return data


def _resampled(data: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` resamples of ``data`` with replacement, one a row (numpy's default_rng(seed))."""
    return data[np.random.default_rng(seed).integers(len(data), size=(resamples, len(data)))]


def bootstrap_ci(values: Sequence[float] | np.ndarray, statistic: str = "mean", *,
                 resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the ``statistic`` ("mean" or "median") of ``values``."""
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(_STATISTICS)}, got {statistic!r}")
    boot = _STATISTICS[statistic](_resampled(_values(values, "bootstrap_ci"), resamples, seed), axis=1)
    low, high = np.percentile(boot, _PERCENTILES)
    return float(low), float(high)


def summarize(values: Sequence[float] | np.ndarray, flags: Sequence[bool] | None = None, *,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """n, mean, median, 95% percentile-bootstrap intervals of the mean and the median (the same resamples for
    both), and a success rate.

    ``flags`` (one bool per value: success or not) gives ``flag_rate`` and its 95% Wilson interval
    (``flag_ci_low``, ``flag_ci_high``); without them all three are None. No values: a ValueError.
    """
    data = _values(values, "summarize")
    resampled = _resampled(data, resamples, seed)
    low, high = np.percentile(resampled.mean(axis=1), _PERCENTILES)
    median_low, median_high = np.percentile(np.median(resampled, axis=1), _PERCENTILES)
    flag_rate = flag_low = flag_high = None
    if flags is not None:
        if len(flags) != len(data):
            raise ValueError(f"{len(flags)} flags for {len(data)} values")
        flag_rate = float(np.mean([bool(f) for f in flags]))
        flag_low, flag_high = wilson_interval(sum(bool(f) for f in flags), len(data))
    return {"n": int(len(data)), "mean": float(data.mean()), "median": float(np.median(data)),
            "ci_low": float(low), "ci_high": float(high), "median_ci_low": float(median_low),
            "median_ci_high": float(median_high), "flag_rate": flag_rate, "flag_ci_low": flag_low,
            "flag_ci_high": flag_high}


def wilson_interval(successes: int, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound at 0 and n successes, unlike the normal one)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def interquartile_mean(values: Sequence[float] | np.ndarray) -> float:
    """The mean of the middle half: ``int(n / 4)`` values cut from each end, as scipy's trim_mean(x, 0.25) and
    rliable's IQM do (so under 4 values it is the plain mean)."""
    data = np.sort(np.asarray(values, dtype=np.float64))
    cut = len(data) // 4
    return float(data[cut:len(data) - cut].mean())


def median_order_interval(values: Sequence[float] | np.ndarray,
                          confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of what the values were drawn from: (low, high, coverage).

    The k-th lowest and k-th highest of n values hold the population median with probability
    1 - 2 P(Binomial(n, 1/2) < k), whatever the distribution (order statistics; no bootstrap, so no coverage lost
    to few runs). k is the largest whose coverage reaches ``confidence``; below 6 values none does, and the range
    (k = 1) is given with its own, lower coverage (3 values: 75%, 5: 93.75%). None for a single value.
    """
    data = np.sort(_values(values, "median_order_interval"))
    n = len(data)
    if n < 2:
        return None
    cover = [1.0 - 2.0 * sum(comb(n, i) for i in range(k)) / 2.0 ** n for k in range(1, n // 2 + 1)]
    k = max((i + 1 for i, c in enumerate(cover) if c >= confidence), default=1)
    return float(data[k - 1]), float(data[n - k]), cover[k - 1]


def across_runs(runs: Sequence[Sequence[float]], flags: Sequence[Sequence[bool]], *,
                resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Several training runs' evaluations of one task (runs x episodes), aggregated as rliable does.

    Each run's score is its mean over its episodes. The median and interquartile mean of the run scores (and of
    the runs' success rates) get 95% percentile intervals from a bootstrap over runs (rliable's stratified
    bootstrap, one task: runs resampled with replacement); they cover the run-to-run spread only, treating each
    run's score as exact. The pooled episodes' mean and success rate get a two-level bootstrap (runs, then episodes
    within each run, a tenth of the resamples), which covers both the run-to-run and the episode-to-episode noise:
    the interval to quote for "a new run of this recipe, evaluated on this many episodes". A single run has no
    interval over runs (None). ``confidence`` in the result is the intervals' nominal coverage; with few runs the
    real one is lower (a bootstrap over n runs sees n-1 over n of their variance): tests/test_stats.py measures
    87.5% for the pooled interval with 4 runs of 15 episodes. So the medians also get ``median_order_interval``'s
    distribution-free interval with its exact coverage (``median_mean_order``, ``median_flag_rate_order``).
    """
    if len(runs) < 1 or len(flags) != len(runs) or any(
            len(r) < 1 or len(r) != len(f) for r, f in zip(runs, flags, strict=True)):
        raise ValueError("across_runs needs one non-empty list of values and one of flags per run, of equal length")
    values = [np.asarray(r, dtype=np.float64) for r in runs]
    rates = [np.mean(np.asarray(f, dtype=bool)) for f in flags]
    scores = np.array([v.mean() for v in values])
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(runs), size=(resamples, len(runs)))
    out: dict[str, Any] = {"runs": len(runs), "episodes": [len(v) for v in values], "run_means": scores.tolist(),
                           "run_flag_rates": [float(r) for r in rates], "confidence": CONFIDENCE}
    for name, per_run in (("mean", scores), ("flag_rate", np.array(rates))):
        boot = per_run[picks]
        for stat, resampled, point in (
                ("median", np.median(boot, axis=1), np.median(per_run)),
                ("iqm", np.array([interquartile_mean(row) for row in boot]), interquartile_mean(per_run))):
            low, high = np.percentile(resampled, _PERCENTILES)
            out[f"{stat}_{name}"] = float(point)  # one run says nothing of the spread between runs: no CI
            out[f"{stat}_{name}_ci"] = [float(low), float(high)] if len(runs) > 1 else None
        order = median_order_interval(per_run)
        out[f"median_{name}_order"] = None if order is None else {"low": order[0], "high": order[1],
                                                                  "coverage": order[2]}
    pooled_x, pooled_flag = [], []
    for row in picks[: max(1, resamples // 10)]:  # two levels cost more: a tenth of the resamples
        xs = [values[i][rng.integers(len(values[i]), size=len(values[i]))] for i in row]
        fs = [np.asarray(flags[i], dtype=bool)[rng.integers(len(values[i]), size=len(values[i]))] for i in row]
        pooled_x.append(np.concatenate(xs).mean())
        pooled_flag.append(np.concatenate(fs).mean())
    out["pooled_mean"] = float(np.concatenate(values).mean())
    out["pooled_mean_ci"] = [float(v) for v in np.percentile(pooled_x, _PERCENTILES)]
    out["pooled_flag_rate"] = float(np.mean(np.concatenate([np.asarray(f, dtype=bool) for f in flags])))
    out["pooled_flag_rate_ci"] = [float(v) for v in np.percentile(pooled_flag, _PERCENTILES)]
    return out


def paired_difference(a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]],
                      a_flags: Sequence[Sequence[bool]], b_flags: Sequence[Sequence[bool]], *,
                      resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """B minus A over paired runs: pair i is A's and B's run of one training seed, and episode j of both played the
    same evaluation seed, so each episode's difference is paired too.

    Per pair: the difference of the run means and of the success rates. Overall: their mean and median over pairs,
    how many pairs B leads and trails, and a 95% two-level paired bootstrap of the mean difference (pairs resampled,
    then the episodes of each picked pair, the same indices for A and B), which covers the seed-to-seed and the
    episode-to-episode noise of the difference. Like ``across_runs``, a bootstrap over n pairs sees n-1 over n of
    their variance, so with 3 pairs its real coverage is below 95% (tests/test_stats.py measures it).
    """
    n = len(a_runs)
    lengths = {len(r) for r in (*a_runs, *b_runs, *a_flags, *b_flags)}
    if n < 1 or len(b_runs) != n or len(a_flags) != n or len(b_flags) != n or len(lengths) != 1 or 0 in lengths:
        raise ValueError("paired_difference needs as many runs of A as of B (and their flags), every run with the "
                         "same number of episodes")
    dx = np.asarray(b_runs, dtype=np.float64) - np.asarray(a_runs, dtype=np.float64)  # pairs x episodes
    dflag = np.asarray(b_flags, dtype=np.float64) - np.asarray(a_flags, dtype=np.float64)
    rng = np.random.default_rng(seed)
    episodes = dx.shape[1]
    out: dict[str, Any] = {"pairs": n, "episodes": episodes, "confidence": CONFIDENCE}
    for name, diff in (("mean", dx), ("flag_rate", dflag)):
        per_pair = diff.mean(axis=1)
        boot = np.empty(resamples)
        for start in range(0, resamples, 1000):  # in blocks: resamples x pairs x episodes indices at once is large
            rows = min(1000, resamples - start)
            pairs = rng.integers(n, size=(rows, n))
            picks = rng.integers(episodes, size=(rows, n, episodes))
            boot[start:start + rows] = diff[pairs[:, :, None], picks].mean(axis=(1, 2))
        out[f"pair_{name}_differences"] = per_pair.tolist()
        out[f"{name}_difference"] = float(per_pair.mean())
        out[f"median_{name}_difference"] = float(np.median(per_pair))
        out[f"{name}_difference_ci"] = [float(v) for v in np.percentile(boot, _PERCENTILES)]
        out[f"{name}_b_ahead"] = int((per_pair > 0).sum())
        out[f"{name}_b_behind"] = int((per_pair < 0).sum())
    return out
