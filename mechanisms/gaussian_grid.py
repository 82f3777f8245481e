"""Floating-point-safe Gaussian noise on real values: round to a grid of 2^k, add exact discrete
Gaussian noise in grid steps, convert to a double last (docs/exact-noise.md, "The Gaussian grid").

Why it keeps the declared (ε, δ). Let q(x) = round(x/g) ∈ Z^n (entrywise): for neighbours,
‖q(x) − q(x')‖₂ ≤ Δ₂/g + √n =: Δ_g, since rounding moves each entry by at most ½. We release
q(x) + Y with Y_j ~ N_Z(0, σ_g²) independent (CKS 2020, Alg. 3, drawn exactly). Compare with
q(x) + round(G), G ~ N(0, σ_g² I): that is round(q(x) + G) (q is integer), a post-processing of the
Gaussian mechanism on a query of L2 sensitivity Δ_g, so it is (ε, δ_BW(σ_g, Δ_g, ε))-DP with
δ_BW Balle–Wang's exact δ (ICML 2018, Thm 8). And the two noises are close: for σ_g >= 2,

    TV(N_Z(0, σ²), round(N(0, σ²))) <= 1/(5σ²)                                   (Lemma G)

per entry, so TV <= n/(5σ_g²) =: η for the vector (TV is subadditive over independent entries).
Hockey-stick divergences move by at most the TV on each side, H_ε(P‖Q) <= H_ε(P'‖Q') + η + e^ε η,
so our release is (ε, δ_BW + (1 + e^ε)η)-DP. ``sigma_for`` picks σ_g so that this is at most the
declared δ, and at least σ·Δ_g/Δ₂ so that the zCDP cost ρ = Δ_g²/(2σ_g²) of the discrete Gaussian
(CKS 2020, Thm 14, exact) never exceeds the declared ρ = Δ₂²/(2σ²).

Proof of Lemma G. Write φ for the N(0, σ²) density and θ = Σ_k e^{−k²/2σ²} = √(2π)σ(1 + c) with
0 <= c <= 2τ, τ = Σ_{m>=1} e^{−2π²σ²m²} (Poisson summation, as in CKS 2020 §2). Then
P_D(k) = φ(k)/(1 + c) and P_R(k) = ∫_{k−½}^{k+½} φ = φ(k)·r_k with r_k = ∫_{−½}^{½} e^{x(u)} du,
x(u) = −(2ku + u²)/(2σ²), |x| <= b_k = (|k| + ¼)/(2σ²). From 0 <= e^x − 1 − x <= x²e^{|x|}/2 and
∫x du = −1/(24σ²): |r_k − 1| <= 1/(24σ²) + b_k²e^{b_k}/2. Since |r_k − 1/(1 + c)| <= |r_k − 1| + c
and Σ_k φ(k) = 1 + c, 2·TV <= (1 + c)/(24σ²) + Σ_k φ(k)b_k²e^{b_k}/2 + c(1 + c). For the middle
sum: φ(k)e^{b_k} = e^{1/(4σ²)}φ(|k| − ½) (as −k² + |k| + ¼ = −(|k| − ½)² + ½); (|k| + ¼)² <=
(4σ²/e²)e^{(|k| + ¼)/σ} (y² <= (4σ²/e²)e^{y/σ} for y >= 0); Σ_k φ(|k| − ½)e^{|k|/σ} <=
2Σ_{k∈Z} φ(k − ½)e^{k/σ} (the terms with k >= 0 and those with k < 0, j = −k, are each part of
the full sum); and Σ_k φ(k − a)e^{k/σ} = e^{a/σ + ½}Σ_k φ(k − a − σ) <= e^{a/σ + ½}(1 + 2τ)
(complete the square, then Poisson summation again). Together Σ_k φ(k)b_k²e^{b_k}/2 <=
e^{1/(4σ²) + 3/(4σ) − 3/2}(1 + 2τ)/σ². For σ >= 2 (τ < 1e-34) this gives
2·TV <= (1/24 + e^{−1.0625})·(1 + 2τ)/σ² + 3τ <= 0.3874/σ² + 3τ < 0.4/σ², so TV < 1/(5σ²).  ∎
(The true value is about 0.02/σ²: tests/mechanisms/test_gaussian_grid.py computes it.)

The grid is g = 2^⌊log₂(σ/2^38)⌋ for the continuous σ, so σ_g ≈ 2^38–2^39 grid steps, the
sampler's integers stay in int64 (``dpbudget.mechanisms.exact.wide_gaussian``, s = √2·σ_g < 2^40) and η is
below n·2^-78; a finer grid is taken where the widening √n·g/Δ₂ would exceed 2^-16 or the TV term
δ/2^10 (``GaussianGrid``), so the extra noise stays a few 10^-5 of σ or less whatever ε, δ, n.
"""

