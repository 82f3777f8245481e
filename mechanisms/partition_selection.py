"""Private partition selection by a Laplace threshold, in one step: each key's noisy count,
released only if it clears a threshold, (ε, δ)-DP.

Invariant: the threshold and the noise law are functions of (ε, δ, L0, L∞, C) alone, fixed at
construction; the value is each present key's count (of rows, or of distinct units) after each
unit was bounded, and only the noisy counts that clear the threshold are released — nothing of a
key below it, not even its noisy count. A key that only one unit creates has a count of at most
L∞ (that unit's rows in one key) and is released with probability at most δ/L0, so the at most
L0 keys a removed unit can create are released together with probability at most δ.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError, \
    InvalidDataTypeError
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.discrete import dyadic_rate
from dpbudget.mechanisms.exact import discrete_laplace_array
from dpbudget.mechanisms.sampling import Sampler

__all__ = ["PartitionSelection", "selection_threshold"]


def _tail(a: float, m: int) -> float:
    """P(Z >= m) for the discrete Laplace P(Z = z) ∝ exp(−a|z|), m >= 1: e^{−am}/(1 + e^{−a})."""
    return math.exp(-a * m) / (1.0 + math.exp(-a))


def selection_threshold(rate: Fraction, delta_per_key: float) -> int:
    """The smallest integer T >= 2 with P(1 + Z >= T) <= ``delta_per_key``, Z discrete Laplace of
    rate a (P(Z = z) ∝ exp(−a|z|)).

    P(1 + Z >= T) = e^{−a(T−1)}/(1 + e^{−a}) (a geometric tail), so T − 1 is
    ⌈ln(1/(δ_key(1 + e^{−a})))/a⌉, checked and raised by one step while a float rounding could
    leave the tail above δ_key (a relative margin of 1e-9). The continuous Laplace threshold
    τ = 1 + ln(1/(2δ_key))/a (Korolova et al. 2009; Wilson et al. 2020, §5) is the same with
    1 + e^{−a} → 2: T − τ lies in [0, 1.5) (ln(2/(1 + e^{−a}))/a < 1/2, plus the ceiling). For a
    key whose count can reach m, not 1, the threshold is T + m − 1 (the same tail, shifted)."""
    a = float(rate)
    m = max(1, math.ceil(math.log(1.0 / (delta_per_key * (1.0 + math.exp(-a)))) / a))
    while _tail(a, m) > delta_per_key * (1.0 - 1e-9):
        m += 1
    return m + 1


class PartitionSelection(Mechanism):
    """Releases the noisy count of each key that clears a threshold, in one step: (ε, δ)-DP.

    Each unit is first bounded: to at most L0 keys (``max_groups_per_unit``) with at most L∞ rows
    in each (``max_rows_per_group``), at most C rows in all (``max_rows_per_unit``). Removing it
    moves the vector of counts of the keys the two tables share by at most Δ₁ = min(L0·L∞, C) in
    L1 norm: discrete Laplace noise of rate ε/Δ₁ (P(Z = z) ∝ exp(−ε|z|/Δ₁), the geometric
    mechanism of Ghosh–Roughgarden–Sundararajan 2009, sampled exactly: Canonne–Kamath–Steinke
    2020, Alg. 2) makes those noisy counts, and so which of them clear the threshold, ε-DP. A key
    present only through the removed unit has count c <= min(L∞, C) and is released only if
    c + Z >= T; T makes that at most δ/min(L0, C), so the removed unit's own keys (at most L0, or
    C: one row each) appear with probability at most δ — a union bound. Counting rows: L∞ rows
    per key (C with a total cap alone: L0 = L∞ = C, Δ₁ = C); counting distinct units: one per key
    (L∞ = 1, Δ₁ = L0, the default). The construction of Wilson et al., "Differentially Private
    SQL with Bounded User Contribution", PoPETs 2020, §5 (τ = 1 + L0·ln(1/(2δ/L0))/ε for
    distinct units, continuous noise), of SmartNoise SQL's ``censor_dims`` (τ = C·(1 −
    ln(2δ/C)/ε) on rows) and OpenDP's ``make_laplace_threshold``; Google's C++
    ``LaplacePartitionSelection`` (PipelineDP) takes 1 − (1 − δ)^{1/L0} per key, slightly more
    than δ/L0. Proof in docs/theory.md, "Private partition selection".

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1): the probability bound on releasing any key of one unit alone.
        max_groups_per_unit: L0, the most keys one unit contributes to after bounding.
        max_rows_per_group: L∞, the most one unit adds to one key's count (1: distinct units).
        max_rows_per_unit: C, the most one unit adds to all counts together (None: L0·L∞).

    >>> m = PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=1)
    >>> m.cost, m.threshold
    (Budget(epsilon=1.0, delta=1e-06), 15)
    >>> PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=20, max_rows_per_group=20,
    ...                    max_rows_per_unit=20).threshold   # 20 rows per unit: SmartNoise's 342.4
    343
    """

    def __init__(self, epsilon: float, *, delta: float, max_groups_per_unit: int,
                 max_rows_per_group: int = 1, max_rows_per_unit: int | None = None) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.delta = _validate.probability("delta", delta, low_open=True)
        if not self.delta < 1.0:
            raise InvalidArgumentError("delta", delta, "a number in (0, 1)")
        self.max_groups_per_unit = _validate.positive_int("max_groups_per_unit",
                                                          max_groups_per_unit)
        self.max_rows_per_group = _validate.positive_int("max_rows_per_group",
                                                         max_rows_per_group)
        self.max_rows_per_unit = None if max_rows_per_unit is None else \
            _validate.positive_int("max_rows_per_unit", max_rows_per_unit)
        total = self.max_rows_per_unit
        cap = math.inf if total is None else total
        self.sensitivity = int(min(self.max_groups_per_unit * self.max_rows_per_group, cap))
        lone = int(min(self.max_rows_per_group, cap))  # a lone key's count, at most
        keys = int(min(self.max_groups_per_unit, cap))  # lone keys of one unit, at most
        rate = dyadic_rate(self.epsilon, self.sensitivity)
        self._s, self._t = rate.numerator, rate.denominator
        self.threshold = selection_threshold(rate, self.delta / keys) + lone - 1
        self.scale = self._t / self._s  # the noise's scale 1/a = Δ₁/ε (before any rounding)
        self.declare(Budget(self.epsilon, self.delta), noise="exact")

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta,
                "max_groups_per_unit": self.max_groups_per_unit,
                "max_rows_per_group": self.max_rows_per_group,
                "max_rows_per_unit": self.max_rows_per_unit, "threshold": self.threshold}

    def prepare(self, value: Any) -> np.ndarray:
        """The count of each present key (rows, or distinct units): a one-dimensional array of
        integers >= 1 (empty: no key present).

        Raises:
            InvalidDataTypeError: not a one-dimensional array of integers.
            InvalidDataError: a count below 1 (a key no row is in is not present).
        """
        arr = np.asarray(value)
        if arr.ndim != 1 or (arr.size and (arr.dtype == bool
                                           or not np.issubdtype(arr.dtype, np.integer))):
            raise InvalidDataTypeError("value", value, "a one-dimensional array of integer "
                                       "counts")
        arr = arr.astype(np.int64)
        if arr.size and int(arr.min()) < 1:
            raise InvalidDataError("value", value, "counts of at least 1 (one per present key)")
        return arr

    def draw(self, value: np.ndarray, sampler: Sampler) -> np.ndarray:
        """Per key, its noisy count if that clears the threshold, else 0 (a released count is
        at least ``threshold`` >= 2, so 0 means "not released" and carries nothing else)."""
        if value.size == 0:
            return np.zeros(0, dtype=np.int64)
        noisy = value + discrete_laplace_array(sampler.bits, self._s, self._t, value.size)
        return np.where(noisy >= self.threshold, noisy, 0).astype(np.int64)
