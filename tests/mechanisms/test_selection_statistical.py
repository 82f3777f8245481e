"""The selection mechanisms' output laws (α = 1e-6, χ² with 0.7×/1.3× power checks). Draws go
through ``mechanism.draw`` — the code ``Accountant.release`` runs after the debit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats
from tests.mechanisms.stat_checks import chi2_with_power, ks_with_power

from dpbudget import accountant  # noqa: F401  (import order: the accountant package first)
from dpbudget.mechanisms import (
    Exponential,
    PermuteAndFlip,
    RandomizedResponse,
    ReportNoisyMax,
    Sampler,
)

pytestmark = pytest.mark.statistical
N = 100_000
SCORES = np.array([0.0, 1.0, 2.0, 4.0])


def counts_of(mechanism, value, n=N, seed=7):
    s = Sampler(np.random.default_rng(seed))
    prepared = mechanism.prepare(value)
    index = {c: i for i, c in enumerate(getattr(mechanism, "candidates", None)
                                         or mechanism.categories)}
    out = np.zeros(len(index))
    for _ in range(n):
        out[index[mechanism.draw(prepared, s)]] += 1
    return out


def argmax_probs(scores: np.ndarray, dist) -> np.ndarray:
    """P(argmax_i s_i + X_i = j) for i.i.d. X_i ~ dist, by quadrature."""
    probs = []
    for j, sj in enumerate(scores):
        others = np.delete(scores, j)
        f = lambda x: dist.pdf(x - sj) * np.prod(dist.cdf(x - others))  # noqa: E731
        lo, hi = dist.ppf(1e-15) + scores.min(), dist.isf(1e-15) + scores.max()
        probs.append(integrate.quad(f, lo, hi, limit=400, points=list(scores))[0])
    return np.array(probs)


def test_exponential_mechanism_law():
    m = Exponential(epsilon=1.0, candidates=["a", "b", "c", "d"], sensitivity=1.0)  # scale 2Δ/ε = 2
    assert m.scale == pytest.approx(2.0, rel=1e-9)

    def softmax(scale):
        w = np.exp(SCORES / scale)
        return w / w.sum()

    counts = counts_of(m, SCORES)
    chi2_with_power(counts, softmax, 2.0)
    # Gumbel-max equals the exponential mechanism's closed form
    np.testing.assert_allclose(argmax_probs(SCORES, stats.gumbel_r(scale=2.0)), softmax(2.0),
                               rtol=1e-6)


def test_exponential_monotonic_uses_epsilon_over_delta():
    m = Exponential(epsilon=1.0, candidates=["a", "b", "c", "d"], monotonic=True, sensitivity=1.0)
    assert m.scale == pytest.approx(1.0, rel=1e-9)
    chi2_with_power(counts_of(m, SCORES, seed=8),
                    lambda s: np.exp(SCORES / s) / np.exp(SCORES / s).sum(), 1.0)


def test_report_noisy_max_law():
    m = ReportNoisyMax(epsilon=1.0, candidates=["a", "b", "c", "d"], sensitivity=1.0)  # Lap(2Δ/ε)
    chi2_with_power(counts_of(m, SCORES, seed=9),
                    lambda s: argmax_probs(SCORES, stats.laplace(scale=s)), 2.0)


def test_permute_and_flip_law():
    m = PermuteAndFlip(epsilon=1.0, candidates=["a", "b", "c", "d"], sensitivity=1.0)  # Exp(2Δ/ε)
    chi2_with_power(counts_of(m, SCORES, seed=10),
                    lambda s: argmax_probs(SCORES, stats.expon(scale=s)), 2.0)


def test_permute_and_flip_matches_mckenna_sheldon_closed_form():
    """McKenna–Sheldon 2020: PF's probabilities computed from the permute-and-flip procedure
    itself (exhaustive over permutations) agree with RNM-with-exponential-noise."""
    from itertools import permutations
    eps, q = 1.0, SCORES
    flip = np.exp(eps / 2 * (q - q.max()))
    exact = np.zeros(len(q))
    perms = list(permutations(range(len(q))))
    for perm in perms:
        stay = 1.0
        for r in perm:
            exact[r] += stay * flip[r] / len(perms)
            stay *= 1 - flip[r]
    np.testing.assert_allclose(argmax_probs(q, stats.expon(scale=2 / eps)), exact, rtol=1e-6)


@pytest.mark.parametrize("k", [2, 5])
def test_randomized_response_law(k):
    m = RandomizedResponse(epsilon=1.0, categories=[f"c{i}" for i in range(k)])
    truth = 1

    def law(eps):
        p = math.exp(eps) / (math.exp(eps) + k - 1)
        out = np.full(k, (1 - p) / (k - 1))
        out[truth] = p
        return out

    counts = counts_of(m, "c1", seed=11 + k)
    chi2_with_power(counts, law, 1.0)


def test_uniform_index_is_uniform():
    s = Sampler(np.random.default_rng(12))
    counts = np.bincount([s.index(7) for _ in range(70_000)], minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-6
    tilted = np.full(7, 1 / 7) * np.array([1.3, 1, 1, 1, 1, 1, 0.7])
    assert stats.chisquare(counts, 70_000 * tilted).pvalue < 1e-6


def test_selection_noise_draws_have_the_declared_scale():
    """The raw noise each selector adds, sampled as it draws it, against its law."""
    s = Sampler(np.random.default_rng(13))
    n = 20_000
    for cls, cdf in ((Exponential, lambda x, b: stats.gumbel_r.cdf(x, scale=b)),
                     (ReportNoisyMax, lambda x, b: stats.laplace.cdf(x, scale=b)),
                     (PermuteAndFlip, lambda x, b: stats.expon.cdf(x, scale=b))):
        m = cls(epsilon=0.5, candidates=range(n), sensitivity=1.5)
        ks_with_power(m._noise(s, n), cdf, 6.0)
