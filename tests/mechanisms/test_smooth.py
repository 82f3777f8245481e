"""``SmoothSensitivity``: the smooth bound against its definition by brute force (an upper bound,
tight to rounding), the noise law (KS, α = 1e-6, power check; the scale S/ε — noise not doubled —
as negative control), the exact fractional-bit sampler's law, the declared (ε, δ) debited, bad
input typed and nothing drawn."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError
from dpbudget.mechanisms import SmoothSensitivity, smooth_sensitivity
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.smooth import _fraction_bit, _round_noisy, beta_for
from tests.mechanisms.stat_checks import ALPHA, ks_with_power, laplace_cdf

GRID = (0.0, 2.5, 5.0, 7.5, 10.0)


def _stat(y: tuple[float, ...], m: int) -> float:
    return sorted(y)[m - 1]


def _local(y: tuple[float, ...], m: int) -> float:
    """LS of the m-th order statistic under replace-one, values in [0, 10] (extremes suffice)."""
    base = _stat(y, m)
    return max(abs(_stat(y[:i] + (r,) + y[i + 1:], m) - base)
               for i in range(len(y)) for r in (0.0, 10.0))


def _distance(x: tuple[float, ...], y: tuple[float, ...]) -> int:
    return len(x) - sum((Counter(x) & Counter(y)).values())


@pytest.mark.parametrize("m", [1, 2, 3])
def test_smooth_bound_against_its_definition(m: int) -> None:
    """S*_β(x) = max_y LS(y)·e^{−β d(x, y)} over every dataset y of 5 values on a grid holding
    the extremes (where the worst cases lie), for several x."""
    beta = 0.3
    everything = {tuple(sorted(y)) for y in itertools.product(GRID, repeat=5)}
    local = {y: _local(y, m) for y in everything}
    rng = np.random.default_rng(m)
    for _ in range(8):
        x = tuple(sorted(float(v) for v in rng.choice(GRID, 5)))
        truth = max(local[y] * math.exp(-beta * _distance(x, y)) for y in everything)
        ours = smooth_sensitivity(np.array(x), m, beta, 0.0, 10.0)
        assert truth <= ours <= truth * (1 + 1e-12) + 1e-300, (x, truth, ours)


def test_noise_is_laplace_of_scale_two_s_over_epsilon() -> None:
    """The released value is round(x_m + (2S/ε)·Z) on the public grid, Z ~ Lap(1): ``draw`` is
    that computation (checked on a few seeds), and its law is checked on the exact sampler
    directly (the smooth bound itself is checked against its definition above)."""
    x = np.random.default_rng(5).normal(50, 1, 601)
    epsilon = 0.5  # (not 1: a scale missing its /ε would pass at ε = 1)
    m = SmoothSensitivity(epsilon, delta=1e-6, lower=0.0, upper=100.0)
    prepared = m.prepare(x)
    centre = Fraction(float(prepared[m.index(x.size) - 1]))
    s = smooth_sensitivity(prepared, m.index(x.size), m.beta, 0.0, 100.0)
    assert m.beta == pytest.approx(beta_for(epsilon, 1e-6), abs=1e-10)
    scale = Fraction(s) * 2 / Fraction(epsilon)
    for seed in range(3):
        expected = _round_noisy(Sampler(seed).bits, centre, scale, Fraction(m.grid))
        assert m.draw(prepared, Sampler(seed)) == min(max(expected, 0.0), 100.0)
    bits = Sampler(6).bits
    noise = np.array([_round_noisy(bits, centre, scale, Fraction(m.grid)) for _ in range(8000)])
    noise -= float(centre)
    ks_with_power(noise, laplace_cdf, 2 * s / epsilon)
    assert stats.kstest(noise, lambda z: laplace_cdf(z, s / epsilon)).pvalue < ALPHA  # S/ε


@pytest.mark.parametrize("j", [1, 2, 5])
def test_fractional_bits_of_the_exponential(j: int) -> None:
    """P[bit j = 1] = 1/(1 + e^{2^−j}) (exact binomial test, α = 1e-6, with a power check)."""
    sampler, n = Sampler(7 + j), 40_000
    k = sum(_fraction_bit(sampler.bits, j) for _ in range(n))
    p = 1 / (1 + math.exp(2.0 ** -j))
    assert stats.binomtest(k, n, p).pvalue > ALPHA
    assert stats.binomtest(k, n, p + 0.02).pvalue < ALPHA  # power: a law 0.02 off is seen


def test_the_declared_cost_is_debited_and_the_answer_is_in_range() -> None:
    acc = Accountant(Budget(1.0, 1e-5), rng=8)
    answer = acc.release(SmoothSensitivity(0.5, delta=1e-6, lower=0.0, upper=10.0, q=0.25), [1.0, 2.0, 9.0] * 50)
    assert 0.0 <= answer <= 10.0
    assert acc.spent() == Budget(0.5, 1e-6)
    record = [e.record for e in acc.ledger.entries() if e.record["kind"] == "release"][0]
    assert record["mechanism"]["params"]["q"] == 0.25 and "9.0" not in str(record["accounts"])


def test_the_order_statistic_is_exact() -> None:
    # The double 0.1 is a hair above 1/10 (so ⌈q·10⌉ = 2), the double 0.3 a hair below 3/10.
    assert SmoothSensitivity(1.0, delta=1e-6, lower=0.0, upper=1.0, q=0.1).index(10) == 2
    assert SmoothSensitivity(1.0, delta=1e-6, lower=0.0, upper=1.0, q=0.3).index(10) == 3


def test_large_constant_data_is_fast_and_exact_enough() -> None:
    acc = Accountant(None, rng=9)
    assert acc.release(SmoothSensitivity(1.0, delta=1e-6, lower=0.0, upper=100.0), np.full(200_000, 50.0)) == 50.0


@pytest.mark.parametrize("kwargs, argument", [
    ({"delta": 0.0}, "delta"), ({"q": 2.0}, "q"), ({"lower": 3.0, "upper": 1.0}, "upper"),
    ({"epsilon": 1e-15}, "epsilon"), ({"lower": -1e308, "upper": 1e308}, "upper"),
])
def test_bad_constructions_are_typed(kwargs: dict[str, Any], argument: str) -> None:
    params: dict[str, Any] = {"epsilon": 1.0, "delta": 1e-6, "lower": 0.0, "upper": 10.0,
                              **kwargs}
    with pytest.raises(InvalidArgumentError) as caught:
        SmoothSensitivity(**params)
    assert caught.value.argument == argument



def _reference(x: np.ndarray, m: int, beta: float, lower: float, upper: float) -> float:
    """max_k e^{−kβ} A^(k) straight from the formula, every k from 0 to n (O(n²))."""
    padded = np.concatenate([np.full(x.size + 2, lower), x, np.full(x.size + 2, upper)])
    centre = m - 1 + x.size + 2  # padded[centre] = x_m
    best = 0.0
    for k in range(x.size + 1):
        gaps = padded[centre:centre + k + 2] - padded[centre - k - 1:centre + 1]
        best = max(best, math.exp(-k * beta) * float(gaps.max()))
    return best


@pytest.mark.parametrize("shape", ["uniform", "clusters", "ties", "skewed"])
@pytest.mark.parametrize("beta", [0.002, 0.05])
def test_divide_and_conquer_matches_the_formula_on_larger_data(shape: str, beta: float) -> None:
    """At n = 2,000 the fast path divides (the brute-force test above is small enough to be
    scanned whole): it must agree with the formula, for several order statistics."""
    rng = np.random.default_rng(len(shape))
    x = {"uniform": rng.uniform(0, 100, 2000),
         "clusters": np.r_[rng.normal(20, 1, 1000), rng.normal(80, 1, 1000)].clip(0, 100),
         "ties": rng.integers(0, 20, 2000).astype(float) * 5,
         "skewed": rng.exponential(3, 2000).clip(0, 100)}[shape]
    x = np.sort(x)
    for m in (1, 500, 1000, 1001, 1999, 2000):
        truth = _reference(x, m, beta, 0.0, 100.0)
        ours = smooth_sensitivity(x, m, beta, 0.0, 100.0)
        assert truth <= ours <= truth * (1 + 1e-11) + 1e-300, (m, truth, ours)
