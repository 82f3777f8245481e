"""The privacy-loss distributions of the Poisson-subsampled Gaussian
(``accountant.composition.privacy_loss``): every δ(ε) dominates the exact one (mpmath references,
the Gaussian exactly) and is close to it, the float error of the FFT is covered, and k_max agrees
with dp-accounting as an oracle and stops at its documented cap."""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np
import pytest

from dpbudget.accountant.composition import privacy_loss
from dpbudget.accountant.composition.privacy_loss import _PLD, _single


def _gaussian_delta(mu: float, eps: float) -> float:
    """Exact δ(ε) of μ-GDP (the k-fold Gaussian, μ = √k/z): Dong–Roth–Su 2019, Cor. 2.13."""
    mu_, e = mpmath.mpf(mu), mpmath.mpf(eps)
    return float(mpmath.ncdf(-e / mu_ + mu_ / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu_ - mu_ / 2))


@pytest.mark.parametrize(("z", "k", "eps"), [(1.0, 1, 1.0), (2.0, 16, 1.0), (4.0, 100, 2.0),
                                              (1.0, 7, 3.0)])
def test_delta_dominates_the_exact_gaussian_and_is_close(z: float, k: int, eps: float) -> None:
    """q = 1 is the Gaussian: k steps are exactly (√k/z)-GDP. The pessimistic δ is never below
    the exact one (to 1e-12, the float error of the reference), and within kΔ of ε of it."""
    exact = _gaussian_delta(k ** 0.5 / z, eps)
    ours = privacy_loss.delta(1.0, z, k, eps)
    assert ours >= exact * (1 - 1e-9) - 1e-15
    looser = _gaussian_delta(k ** 0.5 / z, eps - k * privacy_loss.GRID - 1e-9)
    assert ours <= looser * (1 + 1e-6) + 1e-12


def _exact_single_delta(q: float, z: float, eps: float, remove: bool) -> float:
    """δ(ε) of one Poisson-subsampled Gaussian step, one direction, in mpmath (50 digits):
    P[L > ε] − e^ε Q[L > ε] with the loss's threshold x(ε)."""
    with mpmath.workdps(50):
        q_, z_, e = mpmath.mpf(q), mpmath.mpf(z), mpmath.mpf(eps)

        def tail(a: Any, mean: Any) -> Any:
            return mpmath.ncdf(-(a - mean) / z_)

        if remove:  # L = s(x) > ε ⟺ x > x(ε); P the mixture
            if e <= mpmath.log(1 - q_):
                return float(1 - mpmath.exp(e))
            a = z_ ** 2 * mpmath.log((mpmath.exp(e) - 1 + q_) / q_) + mpmath.mpf(0.5)
            p_tail = (1 - q_) * tail(a, 0) + q_ * tail(a, 1)
            return float(p_tail - mpmath.exp(e) * tail(a, 0))
        if -e <= mpmath.log(1 - q_):  # L = −s(x) > ε ⟺ s(x) < −ε: never
            return 0.0
        a = z_ ** 2 * mpmath.log((mpmath.exp(-e) - 1 + q_) / q_) + mpmath.mpf(0.5)
        below = 1 - tail(a, 0)  # N(0, z²) below a; the mixture below a
        mix_below = (1 - q_) * (1 - tail(a, 0)) + q_ * (1 - tail(a, 1))
        return float(below - mpmath.exp(e) * mix_below)


@pytest.mark.parametrize("remove", [True, False], ids=["remove", "add"])
@pytest.mark.parametrize("eps", [-0.2, 0.0, 0.003, 0.01, 0.05, 0.123456, 0.5, 1.0, 2.0])
def test_one_step_dominates_the_exact_profile_and_touches_it(eps: float, remove: bool) -> None:
    """Connect-the-dots: the one-step δ(ε) is never below the exact one (mpmath), on the grid
    and between its points, and on the grid it is the exact one up to the float margins."""
    q, z = 0.01, 1.0
    exact = _exact_single_delta(q, z, eps, remove)
    ours = _single(q, z, remove).delta(eps)
    assert ours >= exact - 1e-15
    on_grid = abs(eps / privacy_loss.GRID - round(eps / privacy_loss.GRID)) < 1e-6
    if on_grid:
        assert ours <= exact * (1 + 1e-4) + 1e-12


