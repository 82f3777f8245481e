"""Shared statistical checks (docs/theory.md §5): a fixed α, and a power check on every test.

Each check asserts that the test *accepts* the distribution the mechanism claims (p-value > ALPHA)
and *rejects* the same family at 0.7× and 1.3× the parameter (p-value < ALPHA), so a pass is
evidence about the scale, not just a test too weak to notice.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import stats

ALPHA = 1e-6
WRONG = (0.7, 1.3)


def ks_with_power(samples: np.ndarray, cdf: Callable[[np.ndarray, float], np.ndarray],
                  scale: float) -> dict[float, float]:
    """KS test of ``samples`` against ``cdf(x, scale)``; returns the p-value per factor."""
    p = {f: stats.kstest(samples, lambda x, s=f * scale: cdf(x, s)).pvalue for f in (1.0, *WRONG)}
    assert p[1.0] > ALPHA, p
    assert all(p[f] < ALPHA for f in WRONG), p
    return p


def chi2_with_power(counts: np.ndarray, probs: Callable[[float], np.ndarray],
                    parameter: float) -> dict[float, float]:
    """χ² goodness of fit of ``counts`` against ``probs(parameter)``, with the power check."""
    n = counts.sum()
    p = {f: stats.chisquare(counts, n * probs(f * parameter)).pvalue for f in (1.0, *WRONG)}
    assert p[1.0] > ALPHA, p
    assert all(p[f] < ALPHA for f in WRONG), p
    return p


def binom_with_power(k: int, n: int, prob: Callable[[float], float],
                     parameter: float) -> dict[float, float]:
    """Exact two-sided binomial test of k successes in n against ``prob(parameter)``."""
    p = {f: stats.binomtest(k, n, prob(f * parameter)).pvalue for f in (1.0, *WRONG)}
    assert p[1.0] > ALPHA, p
    assert all(p[f] < ALPHA for f in WRONG), p
    return p


def laplace_cdf(x: np.ndarray, scale: float) -> np.ndarray:
    return stats.laplace.cdf(x, scale=scale)


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided exact (Clopper–Pearson 1934) interval for a binomial proportion, level 1 − α."""
    lo = 0.0 if k == 0 else stats.beta.ppf(alpha / 2, k, n - k + 1)
    hi = 1.0 if k == n else stats.beta.ppf(1 - alpha / 2, k + 1, n - k)
    return float(lo), float(hi)


def epsilon_lower_bound(k_x: int, k_y: int, n: int, alpha: float = ALPHA) -> float:
    """A lower confidence bound on ln(P[M(x) ∈ S] / P[M(x') ∈ S]) from k_x and k_y hits in n runs
    each: ln(CP lower of p_x) − ln(CP upper of p_y), valid with probability ≥ 1 − α."""
    lo, _ = clopper_pearson(k_x, n, alpha)
    _, hi = clopper_pearson(k_y, n, alpha)
    return float(np.log(lo) - np.log(hi))
