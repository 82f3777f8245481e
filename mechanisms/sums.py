"""Exact sums of doubles: the true answers that noise is added to, computed without rounding.

Why: a float sum rounds after every addition, and how far depends on the other rows, so two
neighbouring datasets' float sums can differ by more than the sensitivity the noise was calibrated
for (a few units in the last place of the sum: beyond the one grid step of slack the grid
mechanisms allow once the sum is large compared with the noise scale; ``dpbudget.mechanisms.grid``).
Every double is a dyadic rational m·2^e, so a sum of doubles is one too, and it is computed here
exactly: the query's sensitivity then holds for the value handed to the mechanism, which rounds it
to its grid once (``LaplaceGrid.release`` rounds a ``Fraction`` exactly).

How (``exact_sum``): with 2^k above every |x| / 2^52, each x is split exactly into
a·2^k + r, a = round(x/2^k) an integer below 2^52 in magnitude and |r| <= 2^(k−1) (the remainder
of rounding to a power-of-two grid is a double: it is a multiple of x's last place, and small).
The integers a are summed exactly with ``integer_sum`` (int64 partial sums that cannot overflow,
then Python integers — the summation DP-SGD uses for its gradients, ``dpbudget.mechanisms.subsampled``),
and the remainders are split again 52 bits lower, until none is left: two levels for data
spanning a few orders of magnitude, at most 41 for any doubles (each level takes 52 bits of
the 2098 between 2^1023 and 2^-1074).
"""

from __future__ import annotations

import math
from fractions import Fraction
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["exact_sum", "exact_sums", "integer_sum", "rational_value", "within"]

_LEVEL_BITS = 52
_HALF_BITS = 26
_HALF_MASK = (1 << _HALF_BITS) - 1
_BLOCK = 1 << 26  # rows per bincount: 2^26 halves below 2^26 sum below 2^52, exactly


def integer_sum(grid_rows: Any, bound: int | None = None) -> list[int]:
    """The exact column sums of integer-valued float rows (n × d, |entries| < 2^53), as Python
    ints: int64 sums over blocks small enough never to overflow, then Python integers.
    ``bound``, when given, is a bound on the entries' magnitude (saves a pass over them)."""
    n, d = grid_rows.shape
    if n == 0:
        return [0] * d
    ints = grid_rows.astype(np.int64)
    peak = (int(np.abs(ints).max()) if bound is None else bound) + 1
    step = max(1, (1 << 62) // peak)  # a block of `step` rows sums below 2^62 in magnitude
    whole = n - n % step
    totals = [0] * d
    if whole:
        blocks = ints[:whole].reshape(-1, step, d).sum(axis=1)
        totals = [sum(column) for column in blocks.T.tolist()]
    if whole < n:
        totals = [t + int(v) for t, v in zip(totals, ints[whole:].sum(axis=0).tolist())]
    return totals


def exact_sum(values: Any) -> Fraction:
    """The exact sum of finite doubles (a float64 array), as a ``Fraction`` (see the module
    docstring). Empty: 0.

    >>> exact_sum(np.array([1e16, 1.0, 1.0]))  # np.sum gives 1e16: each 1.0 is lost
    Fraction(10000000000000002, 1)
    """
    total, k = 0, 0  # the sum so far, in units of 2^k
    for a, k in _levels(np.asarray(values, dtype=np.float64).ravel()):
        total = (total << _LEVEL_BITS) + integer_sum(a.reshape(-1, 1), 1 << _LEVEL_BITS)[0]
    return _rational(total, k)


def exact_sums(values: Any, index: Any, groups: int) -> list[Fraction]:
    """The exact sum of ``values[index == j]`` for each j in ``range(groups)`` (``values`` and
    ``index`` one-dimensional, of the same length; an index outside the range is ignored).

    The same levels as ``exact_sum``, each summed per group with ``np.bincount`` on the integers'
    26-bit halves, whose float partial sums stay exact below 2^53 (blocks of 2^26 rows).
    """
    index = np.asarray(index, dtype=np.int64)
    keep = (index >= 0) & (index < groups)
    index = index[keep]
    totals, k = [0] * groups, 0
    for a, k in _levels(np.asarray(values, dtype=np.float64)[keep]):
        ints = a.astype(np.int64)
        high, low = (ints >> _HALF_BITS).astype(np.float64), (ints & _HALF_MASK).astype(np.float64)
        totals = [t << _LEVEL_BITS for t in totals]
        for start in range(0, ints.size, _BLOCK):
            part = slice(start, start + _BLOCK)
            h = np.bincount(index[part], weights=high[part], minlength=groups)
            lo = np.bincount(index[part], weights=low[part], minlength=groups)
            totals = [t + (int(hj) << _HALF_BITS) + int(lj)
                      for t, hj, lj in zip(totals, h.tolist(), lo.tolist())]
    return [_rational(t, k) for t in totals]


def _levels(x: Any) -> Iterator[tuple[Any, int]]:
    """(a, k) per level: a the integers (as doubles, |a| <= 2^52) with Σ x = Σ_levels Σ a·2^k;
    k falls by 52 from one level to the next. ``a`` may be overwritten by the next level."""
    peak = max(float(x.max()), -float(x.min())) if x.size else 0.0
    if peak == 0.0:
        return
    if not math.isfinite(peak):
        raise ValueError("exact sums need finite values")
    k = math.frexp(peak)[1] - _LEVEL_BITS  # peak < 2^(k + 52)
    while k > 0:
        # Levels above 2^0 in the values' own scale: x / 2^k may underflow for a tiny x (then
        # below 1/2, so a = 0 and r = x, exactly), which a rescaled copy could not undo.
        a = np.rint(np.ldexp(x, -k))
        yield a, k
        x = x - np.ldexp(a, k)  # the exact remainder, |r| <= 2^(k−1)
        if not x.any():
            return
        k -= _LEVEL_BITS
    # Below: y = x / 2^k scales up, exactly (no underflow, |y| <= 2^52); each level keeps
    # y − round(y), exact (|y − a| <= 1/2 is a multiple of y's last place), times 2^52.
    y = x * 2.0 ** -k if k > -1000 else np.ldexp(x, -k)
    a = np.empty_like(y)
    while True:
        np.rint(y, out=a)
        yield a, k
        y -= a
        if not y.any():
            return
        y *= 2.0 ** _LEVEL_BITS
        k -= _LEVEL_BITS


def _rational(total: int, k: int) -> Fraction:
    """total·2^k."""
    return Fraction(total << k) if k >= 0 else Fraction(total, 1 << -k)


def rational_value(value: Any, exact: bool) -> Any:
    """``value`` if it is a ``Fraction`` or a non-empty numpy array of them (dtype object) — as
    given when ``exact`` (a grid mechanism rounds it exactly), else as the nearest double(s) —
    and None for anything else (which the mechanism validates as usual)."""
    if isinstance(value, Fraction):
        return value if exact else float(value)
    if (isinstance(value, np.ndarray) and value.dtype == object and value.size
            and all(isinstance(v, Fraction) for v in value.flat)):
        return value if exact else value.astype(np.float64)
    return None


def within(x: Any, limit: float) -> bool:
    """|x| <= ``limit`` for a double, a ``Fraction`` (compared exactly) or an array of either."""
    if isinstance(x, (float, Fraction)):
        return -limit <= x <= limit
    if x.dtype == object:
        return all(-limit <= v <= limit for v in x.flat)
    return bool(np.all(np.abs(x) <= limit))