def test_the_profile_check_catches_a_discretisation_on_the_wrong_side() -> None:
    """Negative control for the test above: the same PLD with every loss one grid step *lower*
    (what rounding down would give) falls below the exact profile."""
    one = _single(0.01, 1.0, True)
    low = _PLD(one.p, one.offset - 1, one.inf, one.err)
    eps = 0.5
    assert low.delta(eps) < _exact_single_delta(0.01, 1.0, eps, True) <= one.delta(eps)


def test_k_max_stops_at_its_documented_cap() -> None:
    """A step so weak that more than 2²² fit: the cap, not a larger count (and the control: a
    step that fits fewer is not capped)."""
    assert privacy_loss.max_steps(0.001, 50.0, 3.0, 1e-5) == privacy_loss.MAX_STEPS
    assert 0 < privacy_loss.max_steps(0.002, 10.0, 1.0, 1e-6) < privacy_loss.MAX_STEPS


def test_k_max_of_the_gaussian_is_the_exact_count() -> None:
    """q = 1, z = 20 at (3, 1e-5): exact GDP admits k while δ(√k/20) ≤ 1e-5 (206); ours is that
    k or one step below (the grid's rounding), never above."""
    lo, hi = 1, 4000  # δ grows with k: bisect on the exact δ
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _gaussian_delta(mid ** 0.5 / 20.0, 3.0) <= 1e-5 else (lo, mid)
    ours = privacy_loss.max_steps(1.0, 20.0, 3.0, 1e-5)
    assert lo - 1 <= ours <= lo


def test_the_fft_error_bound_covers_the_float_error() -> None:
    """The bound carried by ``compose`` against a direct (exactly summed, ``math.fsum``)
    convolution, on two single-step PLDs cut short (2,000 points each)."""
    one = _single(0.05, 1.0, True)
    a = one.p[:2000] / one.p[:2000].sum()
    b = one.p[1000:3000] / one.p[1000:3000].sum()
    x, y = _PLD(a, 0, 0.0, 0.0), _PLD(b, 0, 0.0, 0.0)
    fast = np.convolve(a, b)
    c = x.compose(y)
    exact = np.array([np.float64(sum(mpmath.mpf(float(a[i])) * mpmath.mpf(float(b[n - i]))
                                     for i in range(max(0, n - b.size + 1), min(n, a.size - 1) + 1)))
                      for n in range(0, fast.size, 97)])
    got = np.zeros(fast.size)
    got[c.offset:c.offset + c.p.size] = c.p
    assert np.abs(got[::97] - exact).sum() <= c.err
    assert c.err < 1e-10  # and the bound is not vacuous


def _dpa_delta(q: float, z: float, k: int, eps: float) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), k)
    return float(acc.get_delta(eps))


@pytest.mark.slow
@pytest.mark.parametrize(("q", "z", "eps", "delta"), [
    (0.01, 1.0, 3.0, 1e-5), (0.01, 4.0, 3.0, 1e-5), (0.05, 2.0, 1.0, 1e-6), (0.1, 4.0, 3.0, 1e-5), (0.02, 0.8, 2.0, 1e-6),
    (1.0, 10.0, 1.0, 1e-5),
])
def test_k_max_against_dp_accounting(q: float, z: float, eps: float, delta: float) -> None:
    """dp-accounting's pessimistic PLD (1e-4 grid, its connect-the-dots) at our k is within δ_B
    (we are never above its answer), and one more than 1.001 k is over δ_B (we are within
    0.1 %)."""
    k = privacy_loss.max_steps(q, z, eps, delta)
    assert k > 0
    assert _dpa_delta(q, z, k, eps) <= delta
    assert _dpa_delta(q, z, int(1.001 * k) + 1, eps) > delta
    assert privacy_loss.delta(q, z, k, eps) <= delta < privacy_loss.delta(q, z, k + 1, eps)
