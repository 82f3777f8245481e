"""Floating-point-safe Laplace noise on real values: round to a grid of 2^k, add exact integer noise
times 2^k, convert to a double last.

Why: adding a textbook float Laplace draw to x leaks x through *which* doubles can come out
(Mironov, CCS 2012): the released double is not a post-processing of an exactly-Laplace real.
Here the released double is a deterministic function (IEEE round-to-nearest, then an exact scaling
by a power of two) of the exact integer ``round(x/g) + Z``, where Z is discrete Laplace
(``dpbudget.mechanisms.exact``); rounding x to the grid is done before the noise, so the privacy guarantee
is the discrete mechanism's, on a query of slightly widened sensitivity.

The cost stays exactly what the mechanism declares: rounding each entry to the nearest multiple of
g moves two neighbouring values at most one grid step further apart per entry, so the rounded
query's L1 sensitivity in grid units is at most Δ₁/g + n for n entries, and the noise parameter is
t = ⌈(Δ₁/g + n)/ε⌉ (integer, rounded up): P(Z = z) ∝ exp(−|z|/t) is ε-DP for that sensitivity
(CKS 2020, §2.2; the discrete Laplace/geometric mechanism, Ghosh, Roughgarden, Sundararajan 2009).
The grid is g = 2^⌈log₂(b/2^40)⌉ for the scale b = Δ₁/ε (the choice of Google's secure-noise
paper), so t ≈ 2^40 and the widening costs a relative 2^-40/ε of extra noise for a scalar. A
vector of n entries uses a grid finer by 2^min(6, ⌈log₂ n⌉), so its widening is n·2^-46/ε (0.14%
at n = 10^5, ε = 10^-6) rather than n·2^-40/ε (9%); not finer, so that |Z| stays below 2^53 and
q + Z is formed exactly in float64.

An exact rational value (a ``fractions.Fraction``, or an object array of them: the exact sums of
``dpbudget.mechanisms.sums``) is rounded to the grid exactly, round(x/g) on the rational itself
(``grid_index``), so the one-step slack above is spent on that single rounding and the
sensitivity holds for x as given.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.mechanisms.bits import RandomBits
from dpbudget.mechanisms.exact import discrete_laplace, discrete_laplace_array

__all__ = ["LaplaceGrid", "ceil_log2", "grid_index", "on_grid", "to_float"]

_PRECISION_BITS = 40
_EXTRA_BITS = 6
_EXACT_FLOAT = float(2 ** 53)
_POOL = 4096  # scalar draws made ahead in one bulk call (its fixed cost is ~3 ms)


def ceil_log2(r: Fraction) -> int:
    """The smallest k with 2^k >= r, for a rational r > 0 (exact)."""
    k = r.numerator.bit_length() - r.denominator.bit_length()
    while _pow2(k) < r:
        k += 1
    while _pow2(k - 1) >= r:
        k -= 1
    return k


def _limit(g: float) -> float:
    """The largest |x| for which x/g and the released double stay finite."""
    return sys.float_info.max * min(g, 1.0) / 4.0


def _pow2(k: int) -> Fraction:
    return Fraction(2 ** k) if k >= 0 else Fraction(1, 2 ** -k)


def _ceil(r: Fraction) -> int:
    return -((-r.numerator) // r.denominator)


class LaplaceGrid:
    """The grid and integer noise parameter of a Laplace release with scale Δ₁/ε (see the module
    docstring). Immutable; built once per mechanism.

    Attributes:
        granularity: g = 2^k, a double (exact).
        limit: the largest |x| accepted: x/g and the result stay finite doubles.

    >>> grid = LaplaceGrid(1.0, 1.0)
    >>> grid.granularity == 2.0 ** -40, grid.noise_parameter(1)
    (True, 1099511627777)
    """

    __slots__ = ("_epsilon", "_k", "_sensitivity", "_t1", "granularity", "limit")

    def __init__(self, epsilon: float, sensitivity: float) -> None:
        self._epsilon = Fraction(epsilon)
        self._sensitivity = Fraction(sensitivity)
        k = ceil_log2(self._sensitivity / self._epsilon / 2 ** _PRECISION_BITS)
        if not -1074 <= k <= 1023:
            raise OverflowError("the noise grid is not a finite, non-zero double")
        self._k = k
        self.granularity = math.ldexp(1.0, k)
        self.limit = _limit(self.granularity)
        self._t1 = self.noise_parameter(1)

    def _k_for(self, n: int) -> int:
        # n entries widen the L1 sensitivity by n grid steps: a finer grid (up to 2^6 times) keeps
        # that a small share of Δ₁/g. Not finer: the noise must stay below 2^53 grid steps so that
        # q + Z is formed exactly in float64 (|Z| >= 2^53 has probability ~e^-128 at t ~ 2^46).
        return max(self._k - min(_EXTRA_BITS, (n - 1).bit_length()), -1074)

    def granularity_for(self, n: int) -> float:
        """The grid step used for a value of ``n`` entries: g = 2^⌈log₂(b/2^40)⌉ for a scalar,
        finer by up to 2^6 for vectors so that the widening stays n·2^-46/ε of the scale."""
        return math.ldexp(1.0, self._k_for(n))

    def limit_for(self, n: int) -> float:
        """The largest |x| accepted in a value of ``n`` entries."""
        return _limit(self.granularity_for(n))

    def noise_parameter(self, n: int, k: int | None = None) -> int:
        """t = ⌈(Δ₁/g + n)/ε⌉ for a value of ``n`` entries on the grid 2^k (by default the scalar
        grid): the discrete Laplace scale in grid steps, P(Z = z) ∝ exp(−|z|/t)."""
        g = _pow2(self._k if k is None else k)
        return _ceil((self._sensitivity / g + n) / self._epsilon)

    def release_scalar(self, bits: RandomBits, value: float, t: int) -> float:
        """One float (|x| <= ``limit``) plus grid Laplace noise of integer parameter ``t`` (for a
        caller whose sensitivity accounting needs a ``t`` other than ``noise_parameter(1)``)."""
        return to_float(round(value / self.granularity) + discrete_laplace(bits, 1, t),
                         self.granularity)

    def release(self, bits: RandomBits, value: Any) -> Any:
        """``value`` (a float or a ``Fraction``, or a float64 or ``Fraction`` array, with
        |x| <= ``limit``) plus grid Laplace noise."""
        g = self.granularity
        if isinstance(value, (float, Fraction)):
            t = self._t1
            z = bits.pooled(("discrete_laplace", t),
                            lambda: discrete_laplace_array(bits, 1, t, _POOL).tolist())
            return to_float(grid_index(value, g) + z, g)
        flat = value.ravel()
        k = self._k_for(flat.size)
        g = math.ldexp(1.0, k)
        z = discrete_laplace_array(bits, 1, self.noise_parameter(flat.size, k), flat.size)
        return on_grid(flat, z, g).reshape(value.shape)


def grid_index(value: float | Fraction, g: float) -> int:
    """round(x/g), exactly, for a double or an exact rational x (g a power of two)."""
    return round(value / g) if isinstance(value, float) else round(value / Fraction(g))


def on_grid(flat: Any, z: Any, g: float) -> Any:
    """round(x/g) + z for each entry, as the double nearest that exact integer times g (entries
    of an object array are exact rationals, rounded exactly)."""
    if flat.dtype == object:
        return np.array([to_float(grid_index(x, g) + int(zi), g)
                         for x, zi in zip(flat.tolist(), z.tolist())])
    q = np.rint(flat / g)
    if z.dtype == object or int(np.abs(z).max()) >= _EXACT_FLOAT:
        # (never in practice) a draw beyond 2^53 would be rounded on conversion: Python ints
        return np.array([to_float(int(qi) + int(zi), g) for qi, zi in zip(q.tolist(), z.tolist())])
    # q and z are integers held exactly, so q + z is the correctly rounded exact sum.
    with np.errstate(over="ignore"):
        return (q + z.astype(np.float64)) * g


def to_float(exact: int, g: float) -> float:
    """The double nearest the integer ``exact``, times the power of two g (exact unless it
    overflows): a function of ``exact`` alone."""
    try:
        return float(exact) * g
    except OverflowError:
        return math.copysign(math.inf, exact)
