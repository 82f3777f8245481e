"""The Rényi curves (dpbudget.accountant.values.rdp): THEORY vectors, dp-accounting as an oracle, and each bound
checked against the exact divergence computed independently at high precision (mpmath)."""

from __future__ import annotations

import math

import mpmath
import pytest

from dpbudget.accountant.values import rdp

dp_rdp = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")

# THEORY §4b (dp-accounting 0.6.0): Poisson-subsampled Gaussian, q = 0.01, σ = 1.
VECTORS = [(2, 1.7181342207e-4), (8, 8.936439076e-4), (32, 11.246275937)]


@pytest.mark.parametrize(("alpha", "expected"), VECTORS)
def test_theory_vectors(alpha: int, expected: float) -> None:
    assert rdp.poisson_gaussian(0.01, 1.0, alpha) == pytest.approx(expected, rel=1e-9)
    assert rdp.poisson_gaussian(0.01, 1.0, alpha) >= expected * (1 - 1e-10)  # never below


@pytest.mark.parametrize("q", [1e-4, 0.001, 0.01, 0.1, 0.5])
@pytest.mark.parametrize("z", [0.5, 0.8, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("alpha", [2, 3, 5, 8, 16, 32, 64])
def test_subsampled_gaussian_matches_dp_accounting(q: float, z: float, alpha: int) -> None:
    ours = rdp.poisson_gaussian(q, z, alpha)
    theirs = float(dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, z, [alpha])[0])
    assert ours >= theirs * (1 - 1e-12)  # the safe side
    assert ours == pytest.approx(min(theirs, alpha / (2 * z * z)), rel=1e-9, abs=1e-13)


@pytest.mark.parametrize("alpha", [1.5, 2.7, 6.73, 9.5, 20.25])
def test_fractional_orders_bound_the_exact_value(alpha: float) -> None:
    """Interpolating log A between integers (any zCDP base: exact noise) is above the true value
    by convexity; the continuous Gaussian's fractional series with its tail bound is above it
    and tight (checked against mpmath integration below)."""
    exact = float(dp_rdp._compute_rdp_poisson_subsampled_gaussian(0.01, 1.0, [alpha])[0])
    assert rdp.poisson_zcdp(0.01, 1.0, alpha) >= exact
    assert rdp.poisson_gaussian(0.01, 1.0, alpha) == pytest.approx(exact, rel=1e-4)


@pytest.mark.parametrize(("q", "z", "alpha"), [
    (0.01, 1.0, 6.73), (0.1, 1.0, 3.3), (0.001, 0.8, 10.5), (0.05, 2.0, 4.4), (0.3, 1.5, 2.2),
    (0.01, 0.6, 5.5), (0.2, 0.9, 8.8),
])
def test_fractional_series_with_its_tail_bound_is_above_the_true_divergence(
        q: float, z: float, alpha: float) -> None:
    true = _mp_gaussian_mixture(q, z, alpha, swap=False)
    ours = rdp.poisson_gaussian(q, z, alpha)
    assert true <= ours <= true * 1.03


@pytest.mark.parametrize("eps", [1e-6, 0.01, 0.1, 1.0, 5.0])
@pytest.mark.parametrize("alpha", [1.1, 2.0, 3.5, 10.0, 200.0])
def test_laplace_matches_mironov_prop6(eps: float, alpha: float) -> None:
    theirs = dp_rdp._laplace_rdp(eps, alpha)
    ours = rdp.laplace(eps, alpha)
    assert ours >= theirs
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-12)


def _mp_rr(eps: float, alpha: float) -> mpmath.mpf:
    """D_α of randomized response at ε, in 50 digits: the worst ε-DP pair."""
    with mpmath.workdps(50):
        e, a = mpmath.mpf(eps), mpmath.mpf(alpha)
        p = mpmath.e ** e / (1 + mpmath.e ** e)
        return mpmath.log(p ** a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1)


@pytest.mark.parametrize("eps", [1e-8, 1e-3, 0.1, 1.0, 3.0, 30.0])
@pytest.mark.parametrize("alpha", [1.1, 2.0, 7.5, 100.0, 4096.0])
def test_pure_bound_is_randomized_response(eps: float, alpha: float) -> None:
    exact = float(_mp_rr(eps, alpha))
    assert rdp.pure(eps, alpha) >= exact
    assert rdp.pure(eps, alpha) == pytest.approx(exact, rel=1e-9, abs=1e-300)
    assert rdp.pure(eps, alpha) <= min(eps, alpha * eps * eps / 2) * (1 + 1e-9)


