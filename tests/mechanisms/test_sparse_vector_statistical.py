"""Every noise draw of the sparse-vector family, checked against its claimed law (α = 1e-6, with
0.7×/1.3× power checks). Streams are opened exactly as ``Accountant.session`` opens them after the
debit (``mechanism._open(sampler)``), from a seeded generator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from tests.mechanisms.stat_checks import binom_with_power, ks_with_power, laplace_cdf

from dpbudget import accountant  # noqa: F401  (import order: the accountant package first)
from dpbudget.mechanisms import AboveThreshold, NumericSparse, Sampler, Sparse

pytestmark = pytest.mark.statistical
N = 20_000


def sampler(seed: int) -> Sampler:
    return Sampler(np.random.default_rng(seed))


def grid_step(mechanism) -> float:
    """Exact streams hold their noise in grid steps (integers); float streams in real units."""
    return mechanism._g if mechanism.noise == "exact" else 1.0


def threshold_noise(stream, mechanism) -> float:
    """ρ in real units: the noisy threshold less the (rounded) public threshold."""
    if mechanism.noise == "exact":
        g = mechanism._g
        return (stream._noisy_threshold - round(mechanism.threshold / g)) * g
    return stream._noisy_threshold - mechanism.threshold


@pytest.mark.parametrize("mechanism", [
    AboveThreshold(epsilon=0.5, threshold=10.0, sensitivity=2.0),
    Sparse(epsilon=1.0, threshold=0.0, max_positives=5, sensitivity=1.0),
    Sparse(epsilon=1.0, threshold=0.0, max_positives=5, monotonic=True, sensitivity=1.0),
], ids=["above-threshold", "sparse", "sparse-monotonic"])
def test_threshold_noise_is_laplace_drawn_once_per_session(mechanism):
    s = sampler(101)
    rho = np.array([threshold_noise(mechanism._open(s), mechanism) for _ in range(N)])
    ks_with_power(rho, laplace_cdf, mechanism.threshold_scale)


@pytest.mark.parametrize("mechanism", [
    AboveThreshold(epsilon=0.5, threshold=10.0, sensitivity=2.0),
    Sparse(epsilon=1.0, threshold=0.0, max_positives=5, sensitivity=1.0),
    Sparse(epsilon=1.0, threshold=0.0, max_positives=5, monotonic=True, sensitivity=1.0),
], ids=["above-threshold", "sparse", "sparse-monotonic"])
def test_query_noise_is_laplace_with_c(mechanism):
    stream = mechanism._open(sampler(202))
    nu = np.array([next(stream._noise) for _ in range(N)]) * grid_step(mechanism)
    c, eps2, delta = mechanism.max_positives, mechanism.epsilon_queries, mechanism.sensitivity
    expected = (c if mechanism.monotonic else 2 * c) * delta / eps2
    assert mechanism.query_scale == pytest.approx(expected, rel=1e-9)
    ks_with_power(nu, laplace_cdf, expected)
    # successive draws are independent (lag-1 correlation ~ N(0, 1/N))
    assert abs(np.corrcoef(nu[:-1], nu[1:])[0, 1]) < 5.0 / math.sqrt(N)


def test_numeric_answers_carry_fresh_laplace_noise():
    m = NumericSparse(epsilon=1.0, threshold=-1e12, max_positives=N, sensitivity=1.0)
    stream = m._open(sampler(303))
    noise = np.array([stream.query(0.0) for _ in range(N)])
    ks_with_power(noise, laplace_cdf, m.answer_scale)
    assert m.answer_scale == pytest.approx(N / m.epsilon_answers, rel=1e-9)


def _tail_of_laplace_difference(t: float, a: float, b: float) -> float:
    """P(ν − ρ ≥ t) for ν ~ Lap(a), ρ ~ Lap(b), a ≠ b, t ≥ 0:
    (a²e^{−t/a} − b²e^{−t/b}) / (2(a² − b²))."""
    return (a * a * math.exp(-t / a) - b * b * math.exp(-t / b)) / (2 * (a * a - b * b))


def test_first_answer_probability_end_to_end():
    """Through the public ``test``: P(⊤ on the first query) for AboveThreshold, exact binomial."""
    m = AboveThreshold(epsilon=1.0, threshold=0.0, sensitivity=1.0)
    s, n, q = sampler(404), 100_000, -3.0
    hits = sum(m._open(s).test(q) for _ in range(n))
    binom_with_power(hits, n, lambda f: _tail_of_laplace_difference(-q, 4.0 * f, 2.0 * f), 1.0)


def test_accuracy_bound_holds_empirically():
    """Sparse.accuracy(k, β): the noises exceed it with probability ≤ β (one-sided binomial)."""
    m, k, beta, n = Sparse(epsilon=1.0, threshold=0.0, max_positives=3, sensitivity=1.0), 50, 0.2, 4_000
    alpha, s = m.accuracy(k, beta), sampler(505)
    failures = 0
    for _ in range(n):
        stream = m._open(s)
        worst = max(abs(next(stream._noise)) for _ in range(k)) * grid_step(m)
        failures += abs(threshold_noise(stream, m)) + worst > alpha
    assert stats.binomtest(failures, n, beta, alternative="greater").pvalue > 1e-6
