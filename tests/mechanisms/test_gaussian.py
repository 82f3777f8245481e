"""The Gaussian mechanisms: contract battery, the seed blog's variance-as-scale bug ruled out, the
classic calibration and its ε < 1 guard, ρ/μ, and seeded statistical tests of the released noise
(the analytic calibration itself: tests/mechanisms/test_calibration.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpmath import mpf
from scipy import stats

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError
from dpbudget.mechanisms import analytic_gaussian_delta
from dpbudget.mechanisms.gaussian import AnalyticGaussian, Gaussian
from tests.contracts import MechanismContract, _bad
from tests.support import SEED


# -- contract --------------------------------------------------------------------------------------

class TestAnalyticGaussianContract(MechanismContract):
    mechanism_class = AnalyticGaussian
    kwargs = {"epsilon": 1.0, "delta": 1e-5, "sensitivity": 2.0}
    expected_cost = Budget(1.0, 1e-5)
    has_delta = True


class TestGaussianContract(MechanismContract):
    mechanism_class = Gaussian
    kwargs = {"epsilon": 0.5, "delta": 1e-5, "sensitivity": 2.0}
    expected_cost = Budget(0.5, 1e-5)
    has_delta = True
    extra_bad = [
        _bad({"epsilon": 1.0}, InvalidArgumentError, "epsilon", "epsilon-one"),
        _bad({"epsilon": 10.0}, InvalidArgumentError, "epsilon", "epsilon-ten"),
    ]


# -- the seed blog's variance bug ---------------------------------------------------------------

@pytest.mark.statistical
@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-6), (5.0, 1e-3)])
def test_no_variance_as_scale_bug(epsilon: float, delta: float) -> None:
    """The released noise's standard deviation is σ, not σ² (the blog passed the variance to
    ``np.random.normal`` as its scale). Cases with σ ≈ 36 and σ < 1 so σ² is far either way.
    Fixed seed; n = 40000, so the sample sd is within 0.36% of σ (1 s.e.); we allow 2.5% (7 s.e.,
    α < 1e-11)."""
    m = AnalyticGaussian(epsilon, delta=delta, sensitivity=1.0)
    noise = Accountant(None, rng=SEED).release(m, np.zeros(40_000))
    sd = float(np.std(noise, ddof=1))
    assert sd == pytest.approx(m.sigma, rel=0.025)
    assert abs(sd - m.sigma ** 2) > 0.2 * m.sigma
    assert abs(float(np.mean(noise))) < 7 * m.sigma / math.sqrt(noise.size)


# -- classic Gaussian ------------------------------------------------------------------------------

@pytest.mark.parametrize("epsilon", [1.0, 1.5, 10.0, 1e6])
def test_classic_refuses_epsilon_at_least_one(epsilon: float) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Gaussian(epsilon, delta=1e-5, sensitivity=1.0)
    assert info.value.argument == "epsilon"
    assert "AnalyticGaussian" in str(info.value)
    assert repr(epsilon) in str(info.value)


@pytest.mark.parametrize(("epsilon", "delta", "sensitivity"), [
    (0.5, 1e-5, 1.0), (0.999999, 1e-5, 1.0), (0.01, 1e-9, 3.0), (0.1, 0.5, 0.2), (0.3, 1e-12, 1e3),
])
def test_classic_sigma_formula(epsilon: float, delta: float, sensitivity: float) -> None:
    """σ = Δ sqrt(2 ln(1.25/δ))/ε (Dwork–Roth Thm 3.22), never below the exact value."""
    sigma = Gaussian(epsilon, delta=delta, sensitivity=sensitivity).sigma
    with mpmath.workdps(50):
        exact = mpf(sensitivity) * mpmath.sqrt(2 * mpmath.log(mpf(5) / 4 / mpf(delta))) / mpf(
            epsilon)
        assert mpf(sigma) >= exact
        assert mpf(sigma) <= exact * (1 + mpf("1e-14"))


def test_classic_at_eps_below_one_is_valid_and_noisier_than_analytic() -> None:
    for eps in [0.05, 0.5, 0.9]:
        classic = Gaussian(eps, delta=1e-5, sensitivity=1.0).sigma
        assert analytic_gaussian_delta(classic, eps) <= 1e-5
        assert classic >= AnalyticGaussian(eps, delta=1e-5, sensitivity=1.0).sigma


def test_why_classic_is_refused_at_eps_ten() -> None:
    """docs/theory.md §3: at ε = 10 the classic σ would leak δ ≈ 2.27e-5 > 1e-5."""
    sigma = math.sqrt(2 * math.log(1.25 / 1e-5)) / 10
    assert analytic_gaussian_delta(sigma, 10.0) == pytest.approx(2.27e-5, rel=0.01)


# -- rho and mu ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: AnalyticGaussian(1.0, delta=1e-5, sensitivity=2.0), lambda: Gaussian(0.5, delta=1e-6, sensitivity=0.3),
    lambda: AnalyticGaussian(0.05, delta=1e-9, sensitivity=7.0),
])
def test_rho_and_mu_declared_on_the_safe_side(make) -> None:
    m = make()
    assert m.noise == "exact" and m.mu is None and m.charge.mu is None  # no provable GDP
    exact_rho = m.rho
    m = type(m)(m.epsilon, delta=m.delta, sensitivity=m.sensitivity, noise="float")
    assert m.rho == exact_rho
    s, d = Fraction(m.sigma), Fraction(m.sensitivity)
    assert m.rho is not None and m.mu is not None
    assert Fraction(m.rho) >= d * d / (2 * s * s)  # ρ = Δ²/(2σ²), Bun–Steinke Prop 1.6
    assert m.rho == pytest.approx(m.sensitivity ** 2 / (2 * m.sigma ** 2), rel=1e-15)
    assert Fraction(m.mu) >= d / s  # μ = Δ/σ, Dong–Roth–Su Thm 2.7
    assert m.mu == pytest.approx(m.sensitivity / m.sigma, rel=1e-15)
    assert m.charge.rho == m.rho and m.charge.mu == m.mu
    assert m.params()["sigma"] == m.sigma


@settings(max_examples=200, deadline=None)
@given(sens=st.floats(1e-3, 1e3), sigma_factor=st.floats(0.01, 1e4))
def test_rho_never_below_exact(sens: float, sigma_factor: float) -> None:
    m = AnalyticGaussian(1.0, delta=1e-5, sensitivity=sens, noise="float")
    object.__setattr__(m, "sigma", sens * sigma_factor)  # exercise the formula at many σ
    s, d = Fraction(m.sigma), Fraction(m.sensitivity)
    assert Fraction(m.rho) >= d * d / (2 * s * s)
    assert Fraction(m.mu) >= d / s


# -- statistical tests of the noise ----------------------------------------------------------------

def ks_pvalue(noise: np.ndarray, sigma: float) -> float:
    """Kolmogorov–Smirnov p-value of the sample against N(0, σ²)."""
    return float(stats.kstest(np.ravel(noise), stats.norm(scale=sigma).cdf).pvalue)


N = 20_000


@pytest.mark.statistical
@pytest.mark.parametrize("cls, kwargs", [
    (AnalyticGaussian, {"epsilon": 1.0, "delta": 1e-5}),
    (Gaussian, {"epsilon": 0.5, "delta": 1e-6}),
])
def test_noise_is_normal_with_sigma(cls, kwargs) -> None:
    alpha = 1e-6  # stated significance; the seed is fixed, so the outcome is deterministic
    m = cls(**kwargs, sensitivity=2.0)
    noise = Accountant(None, rng=SEED).release(m, np.zeros(N))
    assert ks_pvalue(noise, m.sigma) >= alpha


@pytest.mark.statistical
@pytest.mark.parametrize("factor", [0.7, 1.3])
@pytest.mark.parametrize("cls, kwargs", [
    (AnalyticGaussian, {"epsilon": 1.0, "delta": 1e-5}),
    (Gaussian, {"epsilon": 0.5, "delta": 1e-6}),
])
def test_power_check_rejects_wrong_scale(cls, kwargs, factor: float) -> None:
    """Test the test: noise from a mis-calibrated mechanism (σ scaled by 0.7 or 1.3, via the
    sensitivity) must fail the same KS test against the right σ. Both sides are separate cases."""
    alpha = 1e-6
    right = cls(**kwargs, sensitivity=2.0)
    wrong = cls(**kwargs, sensitivity=2.0 * factor)
    assert wrong.sigma == pytest.approx(factor * right.sigma, rel=1e-9)
    noise = Accountant(None, rng=SEED).release(wrong, np.zeros(N))
    assert ks_pvalue(noise, right.sigma) < alpha