from __future__ import annotations

import functools
import math
import sys
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.accountant.values import _numeric
from dpbudget.mechanisms.bits import RandomBits
from dpbudget.mechanisms.calibration import analytic_gaussian_sigma
from dpbudget.mechanisms.exact import wide_gaussian_array
from dpbudget.mechanisms.grid import grid_index, on_grid, to_float

__all__ = ["GaussianGrid", "log_tv_bound", "tv_bound"]

_PRECISION_BITS = 38
_WIDENING_BITS = 16
_TV_BITS = 10  # the TV term is kept below δ/2^10
_POOL = 4096
# Below this s the bulk sampler's draws are int64 (mechanisms.exact.wide_gaussian_array), so a
# pool of them converts back to an int64 array exactly.
_INT64_S = 1 << 47


def tv_bound(sigma: float, n: int) -> float:
    """An upper bound on the total variation distance between n independent N_Z(0, σ²) draws and
    n independent rounded N(0, σ²) draws: n/(5σ²) for σ >= 2 (Lemma G in the module docstring),
    rounded up."""
    log_tv = log_tv_bound(sigma, n)
    # exp's relative error is below 1e-15; an underflow leaves the smallest double, still above.
    return max(math.exp(log_tv) * (1.0 + 1e-12), 5e-324)


def log_tv_bound(sigma: float, n: int) -> float:
    """ln of :func:`tv_bound`'s n/(5σ²), rounded up (in logs: σ² may be beyond the doubles)."""
    if not sigma >= 2.0:
        raise ValueError("Lemma G needs sigma >= 2")
    return (math.log(n) - math.log(5.0) - 2.0 * math.log(sigma)) + 1e-12 * (
        1.0 + math.log(n) + 2.0 * abs(math.log(sigma)))


class GaussianGrid:
    """The grid and the per-size noise of an exact Gaussian release of continuous scale σ.

    The grid is chosen per number of entries n (``granularity_for``): g = 2^k for the largest k
    with g <= σ/2^38 (σ_g ≈ 2^38–2^39 steps: the sampler stays in int64), g <= Δ₂/(2^16·√n) (the
    rounding widening √n·g/Δ₂ stays below 2^-16 of the scale) and σ/g >= sqrt(2^10(1 + e^ε)n/(5δ))
    (the TV term stays below δ/2^10). The last two only bind at extreme ε, δ or n, where the sampler
    falls back to Python integers: slower, never less exact.

    Attributes:
        granularity: the scalar grid g = 2^k (a double, exact).
        limit: the largest |x| accepted in a scalar release.

    >>> grid = GaussianGrid(1.0, 1e-5, 1.0, 3.730631634853837)
    >>> grid.granularity == 2.0 ** -37, grid.sigma_for(1) / 2 ** 37 > 3.7306316
    (True, True)
    """

    __slots__ = ("_delta", "_epsilon", "_sensitivity", "_sigma", "granularity", "limit")

    def __init__(self, epsilon: float, delta: float, sensitivity: float, sigma: float) -> None:
        self._epsilon, self._delta, self._sensitivity, self._sigma = (
            epsilon, delta, sensitivity, sigma)
        k = self._k_for(1)
        if k is None:
            raise OverflowError("the noise grid is not a finite, non-zero double")
        self.granularity = math.ldexp(1.0, k)
        self.limit = _limit(self.granularity)

    def _k_for(self, n: int) -> int | None:
        return _grid_exponent(self._epsilon, self._delta, self._sensitivity, self._sigma, n)

    def granularity_for(self, n: int) -> float:
        """The grid step for a value of ``n`` entries (see the class docstring)."""
        k = self._k_for(n)
        return 0.0 if k is None else math.ldexp(1.0, k)

    def limit_for(self, n: int) -> float:
        """The largest |x| accepted in a value of ``n`` entries."""
        g = self.granularity_for(n)
        return 0.0 if g == 0.0 else _limit(g)

    def fits(self, n: int) -> bool:
        """Whether a value of ``n`` entries can be released: false only when no double grid
        makes the TV term (1 + e^ε)·n/(5σ_g²) at most half of δ (a grid below 2^-1074)."""
        return self._even_s(n)[0] > 0

    def sigma_for(self, n: int) -> float:
        """σ_g in grid steps (approximately; the sampler uses ``noise_s``) for ``n`` entries: at
        least σ·Δ_g/Δ₂, and large enough that δ_BW(σ_g, Δ_g, ε) + (1 + e^ε)·n/(5σ_g²) <= δ."""
        return self._even_s(n)[1]

    def noise_s(self, n: int) -> int:
        """The sampler's even integer s, σ_g² = s²/2 (``wide_gaussian``), for ``n`` entries."""
        s = self._even_s(n)[0]
        if s == 0:
            raise ValueError("no grid for this many entries (prepare checks fits())")
        return s

    def _even_s(self, n: int) -> tuple[int, float]:
        k = self._k_for(n)
        if k is None:
            return 0, 0.0
        return _calibrate(self._epsilon, self._delta, self._sensitivity, self._sigma, k, n)

    def release(self, bits: RandomBits, value: Any) -> Any:
        """``value`` (a float or a ``Fraction``, or a float64 or ``Fraction`` array, with
        |x| <= ``limit_for(n)``) plus grid Gaussian noise; a rational is rounded exactly."""
        if isinstance(value, (float, Fraction)):
            g = self.granularity
            s = self.noise_s(1)
            z = bits.pooled(("wide_gaussian", s),
                            lambda: wide_gaussian_array(bits, s, _POOL).tolist())
            return to_float(grid_index(value, g) + z, g)
        flat = value.ravel()
        g = self.granularity_for(flat.size)
        return on_grid(flat, self.noise(bits, flat.size), g).reshape(value.shape)

    def noise(self, bits: RandomBits, n: int) -> Any:
        """``n`` independent exact draws of N_Z(0, s²/2), s = ``noise_s(n)``, in grid steps.

        A few entries (up to ``_POOL // 4``: a DP-SGD gradient) are taken from the source's pool
        of draws of this s, made ahead in one bulk call (``RandomBits.pooled_many`` says why the
        law is kept); more are drawn in bulk at once. The pool belongs to the source (the
        accountant's), not to this grid, so a one-shot sampler draws from it while its release
        runs and never after, and a forked child starts with none.
        """
        s = self.noise_s(n)
        if n > _POOL // 4 or s >= _INT64_S:
            return wide_gaussian_array(bits, s, n)
        draws = bits.pooled_many(("wide_gaussian", s), n,
                                 lambda: wide_gaussian_array(bits, s, _POOL).tolist())
        return np.array(draws, dtype=np.int64)


