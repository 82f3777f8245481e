"""Quantiles and the median by the exponential mechanism over public candidates: (ε, 0)-DP.

Invariant: the candidates, q and the bounds are public and fixed at construction; the data is
validated and sorted in ``prepare`` (before any debit) and only the chosen candidate is released.
The selection law is sampled exactly, on exact integer scores: no floating-point step decides
which candidate comes out.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataError,
                                               InvalidDataTypeError, InvalidTypeError)
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.exact import bernoulli_exp
from dpbudget.mechanisms.rows import clamp_range, row_values
from dpbudget.mechanisms.sampling import Sampler

__all__ = ["MAX_CANDIDATES", "BinnedQuantile", "Median", "Quantile"]

MAX_CANDIDATES = 100_000  # the exact sampler proposes up to this many times per release


class Quantile(Mechanism):
    """The q-quantile of values clamped into [lower, upper], chosen among public candidates by
    the exponential mechanism: (ε, 0)-DP.

    Utility of candidate c: u(x, c) = −|#{i : x_i ≤ c} − q·n|. Adding, removing or replacing one
    row moves the count by at most 1 and q·n by at most q, in the same direction when both move,
    so |Δu| ≤ max(q, 1 − q) ≤ 1; the mechanism uses Δu = 1. The candidate is drawn with
    P[c] ∝ exp(ε·u(x, c)/2) (McSherry–Talwar, FOCS 2007, Thm 6; Dwork–Roth 2014, Thm 3.10), the
    exponential mechanism for quantiles of Smith (STOC 2011) with the interval lengths replaced by
    a public candidate grid, as OpenDP's and Google's quantile mechanisms do. Sampled exactly by
    rejection: a candidate proposed uniformly is kept with probability exp(−γ_c),
    γ_c = ε·(u* − u_c)/2 ≥ 0 on exact rationals (Canonne–Kamath–Steinke 2020, Alg. 1); the
    scores are the exact integers |k·D − Q·n| for q = Q/D.

    Accuracy: with n rows, the released candidate's rank is within (2/ε)·ln(K/β) of q·n with
    probability ≥ 1 − β over K candidates (Dwork–Roth Thm 3.11), plus the grid's own spacing.

    Timing: the number of proposals depends on the data (as for ``Exponential``); see
    docs/exact-noise.md.

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: ε > 0.
        q: the quantile, in [0, 1] (0.5: the median).
        lower, upper: public bounds chosen without looking at the data; values outside are
            clamped into them.
        candidates: the public answers to choose from, increasing, within [lower, upper]
            (default: ``bins + 1`` evenly spaced points from lower to upper).
        bins: the number of intervals of the default grid (1 to ``MAX_CANDIDATES − 1``).

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad parameter.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> m = Quantile(epsilon=1.0, q=0.5, lower=0.0, upper=100.0)
    >>> 45.0 <= acc.release(m, list(range(101))) <= 55.0
    True
    """

    _may_be_zero = ("q", "lower", "upper")

    def __init__(self, epsilon: float, *, q: float, lower: float, upper: float,
                 candidates: Any = None, bins: int = 1000) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.q = _validate.real("q", q)
        if not 0.0 <= self.q <= 1.0:
            raise InvalidArgumentError("q", q, "a number in [0, 1]")
        self.lower, self.upper = clamp_range(lower, upper)
        self.candidates = _candidates(candidates, bins, self.lower, self.upper)
        self._grid = np.asarray(self.candidates, dtype=np.float64)
        self._q = Fraction(self.q)
        self._rate = Fraction(self.epsilon) / (2 * self._q.denominator)  # γ per score unit
        self.declare(Budget(self.epsilon), noise="exact")


    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "q": self.q, "lower": self.lower, "upper": self.upper,
                "candidates": len(self.candidates), "noise": "exact"}

    def prepare(self, value: Any) -> np.ndarray:
        """The values, clamped into [lower, upper] and sorted (a new ``float64`` array).

        Raises:
            InvalidDataTypeError: not a one-dimensional sequence of real numbers.
            InvalidDataError: a NaN entry (it has no place in an order), naming its index.
        """
        return np.sort(np.clip(row_values(value, "value"), self.lower, self.upper))

    def draw(self, value: np.ndarray, sampler: Sampler) -> float:
        scores = self.scores(value)
        best = min(scores)
        bits = sampler.bits
        while True:
            r = bits.below(len(scores))
            gap = self._rate * (scores[r] - best)
            if bernoulli_exp(bits, gap.numerator, gap.denominator):
                return float(self.candidates[r])

    def scores(self, ordered: np.ndarray) -> list[int]:
        """|k_c·D − Q·n| for each candidate c (k_c rows ≤ c, n rows, q = Q/D): the negated
        utility in units of 1/D, exactly. ``ordered``: what ``prepare`` returns."""
        below = np.searchsorted(ordered, self._grid, side="right")
        target = self._q.numerator * len(ordered)
        d = self._q.denominator
        return [abs(int(k) * d - target) for k in below]


class Median(Quantile):
    """``Quantile`` with q = 0.5: the median of values clamped into [lower, upper], (ε, 0)-DP.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> 40.0 <= acc.release(Median(1.0, lower=0.0, upper=100.0), [50.0] * 200) <= 60.0
    True
    """

    def __init__(self, epsilon: float, *, lower: float, upper: float, candidates: Any = None,
                 bins: int = 1000) -> None:
        super().__init__(epsilon, q=0.5, lower=lower, upper=upper, candidates=candidates, bins=bins)

    def params(self) -> dict[str, Any]:
        params = super().params()
        del params["q"]
        return params


class BinnedQuantile(Quantile):
    """``Quantile`` from the count of values in each candidate's bin, with a utility sensitivity
    of ``rows_per_unit``: the quantile of a table bounded to that many rows per privacy unit,
    (ε, 0)-DP per unit.

    The value is, for each candidate c_j, the number of rows with c_{j−1} < x ≤ c_j (the first
    bin: x ≤ c_0), as an engine computes it without sending rows to Python; the cumulative counts
    are the k_c of ``Quantile``. Removing one unit removes m ≤ C rows: each k_c drops by some
    j ∈ [0, m] and q·n by q·m, so |Δu| ≤ m·max(q, 1 − q) ≤ C, and the selection is drawn with
    P[c] ∝ exp(ε·u(x, c)/(2C)) (McSherry–Talwar 2007 with Δu = C). C = 1 is ``Quantile``.

    Grouped: a matrix of counts, one row per public group, draws one candidate per row, all at
    that same rate, and is (ε, 0)-DP per unit as a whole: removing a unit takes m_g rows from
    group g with Σ m_g ≤ C, so row g's utilities move by at most m_g and its law by a factor of
    at most exp(ε·m_g/C) (numerator and normaliser, each e^{ε·m_g/(2C)}); the rows are drawn
    independently, so the joint law moves by at most exp(ε·Σ m_g/C) ≤ e^ε. With C = L0·L∞ (a
    unit in at most L0 groups, at most L∞ rows in each) each group's draw is the (ε/L0)-DP
    quantile at utility sensitivity L∞: ε split over the L0 groups a unit can reach, the
    per-partition budget of PipelineDP's ``max_partitions_contributed`` (Wilson et al. 2020, §3).

    Args:
        epsilon, q, lower, upper, candidates, bins: as for ``Quantile``.
        rows_per_unit: C, the most rows one unit has after bounding (a positive int).

    >>> m = BinnedQuantile(1.0, q=0.5, lower=0.0, upper=4.0, bins=4, rows_per_unit=2)
    >>> m.scores(m.prepare([0, 10, 0, 10, 0]))  # 20 rows: 10 at or below 1, 10 in (2, 3]
    [20, 0, 0, 20, 20]
    """

    def __init__(self, epsilon: float, *, q: float, lower: float, upper: float,
                 candidates: Any = None, bins: int = 1000, rows_per_unit: int = 1) -> None:
        super().__init__(epsilon, q=q, lower=lower, upper=upper, candidates=candidates, bins=bins)
        self.rows_per_unit = _validate.positive_int("rows_per_unit", rows_per_unit)
        self._rate = Fraction(self.epsilon) / (2 * self._q.denominator * self.rows_per_unit)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "rows_per_unit": self.rows_per_unit}

    def prepare(self, value: Any) -> np.ndarray:
        """The cumulative counts k_c (an ``int64`` array), from the count in each candidate's bin
        (a matrix: per row, one row per group).

        Raises:
            InvalidDataTypeError: not an array of integers, one per candidate (per row).
            InvalidDataError: a negative count.
        """
        arr = np.asarray(value)
        if arr.ndim not in (1, 2) or arr.shape[-1:] != (len(self.candidates),) or \
                arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidDataTypeError("value", value, f"{len(self.candidates)} integer counts "
                                       "(one per candidate's bin; a row of them per group)")
        if arr.size and int(arr.min()) < 0:
            raise InvalidDataError("value", value, "counts of at least 0")
        return np.cumsum(arr.astype(np.int64), axis=-1)

    def draw(self, value: np.ndarray, sampler: Sampler) -> Any:
        """One candidate, or for a matrix an array of one per row (drawn independently)."""
        if value.ndim == 2:
            return np.array([super(BinnedQuantile, self).draw(row, sampler) for row in value],
                            dtype=np.float64)
        return super().draw(value, sampler)

    def scores(self, ordered: np.ndarray) -> list[int]:
        """|k_c·D − Q·n| for each candidate, from the cumulative counts ``prepare`` returns (n:
        the last)."""
        n = int(ordered[-1]) if ordered.size else 0
        target, d = self._q.numerator * n, self._q.denominator
        return [abs(int(k) * d - target) for k in ordered]


def _candidates(candidates: Any, bins: Any, lower: float, upper: float) -> tuple[float, ...]:
    if candidates is None:
        if isinstance(bins, bool) or not isinstance(bins, numbers.Integral):
            raise InvalidTypeError("bins", bins, "an int")
        count = int(bins)
        if not 1 <= count < MAX_CANDIDATES:
            raise InvalidArgumentError("bins", bins, f"between 1 and {MAX_CANDIDATES - 1}")
        step = upper / count - lower / count  # (never overflows, unlike upper − lower)
        grid = [min(max(lower + step * j, lower), upper) for j in range(count)] + [upper]
        if any(not b > a for a, b in zip(grid, grid[1:])):
            raise InvalidArgumentError("bins", bins, f"few enough that {count} + 1 evenly spaced "
                                       f"candidates in [{lower}, {upper}] are distinct doubles")
        return tuple(grid)
    if isinstance(candidates, (str, bytes, set, frozenset, dict)) or not hasattr(
            candidates, "__iter__"):
        raise InvalidTypeError("candidates", candidates, "an increasing sequence of numbers")
    out: list[float] = []
    for i, c in enumerate(candidates):
        if isinstance(c, bool) or not isinstance(c, numbers.Real):
            raise InvalidTypeError(f"candidates[{i}]", c, "a real number")
        x = float(c)
        if not (math.isfinite(x) and lower <= x <= upper):
            raise InvalidArgumentError(f"candidates[{i}]", c, f"a number in [{lower}, {upper}]")
        if out and not x > out[-1]:
            raise InvalidArgumentError(f"candidates[{i}]", c, "greater than the one before it "
                                       "(candidates increase)")
        out.append(x)
    if not 1 <= len(out) <= MAX_CANDIDATES:
        raise InvalidArgumentError("candidates", f"a sequence of {len(out)}",
                                   f"between 1 and {MAX_CANDIDATES} candidates")
    return tuple(out)
