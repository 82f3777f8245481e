"""docs/theory.md §2 reference vectors and cross-checks for accountant.composition.bounds."""

from __future__ import annotations

import math
from typing import Any

import mpmath
import pytest

from dpbudget.accountant.composition import bounds
from dpbudget.accountant.values.errors import InvalidArgumentError

REL = 1e-9

VECTORS = [
    (bounds.kov_epsilon, (100, 0.1, 1e-5), 4.306791373),
    (bounds.kov_epsilon, (10, 0.1, 1e-5), 0.9936911768),
    (bounds.kov_epsilon, (20, 0.05, 1e-3), 0.4979864081),
    (bounds.drv_epsilon, (100, 0.1, 1e-5), 5.850235093),
    (bounds.kov_heterogeneous_epsilon, ([0.05] * 20, 1e-3), 0.7613352286),
    (bounds.cks_epsilon, (0.5, 1e-5), 4.728386985),
    (bounds.gdp_epsilon, (1.0, 1e-5), 4.377178096),
    (bounds.cks_rho_budget, (1.0, 1e-6), 0.024355970359538525),
]


@pytest.mark.parametrize(("fn", "args", "expected"), VECTORS,
                         ids=[f"{f.__name__}{a}"[:60] for f, a, _ in VECTORS])
def test_theory_vectors(fn, args, expected):
    assert fn(*args) == pytest.approx(expected, rel=REL)


def test_kov_max_steps_vector():
    assert bounds.kov_max_steps(1.0, 1e-6, 0.01) == 562
    # the boundary really is the boundary
    assert bounds.kov_delta(562, 0.01, 1.0) <= 1e-6 < bounds.kov_delta(563, 0.01, 1.0)


def test_textbook_shortcut_understates():
    # docs/theory.md: Dwork–Roth Cor 3.21's 2ε·sqrt(2k ln(1/δ')) = 151.74 is below the optimum 186.12.
    shortcut = 2 * 0.5 * math.sqrt(2 * 1000 * math.log(1e5))
    assert shortcut == pytest.approx(151.74, abs=0.01)
    assert bounds.kov_epsilon(1000, 0.5, 1e-5) == pytest.approx(186.12, abs=0.01)


def _cks_mp(rho, delta):
    mpmath.mp.dps = 40
    f = lambda a: a * rho + (mpmath.log(1 / mpmath.mpf(delta)) + (a - 1) * mpmath.log(1 - 1 / a)
                             - mpmath.log(a)) / (a - 1)
    a = mpmath.findroot(lambda a: mpmath.diff(f, a), 1 + mpmath.sqrt(math.log(1 / delta) / rho))
    return float(f(a))


@pytest.mark.parametrize(("rho", "delta"), [(0.5, 1e-5), (1e-3, 1e-9), (5.0, 1e-3), (1e-6, 1e-6)])
def test_cks_matches_high_precision_and_is_never_low(rho, delta):
    exact = _cks_mp(rho, delta)
    got = bounds.cks_epsilon(rho, delta)
    assert got >= exact
    assert got == pytest.approx(exact, rel=1e-12)


def test_cks_rho_budget_is_safe_and_beats_bun_steinke():
    rho_b = bounds.cks_rho_budget(1.0, 1e-6)
    assert bounds.cks_epsilon(rho_b, 1e-6) <= 1.0
    assert bounds.cks_epsilon(rho_b * (1 + 1e-9), 1e-6) > 1.0 - 1e-12
    # Bun–Steinke's conversion ρ + 2 sqrt(ρ ln(1/δ)) (the WRRW filter) allows less.
    lid = math.log(1e6)
    rho_bs = (math.sqrt(lid + 1.0) - math.sqrt(lid)) ** 2
    assert rho_bs + 2 * math.sqrt(rho_bs * lid) == pytest.approx(1.0)
    assert rho_b > rho_bs


def test_gdp_round_trip():
    mu = bounds.gdp_mu(1.0, 1e-6)
    assert bounds.gdp_delta(mu, 1.0) <= 1e-6
    assert bounds.gdp_epsilon(mu, 1e-6) == pytest.approx(1.0, rel=1e-9)
    assert bounds.gdp_mu(4.377178096, 1e-5) == pytest.approx(1.0, rel=1e-8)


def test_kov_is_at_most_drv_and_basic():
    for k, e in [(10, 0.1), (100, 0.1), (1000, 0.01)]:
        assert bounds.kov_epsilon(k, e, 1e-5) <= min(bounds.drv_epsilon(k, e, 1e-5), k * e)


def test_kov_with_delta0():
    # (1 − (1−δ₀)^k) alone exceeds δ: nothing works.
    assert bounds.kov_epsilon(10, 0.1, 1e-5, 1e-5) == math.inf
    assert bounds.kov_epsilon(10, 0.1, 1e-4, 1e-6) > bounds.kov_epsilon(10, 0.1, 1e-4)


def test_bad_arguments_are_typed():
    with pytest.raises(InvalidArgumentError, match="'delta'"):
        bounds.cks_epsilon(0.5, float("nan"))
    with pytest.raises(InvalidArgumentError, match="'eps0'"):
        bounds.kov_epsilon(10, -0.1, 1e-5)


def test_gdp_mu_budget_is_never_above_the_exact_root() -> None:
    """μ_B (the gaussian rule's budget) is a derived budget: it must round to the safe side. At
    every grid point the exact δ(ε_B) of μ_B-GDP, in 50-digit arithmetic, is within δ_B."""
    import mpmath

    from dpbudget.accountant.composition.bounds import gdp_mu

    mpmath.mp.dps = 50

    def exact_delta(mu: float, eps: float) -> Any:
        m, e = mpmath.mpf(mu), mpmath.mpf(eps)
        return mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)

    for eps in (0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0):
        for delta in (1e-3, 1e-5, 1e-6, 1e-8, 1e-10, 1e-12):
            mu = gdp_mu(eps, delta)
            assert exact_delta(mu, eps) <= delta, (eps, delta, mu)
            assert exact_delta(mu * (1 + 1e-8), eps) > delta  # and is tight to 1e-8