@functools.lru_cache(maxsize=1024)
def _grid_exponent(epsilon: float, delta: float, sensitivity: float, sigma: float,
                   n: int) -> int | None:
    """k for the grid 2^k of a value of ``n`` entries (GaussianGrid's docstring), or None when it
    is not a normal or subnormal double's exponent range."""
    log2_e1 = float(np.logaddexp(0.0, epsilon)) / math.log(2.0)  # log₂(1 + e^ε), no overflow
    target = min(math.log2(sigma) - _PRECISION_BITS,
                 math.log2(sensitivity) - 0.5 * math.log2(n) - _WIDENING_BITS,
                 math.log2(sigma) - 0.5 * (math.log2(n / 5.0) + _TV_BITS + log2_e1
                                           - math.log2(delta)))
    k = math.floor(target)
    return k if -1074 <= k <= 1023 else None


@functools.lru_cache(maxsize=1024)
def _calibrate(epsilon: float, delta: float, sensitivity: float, sigma: float, k: int,
               n: int) -> tuple[int, float]:
    inv_g = Fraction(2) ** -k
    reach = _up(Fraction(sensitivity) * inv_g)  # Δ₂/g
    root_n = math.sqrt(n)
    if Fraction(root_n) ** 2 < n:
        root_n = math.nextafter(root_n, math.inf)
    d_g = _numeric.add_up(reach, root_n)  # Δ_g, rounded up
    floor = _numeric.mul_up(_up(Fraction(sigma) * inv_g), _numeric.div_up(d_g, reach))
    # (1 + e^ε)·η in log space (ε may be beyond exp's range), rounded up generously.
    log_slack = float(np.logaddexp(0.0, epsilon)) * (1.0 + 1e-15) + log_tv_bound(floor, n)
    if not log_slack + 1e-9 <= math.log(delta / 2.0):
        return 0, 0.0
    slack = math.exp(log_slack) * (1.0 + 1e-9)
    target = _numeric.sub_down(delta, slack)
    sigma_g = max(floor, _numeric.mul_up(d_g, analytic_gaussian_sigma(epsilon, target, 1.0)))
    two_var = 2 * Fraction(sigma_g) ** 2
    s = math.isqrt(math.ceil(two_var))
    while s * s < two_var:
        s += 1
    s += s % 2
    try:
        approx = s / math.sqrt(2.0)
    except OverflowError:  # (σ_g beyond 1e308 grid steps: only at absurd ε and δ)
        approx = math.inf
    return s, approx


def _limit(g: float) -> float:
    return sys.float_info.max * min(g, 1.0) / 4.0


def _up(r: Fraction) -> float:
    """The double nearest r, moved up if it fell below r."""
    x = float(r)
    return x if Fraction(x) >= r else math.nextafter(x, math.inf)