def test_pure_bound_covers_every_eps_dp_pair() -> None:
    """Random pairs with likelihood ratios in [e^-ε, e^ε]: never above the bound (the convexity
    argument of the docstring), and a broken bound (αε²/4) is exceeded (negative control)."""
    import numpy as np

    rng = np.random.default_rng(3)
    eps, alpha, worst, broken = 0.5, 4.0, 0.0, False
    for _ in range(2000):
        q = rng.dirichlet(np.ones(5))
        r = rng.uniform(math.exp(-eps), math.exp(eps), 5)
        r = r / (q @ r)  # renormalise: P = r·Q must sum to 1
        if not (r.min() >= math.exp(-eps) and r.max() <= math.exp(eps)):
            continue
        d = math.log(q @ r ** alpha) / (alpha - 1)
        worst = max(worst, d)
        broken |= d > alpha * eps * eps / 4
    assert worst <= rdp.pure(eps, alpha) and broken


def _mp_gaussian_mixture(q: float, z: float, alpha: float, swap: bool) -> float:
    """D_α(M‖P0) (swap=False) or D_α(P0‖M) (swap=True) for P0 = N(0, z²), P1 = N(1, z²),
    M = (1−q)P0 + qP1, by numerical integration in 30 digits."""
    with mpmath.workdps(30):
        zz, qq, a = mpmath.mpf(z), mpmath.mpf(q), mpmath.mpf(alpha)

        def dens(x: mpmath.mpf, mu: float) -> mpmath.mpf:
            return mpmath.npdf(x, mu, zz)

        def f(x: mpmath.mpf) -> mpmath.mpf:
            p0 = dens(x, 0)
            m = (1 - qq) * p0 + qq * dens(x, 1)
            num, den = (p0, m) if swap else (m, p0)
            return num ** a * den ** (1 - a)

        total = mpmath.quad(f, [-mpmath.inf, -10 * zz, 0, 1, 10 * zz + 1, mpmath.inf])
        return float(mpmath.log(total) / (a - 1))


@pytest.mark.parametrize(("q", "z", "alpha"), [
    (0.01, 1.0, 2.0), (0.01, 1.0, 3.0), (0.1, 1.0, 4.0), (0.01, 0.7, 2.5), (0.3, 2.0, 6.0),
    (0.01, 1.0, 7.0),
])
def test_zcdp_curve_bounds_both_directions(q: float, z: float, alpha: float) -> None:
    """Our curve for exact noise bounds the continuous Gaussian's divergence in both directions
    (the continuous Gaussian is (1/(2z²))-zCDP too); A alone is the remove direction."""
    remove = _mp_gaussian_mixture(q, z, alpha, swap=False)
    add = _mp_gaussian_mixture(q, z, alpha, swap=True)
    curve = rdp.poisson_zcdp(q, z, alpha)
    assert max(remove, add) <= curve
    assert rdp.poisson_gaussian(q, z, alpha) >= remove * (1 - 1e-9)


def test_conversion_and_budget_are_inverse_and_safe() -> None:
    for alpha in (1.5, 2.0, 6.73, 32.0):
        b = rdp.budget(3.0, 1e-5, alpha)
        assert rdp.epsilon(b, alpha, 1e-5) >= 3.0 * (1 - 1e-9)
        assert rdp.epsilon(b, alpha, 1e-5) == pytest.approx(3.0, rel=1e-9)
    # CKS Prop 12 by hand at one point.
    value, alpha, delta = 0.5, 8.0, 1e-6
    expected = value + math.log(7 / 8) - (math.log(delta) + math.log(8)) / 7
    assert expected <= rdp.epsilon(value, alpha, delta) == pytest.approx(expected, rel=1e-10)


def test_curve_descriptions_are_validated() -> None:
    assert rdp.check_curve(("poisson-zcdp", 0.01, 1.0)) is None
    assert rdp.check_curve(("laplace", 0.5)) is None
    for bad in [("poisson-zcdp", 1.5, 1.0), ("poisson-zcdp", 0.01, -1.0), ("laplace", math.nan),
                ("laplace", 0.5, 1.0), ("gaussian", 1.0), (), "laplace", ("laplace", 1)]:
        assert rdp.check_curve(bad) is not None, bad
