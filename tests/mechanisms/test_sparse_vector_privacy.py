"""Empirical privacy of Sparse (docs/theory.md §5): on neighbouring query streams, a Clopper–Pearson
lower bound on ln(P[S | x] / P[S | x']) stays under the declared ε for our Sparse, and exceeds it
for the broken variant without c in the query noise, built here in the test.

Neighbours (sensitivity Δ = 1 per query): x answers every query with 0; x' shifts the first m
answers up by Δ and the last c down by Δ — the direction that no single threshold shift can absorb,
which is where the c in the query noise is needed (Lyu–Su–Li 2017). S is the output pattern
⊥^m ⊤^c. Our sessions run the real stream code (``mechanism._open``, as ``Accountant.session``
does after the debit); the broken variant is a vectorized numpy simulation of Alg. 1 with query
noise Lap(2Δ/ε₂). Quadrature of the exact pattern probability checks both against Alg. 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats
from tests.mechanisms.stat_checks import ALPHA, epsilon_lower_bound

from dpbudget import accountant  # noqa: F401  (import order: the accountant package first)
from dpbudget.mechanisms import Sampler, Sparse

pytestmark = pytest.mark.statistical

EPS, C, M, T = 1.0, 3, 3, 0.0
X = np.zeros(M + C)
X_PRIME = np.concatenate([np.full(M, 1.0), np.full(C, -1.0)])
PATTERN = np.array([False] * M + [True] * C)


def pattern_probability(queries: np.ndarray, b_t: float, b_q: float) -> float:
    """P(⊥^m ⊤^c) under Lyu–Su–Li Alg. 1 with threshold scale b_t and query scale b_q, exactly
    (one-dimensional quadrature over the threshold noise)."""
    def integrand(r):
        cdf = stats.laplace.cdf(T + r - queries, scale=b_q)
        return stats.laplace.pdf(r, scale=b_t) * np.prod(cdf[:M]) * np.prod(1 - cdf[M:])
    return integrate.quad(integrand, -80 * b_t, 80 * b_t, limit=500, points=[0.0])[0]


def hits_real_sessions(mechanism: Sparse, queries: np.ndarray, n: int, seed: int) -> int:
    sampler = Sampler(np.random.default_rng(seed))
    qs, target = [float(q) for q in queries], [False] * M + [True] * C
    hits = 0
    for _ in range(n):
        stream, answers = mechanism._open(sampler), []
        for q in qs:  # ask until the stream halts at its cutoff
            answers.append(stream.test(q))
            if stream.positives == mechanism.max_positives:
                break
        hits += answers == target
    return hits


def hits_simulated(queries: np.ndarray, b_t: float, b_q: float, n: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    rho = rng.laplace(0.0, b_t, size=(n, 1))
    nu = rng.laplace(0.0, b_q, size=(n, queries.size))
    # the pattern has exactly c ⊤, all at the end, so the cutoff does not change whether it occurs
    return int(((queries + nu >= T + rho) == PATTERN).all(axis=1).sum())


@pytest.fixture(scope="module")
def ours():
    return Sparse(epsilon=EPS, threshold=T, max_positives=C, sensitivity=1.0)


def test_our_sparse_stays_under_its_epsilon(ours):
    n = 100_000
    k_x = hits_real_sessions(ours, X, n, seed=1)
    k_y = hits_real_sessions(ours, X_PRIME, n, seed=2)
    bound = epsilon_lower_bound(k_x, k_y, n)
    assert bound < EPS, (k_x, k_y, bound)
    assert bound > 0.0  # the event does separate the neighbours: the test is not vacuous
    # and the real stream has Alg. 1's law (exact binomial against quadrature)
    for k, queries in ((k_x, X), (k_y, X_PRIME)):
        p = pattern_probability(queries, ours.threshold_scale, ours.query_scale)
        assert stats.binomtest(k, n, p).pvalue > ALPHA


def test_broken_variant_without_c_exceeds_epsilon(ours):
    n = 1_000_000
    b_t, b_q = ours.threshold_scale, 2.0 * 1.0 / ours.epsilon_queries  # no c: the bug
    k_x = hits_simulated(X, b_t, b_q, n, seed=3)
    k_y = hits_simulated(X_PRIME, b_t, b_q, n, seed=4)
    bound = epsilon_lower_bound(k_x, k_y, n)
    assert bound > EPS, (k_x, k_y, bound)
    for k, queries in ((k_x, X), (k_y, X_PRIME)):
        assert stats.binomtest(k, n, pattern_probability(queries, b_t, b_q)).pvalue > ALPHA


def test_simulation_with_our_scales_also_stays_under(ours):
    """The same vectorized simulator, given the scales our Sparse declares, agrees (so the only
    difference in the broken run is the missing c)."""
    n = 1_000_000
    k_x = hits_simulated(X, ours.threshold_scale, ours.query_scale, n, seed=5)
    k_y = hits_simulated(X_PRIME, ours.threshold_scale, ours.query_scale, n, seed=6)
    assert 0.0 < epsilon_lower_bound(k_x, k_y, n) < EPS
