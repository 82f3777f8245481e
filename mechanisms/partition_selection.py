"""Private partition selection by a Laplace threshold: which group keys to release, (ε, δ)-DP.

Invariant: the threshold and the noise law are functions of (ε, δ, L0) alone, fixed at
construction; the value is each present key's count of distinct units (after each unit was
bounded to at most L0 keys), and only the set of keys that clear the threshold is released — never
a count. A key that only one unit creates is released with probability at most δ/L0, so the at
most L0 keys a removed unit can create are released together with probability at most δ.
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
    1 + e^{−a} → 2: T − τ lies in [0, 1.5) (ln(2/(1 + e^{−a}))/a < 1/2, plus the ceiling)."""
    a = float(rate)
    m = max(1, math.ceil(math.log(1.0 / (delta_per_key * (1.0 + math.exp(-a)))) / a))
    while _tail(a, m) > delta_per_key * (1.0 - 1e-9):
        m += 1
    return m + 1


class PartitionSelection(Mechanism):
    """Releases the keys whose noisy count of distinct units clears a threshold: (ε, δ)-DP.

    Each unit is first bounded to at most L0 keys (``max_groups_per_unit``), so removing it moves
    the vector of distinct-unit counts of the keys the two tables share by at most L0 in L1 norm:
    discrete Laplace noise of rate ε/L0 (P(Z = z) ∝ exp(−ε|z|/L0), the geometric mechanism of
    Ghosh–Roughgarden–Sundararajan 2009, sampled exactly: Canonne–Kamath–Steinke 2020, Alg. 2)
    makes the selection among those keys ε-DP. A key present only through the removed unit has
    count 1 and is released only if 1 + Z >= T; T (``selection_threshold``) makes that at most
    δ/L0, so the removed unit's (at most L0) own keys appear with probability at most δ — a union
    bound, where Google's C++ ``LaplacePartitionSelection`` (used by PipelineDP) uses the slightly
    larger 1 − (1 − δ)^{1/L0}. Wilson et al., "Differentially Private SQL with Bounded User
    Contribution", PoPETs 2020, §5 (Laplace threshold τ = 1 + L0·ln(1/(2δ/L0))/ε for the continuous
    noise); proof in docs/theory.md, "Private partition selection".

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1): the probability bound on releasing any key of one unit alone.
        max_groups_per_unit: L0, the most keys one unit contributes to after bounding.

    >>> m = PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=1)
    >>> m.cost, m.threshold
    (Budget(epsilon=1.0, delta=1e-06), 15)
    """

    def __init__(self, epsilon: float, *, delta: float, max_groups_per_unit: int) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.delta = _validate.probability("delta", delta, low_open=True)
        if not self.delta < 1.0:
            raise InvalidArgumentError("delta", delta, "a number in (0, 1)")
        self.max_groups_per_unit = _validate.positive_int("max_groups_per_unit",
                                                          max_groups_per_unit)
        rate = dyadic_rate(self.epsilon, self.max_groups_per_unit)
        self._s, self._t = rate.numerator, rate.denominator
        self.threshold = selection_threshold(rate, self.delta / self.max_groups_per_unit)
        self.scale = self._t / self._s  # the noise's scale 1/a = L0/ε (before any rounding)
        self.declare(Budget(self.epsilon, self.delta), noise="exact")

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta,
                "max_groups_per_unit": self.max_groups_per_unit, "threshold": self.threshold}

    def prepare(self, value: Any) -> np.ndarray:
        """The distinct-unit count of each present key: a one-dimensional array of integers >= 1
        (empty: no key present).

        Raises:
            InvalidDataTypeError: not a one-dimensional array of integers.
            InvalidDataError: a count below 1 (a key no unit is in is not present).
        """
        arr = np.asarray(value)
        if arr.ndim != 1 or (arr.size and (arr.dtype == bool
                                           or not np.issubdtype(arr.dtype, np.integer))):
            raise InvalidDataTypeError("value", value, "a one-dimensional array of integer "
                                       "counts of distinct units")
        arr = arr.astype(np.int64)
        if arr.size and int(arr.min()) < 1:
            raise InvalidDataError("value", value, "counts of at least 1 (one per present key)")
        return arr

    def draw(self, value: np.ndarray, sampler: Sampler) -> np.ndarray:
        """A boolean mask: True for each key released."""
        if value.size == 0:
            return np.zeros(0, dtype=bool)
        noise = discrete_laplace_array(sampler.bits, self._s, self._t, value.size)
        return np.asarray(value + noise >= self.threshold)
