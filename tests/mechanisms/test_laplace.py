"""The Laplace mechanism: contract battery, the scale b = Δ₁/ε rounded up, and seeded statistical
tests of the released noise with a power check on both sides."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms.laplace import Laplace
from tests.contracts import MechanismContract
from tests.support import SEED


class TestLaplaceContract(MechanismContract):
    mechanism_class = Laplace
    kwargs = {"epsilon": 0.5, "sensitivity": 2.0}
    expected_cost = Budget(0.5)


def test_scale_and_cost() -> None:
    m = Laplace(epsilon=0.5, sensitivity=2.0)
    assert m.scale == pytest.approx(4.0, rel=1e-15) and m.scale >= 4.0
    assert m.cost == Budget(0.5, 0.0)
    assert m.rho is None and m.mu is None
    assert Laplace(0.25, sensitivity=1.0).sensitivity == 1.0  # the documented default
    assert m.params() == {"epsilon": 0.5, "sensitivity": 2.0, "scale": m.scale, "noise": "exact"}


@settings(max_examples=300, deadline=None)
@given(epsilon=st.floats(1e-6, 1e6), sensitivity=st.floats(1e-6, 1e6))
def test_scale_never_below_exact(epsilon: float, sensitivity: float) -> None:
    """b = Δ₁/ε, rounded up: never below the exact quotient, at most 2 ulp above it."""
    scale = Laplace(epsilon, sensitivity=sensitivity).scale
    exact = Fraction(sensitivity) / Fraction(epsilon)
    assert Fraction(scale) >= exact
    assert Fraction(scale) <= exact * (1 + Fraction(1, 2 ** 51))


def ks_pvalue(noise: np.ndarray, scale: float) -> float:
    """Kolmogorov–Smirnov p-value of the sample against Laplace(0, scale)."""
    return float(stats.kstest(np.ravel(noise), stats.laplace(scale=scale).cdf).pvalue)


N = 20_000


@pytest.mark.statistical
@pytest.mark.parametrize("shape", [(N,), (100, 200)])
def test_noise_is_laplace_with_scale(shape: tuple[int, ...]) -> None:
    alpha = 1e-6  # stated significance; the seed is fixed, so the outcome is deterministic
    m = Laplace(epsilon=0.5, sensitivity=2.0)
    noise = Accountant(None, rng=SEED).release(m, np.zeros(shape))
    assert ks_pvalue(noise, m.scale) >= alpha


@pytest.mark.statistical
def test_scalar_releases_are_laplace() -> None:
    """The scalar path (one draw per release) gives the same distribution as the vector path."""
    alpha = 1e-6
    m = Laplace(epsilon=2.0, sensitivity=1.0)
    acc = Accountant(None, rng=SEED)
    noise = np.array([acc.release(m, 0.0) for _ in range(5_000)])
    assert ks_pvalue(noise, m.scale) >= alpha


@pytest.mark.statistical
@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_power_check_rejects_wrong_scale(factor: float) -> None:
    """Test the test: noise from a mis-calibrated Laplace (scale × 0.7 or × 1.3) fails the same KS
    test against the right scale. Each side is its own case, so neither can be skipped silently."""
    alpha = 1e-6
    right = Laplace(epsilon=0.5, sensitivity=2.0)
    wrong = Laplace(epsilon=0.5, sensitivity=2.0 * factor)
    assert wrong.scale == pytest.approx(factor * right.scale)
    noise = Accountant(None, rng=SEED).release(wrong, np.zeros(N))
    assert ks_pvalue(noise, right.scale) < alpha


@pytest.mark.statistical
def test_noise_symmetric_and_independent_of_value() -> None:
    """Noise does not depend on the true value: releases of 0 and of 1e6 with the same seed
    differ by exactly the value."""
    m = Laplace(epsilon=1.0, sensitivity=1.0)
    a = Accountant(None, rng=SEED).release(m, np.zeros(1000))
    b = Accountant(None, rng=SEED).release(m, np.full(1000, 1e6))
    np.testing.assert_allclose(b - 1e6, a, atol=1e-9)
    # sign balance: exact binomial test at alpha = 1e-6
    alpha = 1e-6
    noise = Accountant(None, rng=SEED + 1).release(m, np.zeros(N))
    assert stats.binomtest(int((noise > 0).sum()), N).pvalue >= alpha
