"""Propose–test–release (Dwork and Lei, STOC 2009; Dwork–Roth 2014, §7.3): answer with noise
scaled to a *proposed* bound on the local sensitivity, after a private test that the data is far
from any dataset where that bound fails.

Invariant: the bound, ε, δ, the statistic and its clamping range are public and fixed at
construction; the data is validated in ``prepare``, before any debit; the distance is computed and
tested, and the answer drawn, only in ``draw``, after the whole cost was debited. A refused
test is a typed result (``PTRRefused``), charged like an answer: the test itself spent budget.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError
from dpbudget.mechanisms import guarded
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.exact import discrete_laplace
from dpbudget.mechanisms.laplace import Laplace
from dpbudget.mechanisms.rows import clamp_range, row_values
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.sums import exact_sum

__all__ = ["PTRMean", "PTRMedian", "PTRRefused", "PTRStatistic", "ProposeTestRelease"]


class PTRRefused:
    """What ``ProposeTestRelease`` releases when its private test fails: no answer. The test's
    share of the budget was spent (the ledger shows the whole cost). Falsy; shows no data."""

    __slots__ = ("bound",)

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PTRRefused) and other.bound == self.bound

    def __hash__(self) -> int:
        return hash(("PTRRefused", self.bound))

    def __repr__(self) -> str:
        return f"PTRRefused(bound={self.bound!r})"


class PTRStatistic(ABC):
    """A statistic PTR can answer: its value, and ``distance(data, bound, cap)``: the number of
    rows to change (under ``neighbouring``) to reach a dataset whose local sensitivity exceeds
    ``bound``, or ``cap`` if that is larger. Contract for a subclass: the distance must never be
    larger than the true one, and must change by at most 1 between neighbouring datasets (it is
    released with Laplace noise of sensitivity 1); whatever it returns, ``min(·, cap)`` is used.
    Neither method may raise or keep state: a distance that raises — anything, ``BaseException``
    included (``KeyboardInterrupt``, ``SystemExit``, a subclass of its own) — counts as 0, a
    value that raises (or is not a finite number) as the range's midpoint, since an escaping
    error would itself be an un-noised release. A real Ctrl-C is held until the outcome is
    drawn, then delivered (``dpbudget.mechanisms.guarded``). ``lower`` and ``upper`` are keyword-only
    (``PTRMedian(lower=0, upper=100)``), so that the range cannot be given in the wrong order.
    """

    name: str
    neighbouring: str

    def __init__(self, *, lower: float, upper: float) -> None:
        self.lower, self.upper = clamp_range(lower, upper)

    def params(self) -> dict[str, Any]:
        return {"statistic": self.name, "lower": self.lower, "upper": self.upper,
                "neighbouring": self.neighbouring}

    @abstractmethod
    def value(self, ordered: np.ndarray) -> float | Fraction:
        """The statistic of the clamped, sorted data (a ``Fraction`` is released exactly)."""

    @abstractmethod
    def distance(self, ordered: np.ndarray, bound: float, cap: int) -> int:
        """As in the class docstring, on the clamped, sorted data."""


class PTRMean(PTRStatistic):
    """The mean of values clamped into [lower, upper], add/remove neighbours (n is private).

    Removing a row v from n rows moves the mean by (v − mean)/(n − 1) = (v − mean')/n, with
    mean' the mean of the other n − 1 rows, and adding one moves it by (v − mean)/(n + 1); so the
    local sensitivity of n rows is at most B(n) = (U − L)/n (infinite for n = 0), and the distance
    to a dataset where it may exceed b is the number of rows that must be removed before B exceeds
    b: ``min{k : B(n − k) > b}``, a function of n that moves by at most 1 between neighbours (the
    course notes' (U − L)/(n − k)).

    The mean is exact (the exact sum over n, a ``Fraction``; ``dpbudget.mechanisms.sums``): a float mean
    rounds, so the bound would not hold for it.
    """

    name = "mean"
    neighbouring = "add/remove"

    def value(self, ordered: np.ndarray) -> float | Fraction:
        return exact_sum(ordered) / ordered.size if ordered.size else (self.lower + self.upper) / 2

    def distance(self, ordered: np.ndarray, bound: float, cap: int) -> int:
        width = Fraction(self.upper) - Fraction(self.lower)
        # B(m) = width/m <= b  ⇔  m >= width/b; the least such m (at least 1), exactly.
        least = max(1, math.ceil(width / Fraction(bound)))
        return max(0, min(cap, ordered.size - least + 1))


class PTRMedian(PTRStatistic):
    """The median (the ⌈n/2⌉-th smallest value) of values clamped into [lower, upper],
    replace-one neighbours (n is public).

    Nissim–Raskhodnikova–Smith 2007, §3.1: with the sorted values x_1 ≤ … ≤ x_n, x_i = lower for
    i < 1 and upper for i > n, the largest local sensitivity at distance k is
    A^(k)(x) = max_{0≤t≤k+1} (x_{m+t} − x_{m+t−k−1}), and the distance to a dataset whose local
    sensitivity exceeds b is ``min{k : A^(k)(x) > b}``.
    """

    name = "median"
    neighbouring = "replace"

    def value(self, ordered: np.ndarray) -> float:
        return float(ordered[(ordered.size + 1) // 2 - 1]) if ordered.size else self.lower

    def distance(self, ordered: np.ndarray, bound: float, cap: int) -> int:
        n = ordered.size
        m = (n + 1) // 2  # 1-based index of the median
        pad = cap + 2
        x = np.concatenate([np.full(pad, self.lower), ordered, np.full(pad, self.upper)])
        centre = m - 1 + pad  # x[centre] is x_m
        for k in range(cap):
            # x_{m+t} − x_{m+t−k−1} for t = 0..k+1
            high, low = x[centre:centre + k + 2], x[centre - k - 1:centre + 1]
            gaps = high - low
            if (gaps > bound).any():
                return k
            # Rounding is monotone, so a true gap above the bound rounds to at least the bound:
            # only the gaps that round to it exactly need the exact difference.
            ties = np.flatnonzero(gaps == bound)
            if any(Fraction(float(high[i])) - Fraction(float(low[i])) > Fraction(bound)
                   for i in ties):
                return k
        return cap


_STATISTICS = {"mean": PTRMean, "median": PTRMedian}


class ProposeTestRelease(Mechanism):
    """Propose–test–release with a proposed local-sensitivity ``bound`` b, costing (ε, δ) in
    total: ε/2 for the test, ε/2 for the answer.

    Dwork and Lei (STOC 2009); Dwork–Roth 2014, §7.3, Thm 7.2: with γ the distance to a dataset
    whose local sensitivity exceeds b, release ⊥ if γ + Lap(1/ε₁) ≤ ln(1/δ)/ε₁, else
    f(x) + Lap(b/ε₂): (ε₁ + ε₂, δ)-DP. Here ε₁ = ε₂ = ε/2. A dataset at distance 0 passes with
    probability at most δ/2 (below: at most δ). Course notes that test against ln(2/δ)/(2ε) let it
    pass with probability ½·sqrt(δ/2) — 1.1e-3 at δ = 1e-5, a hundred times δ; not this.

    Exactness: γ is an integer, tested with exact discrete Laplace noise of rate ε₁ (still ε₁-DP
    for a sensitivity-1 integer) against the integer threshold T = ⌈ln(1/δ)/ε₁⌉ (rounded up), so
    P[pass | γ = 0] = P[Z > T] = e^{−ε₁(T+1)}/(1 + e^{−ε₁}) ≤ δ. γ is capped at T + ⌈40/ε₁⌉
    (a public constant: the capped distance still moves by at most 1). The answer is our exact
    ``Laplace(ε₂, sensitivity=b)``, clamped into [lower, upper] (post-processing).

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: total ε > 0.
        delta: δ in (0, 1).
        bound: the proposed bound b > 0 on the local sensitivity (chosen without the data).
        statistic: ``"mean"`` (``PTRMean``), ``"median"`` (``PTRMedian``), or a
            ``PTRStatistic``; each states its neighbour relation.
        lower, upper: the public clamping range (for the built-in statistics).

    Returns (from ``Accountant.release``): the noisy statistic, or ``PTRRefused``.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0, 1e-5), rng=0)
    >>> m = ProposeTestRelease(1.0, delta=1e-6, bound=1.0, statistic="median", lower=0, upper=100)
    >>> answer = acc.release(m, [50.0] * 1001)
    >>> isinstance(answer, float) and 40 <= answer <= 60
    True
    >>> acc.spent()
    Budget(epsilon=1.0, delta=1e-06)
    """

    _may_be_zero = ("lower", "upper")

    def __init__(self, epsilon: float, *, delta: float, bound: float, statistic: Any = "median",
                 lower: float | None = None, upper: float | None = None) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.delta = _validate.probability("delta", delta, low_open=True)
        self.bound = _validate.positive("bound", bound)
        if isinstance(statistic, str):
            if statistic not in _STATISTICS:
                raise InvalidArgumentError("statistic", statistic,
                                           f"one of {sorted(_STATISTICS)} or a PTRStatistic")
            if lower is None or upper is None:
                raise InvalidArgumentError("lower", lower, "the public clamping range (lower "
                                           "and upper) of the built-in statistics")
            statistic = _STATISTICS[statistic](lower=lower, upper=upper)
        elif not isinstance(statistic, PTRStatistic):
            raise InvalidTypeError("statistic", statistic, "'mean', 'median' or a PTRStatistic")
        self.statistic = statistic
        # What the statistic says of itself is read once, here: a statistic is the caller's
        # code, and a member read after the debit could raise on what its distance() saw.
        self.lower, self.upper = clamp_range(statistic.lower, statistic.upper)
        self._statistic_params = dict(statistic.params())
        half = self.epsilon / 2
        self._answer = Laplace(half, sensitivity=self.bound)
        reach = max(abs(self.lower), abs(self.upper))
        assert self._answer.grid is not None  # (exact by construction)
        if reach > self._answer.grid.limit_for(1):  # refused now, never after the debit
            raise InvalidArgumentError("upper", self.upper, "a range whose values the "
                                       f"answer's noise grid can represent (at most "
                                       f"{self._answer.grid.limit_for(1):.6g} in magnitude)")
        self._rate = Fraction(half)  # the test's discrete Laplace: P(z) ∝ exp(−|z|·ε₁)
        threshold = _numeric.div_up(-math.log(self.delta), half) * (1 + 1e-12)
        self.threshold = math.ceil(threshold)
        self._cap = self.threshold + math.ceil(40 / half)
        self.declare(Budget(self.epsilon, self.delta), noise="exact")

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta, "bound": self.bound,
                "threshold": self.threshold, **self._statistic_params, "noise": "exact"}

    def prepare(self, value: Any) -> np.ndarray:
        """The values, clamped into [lower, upper] and sorted; NaN refused naming its index."""
        data = row_values(value, "value")
        return np.sort(np.clip(data, self.lower, self.upper))

    def draw(self, value: np.ndarray, sampler: Sampler) -> float | PTRRefused:
        # A statistic (a user's PTRStatistic) that raises must not tell, without noise, that it
        # did — whatever it raises, BaseException included (``dpbudget.mechanisms.guarded``): its distance
        # is then taken as 0 (always a lower bound: the test passes with probability <= δ), its
        # value as the range's midpoint. A real Ctrl-C is delivered once the outcome is drawn.
        with guarded.interrupts_deferred():
            return self._draw(value, sampler)

    def _draw(self, value: np.ndarray, sampler: Sampler) -> float | PTRRefused:
        gamma = guarded.call(_distance, self.statistic, value, self.bound, self._cap)
        gamma = 0 if gamma is guarded.FAILED else max(0, min(gamma, self._cap))
        z = discrete_laplace(sampler.bits, self._rate.numerator, self._rate.denominator)
        if gamma + z <= self.threshold:
            return PTRRefused(self.bound)
        lower, upper = self.lower, self.upper
        statistic = guarded.call(_value, self.statistic, value)
        statistic = math.nan if statistic is guarded.FAILED else min(max(statistic, lower), upper)
        if not math.isfinite(statistic):
            statistic = (lower + upper) / 2
        answer = self._answer.draw(self._answer.prepare(statistic), sampler)
        return float(min(max(answer, lower), upper))


# The statistic's methods and the conversions of what they return (a returned object's
# ``__int__``/``__float__`` is the caller's code too), run inside ``guarded.call``.
def _distance(statistic: PTRStatistic, ordered: np.ndarray, bound: float, cap: int) -> int:
    return int(statistic.distance(ordered, bound, cap))


def _value(statistic: PTRStatistic, ordered: np.ndarray) -> float | Fraction:
    value = statistic.value(ordered)
    if isinstance(value, Fraction):  # exact; rebuilt from plain ints (a subclass is the caller's)
        return Fraction(int(value.numerator), int(value.denominator))
    return float(value)
