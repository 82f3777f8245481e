"""The sparse vector technique: ``AboveThreshold``, ``Sparse`` and ``NumericSparse``.

Invariant: a sparse-vector mechanism's cost (ε, 0) is fixed at construction and covers a whole
session, however many ⊥ answers it gives. That is only true of the algorithm as proven, so the
public API cannot build the known broken variants (Lyu, Su, Li, PVLDB 2017): the query noise
scale always carries the cutoff c (there is no scale argument), a stream stops for good after c ⊤
answers (``max_positives`` is a required integer ≥ 1: there is no "no cutoff"), and only
``NumericSparse`` — which pays a separate ε₃ share for it — ever releases a number, with fresh
noise, never q_i + ν_i. Noise is drawn only by the stream, which the accountant opens after the
debit.
"""

from __future__ import annotations

import math
import numbers
import sys
from fractions import Fraction
from typing import Any

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
    MechanismExhaustedError,
)
from dpbudget.mechanisms.base import StreamMechanism, noise_kind, real_as_float
from dpbudget.mechanisms.exact import discrete_laplace, discrete_laplace_array
from dpbudget.mechanisms.grid import LaplaceGrid, ceil_log2
from dpbudget.mechanisms.sampling import Sampler

__all__ = ["AboveThreshold", "NumericSparse", "Sparse", "above_threshold_accuracy"]


class Sparse(StreamMechanism):
    """Sparse vector: answers ⊤/⊥ to a stream of queries, halting after ``max_positives`` ⊤.

    Lyu, Su, Li, "Understanding the Sparse Vector Technique for Differential Privacy", PVLDB 2017,
    Alg. 1, proven (ε₁ + ε₂)-DP there (Dwork–Roth 2014 Alg. 1, AboveThreshold, is the case c = 1):
    the threshold noise ρ = Lap(Δ/ε₁) is drawn once, when the session opens; each query gets fresh
    ν_i = Lap(2cΔ/ε₂) (Lap(cΔ/ε₂) when every query is monotonic, i.e. all move in the same
    direction between neighbours); the answer is ⊤ iff q_i + ν_i ≥ T + ρ; the stream halts after
    c ⊤. The cost is (ε, 0) with ε = ε₁ + ε₂, however many ⊥ answers are given.

    The default split ε₁:ε₂ = 1:(2c)^{2/3} (1:c^{2/3} when monotonic) minimises the variance of
    ν_i − ρ (Lyu–Su–Li's budget-allocation analysis). Scales round up, shares round down (their
    exact sum is ≤ ε).

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: the session's total ε > 0.
        threshold: the public threshold T, a finite number.
        max_positives: the cutoff c, an integer ≥ 1.
        sensitivity: Δ > 0, the sensitivity of every query in the stream.
        monotonic: True only if, between any two neighbours, all queries move in the same direction.
        split: relative shares ``(w₁, w₂)`` of ε for the threshold and the queries (positive,
            finite; e.g. ``(1, 1)`` halves ε), or None for the default.
        noise: ``"exact"`` (default) or ``"float"`` (the textbook float sampler, an opt-out).

    Exact noise: the threshold and every query are rounded to a grid g = 2^⌈log₂(b/2^40)⌉ (b the
    smaller of the two scales), so a query moves at most D = ⌊Δ/g⌋ + 1 grid steps between
    neighbours; ρ and ν_i are discrete Laplace with integer parameters t₁ = ⌈D/ε₁⌉ and
    t₂ = ⌈2cD/ε₂⌉ (⌈cD/ε₂⌉ monotonic), and the comparison is on integers. Lyu–Su–Li's proof
    (shift ρ by D and each ⊤ query's ν_i by 2D, D when monotonic) only uses pmf ratios of integer
    shifts, which the discrete Laplace bounds the same way (docs/exact-noise.md). A query beyond
    ``limit`` in magnitude is refused before the stream advances.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument (NaN threshold, c < 1, ...).

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> m = Sparse(epsilon=0.5, threshold=100.0, max_positives=2, sensitivity=1.0)
    >>> with acc.session(m) as svt:
    ...     answers = [svt.test(q) for q in (3.0, 250.0, 7.0, 400.0)]
    >>> answers, acc.spent()
    ([False, True, False, True], Budget(epsilon=0.5, delta=0.0))
    """

    _shares = 2

    def __init__(self, epsilon: float, *, threshold: float, max_positives: int,
                 sensitivity: float, monotonic: bool = False,
                 split: tuple[float, ...] | None = None, noise: str = "exact") -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.threshold = _validate.finite("threshold", threshold)
        self.max_positives = _validate.positive_int("max_positives", max_positives)
        self.sensitivity = _validate.positive("sensitivity", sensitivity)
        if not isinstance(monotonic, bool):
            raise InvalidTypeError("monotonic", monotonic, "True or False")
        self.monotonic = monotonic
        self.split = self._default_split() if split is None else _weights(split, self._shares)
        shares = _shares(self.epsilon, self.split)
        c, delta = self.max_positives, self.sensitivity
        self.epsilon_threshold, self.epsilon_queries = shares[0], shares[1]
        self.threshold_scale = _numeric.div_up(delta, shares[0])
        self.query_scale = _numeric.div_up(_numeric.mul_up(c if monotonic else 2 * c, delta),
                                           shares[1])
        self._noise_kind = noise_kind(noise)
        spread = c if monotonic else 2 * c
        low = min(Fraction(delta) / Fraction(shares[0]), spread * Fraction(delta) / Fraction(shares[1]))
        k = ceil_log2(low / 2 ** 40)
        if not -1074 <= k <= 1023:
            raise OverflowError("the noise grid is not a finite, non-zero double")
        self._g = math.ldexp(1.0, k)
        reach = math.floor(Fraction(delta) / Fraction(2) ** k) + 1  # D, in grid steps
        self._t_threshold = math.ceil(reach / Fraction(shares[0]))
        self._t_query = math.ceil(spread * reach / Fraction(shares[1]))
        self.limit = sys.float_info.max * min(self._g, 1.0) / 4.0
        if self._noise_kind == "exact" and abs(self.threshold) > self.limit:
            raise InvalidArgumentError("threshold", threshold, f"at most {self.limit:.6g} in "
                                       "magnitude for this noise scale")
        self._more_scales(shares)
        self.declare(Budget(self.epsilon), noise=self._noise_kind)


    def _default_split(self) -> tuple[float, ...]:
        c = self.max_positives
        return (1.0, float(c if self.monotonic else 2 * c) ** (2.0 / 3.0))

    def _more_scales(self, shares: tuple[float, ...]) -> None:
        """Hook for subclasses that pay for more than the threshold and the queries."""

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "threshold": self.threshold,
                "max_positives": self.max_positives, "sensitivity": self.sensitivity,
                "monotonic": self.monotonic, "epsilon_threshold": self.epsilon_threshold,
                "epsilon_queries": self.epsilon_queries, "threshold_scale": self.threshold_scale,
                "query_scale": self.query_scale, "noise": self._noise_kind}

    def accuracy(self, k: int, beta: float) -> float:
        """An α such that, with probability ≥ 1 − β over a session of ``k`` queries, every ⊤ query
        has q_i ≥ T − α and every ⊥ query has q_i ≤ T + α.

        The argument of Dwork–Roth 2014 Thm 3.24 (a union bound) applied to this mechanism's own
        scales: P(|ρ| ≥ b_T ln(2/β)) = β/2 and P(max_i |ν_i| ≥ b_Q ln(2k/β)) ≤ β/2, so
        α = b_T ln(2/β) + b_Q ln(2k/β). (Dwork–Roth Thm 3.26 is the analogue for their Alg. 2,
        which redraws the threshold after each ⊤; it does not apply verbatim to Alg. 1 here.)
        For ``AboveThreshold`` this is (6 ln(2/β) + 4 ln k)Δ/ε, never above Thm 3.24's
        8(ln k + ln(2/β))Δ/ε (:func:`above_threshold_accuracy`).

        >>> m = AboveThreshold(epsilon=1.0, threshold=0.0, sensitivity=1.0)
        >>> round(m.accuracy(1000, 0.05), 6)
        49.764298
        """
        k = _validate.positive_int("k", k)
        beta = _validate.probability("beta", beta, low_open=True)
        return (self.threshold_scale * math.log(2.0 / beta)
                + self.query_scale * math.log(2.0 * k / beta))

    def _open(self, sampler: Sampler) -> "_SparseStream":
        if self._noise_kind == "exact":
            return _ExactSparseStream(self, sampler)
        return _SparseStream(self, sampler)


class AboveThreshold(Sparse):
    """AboveThreshold: the first query whose noisy answer reaches the noisy threshold, then halt.

    Dwork–Roth 2014, Alg. 1 and Thm 3.23 (ε-DP): c = 1 with ε₁ = ε₂ = ε/2, so the threshold noise
    is Lap(2Δ/ε) and each query's noise Lap(4Δ/ε). Accuracy: :func:`above_threshold_accuracy`.

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: the session's total ε > 0.
        threshold: the public threshold T, a finite number.
        sensitivity: Δ > 0, the sensitivity of every query in the stream.

    >>> m = AboveThreshold(epsilon=0.5, threshold=100, sensitivity=1)
    >>> round(m.threshold_scale, 12), round(m.query_scale, 12), m.cost
    (4.0, 8.0, Budget(epsilon=0.5, delta=0.0))
    """

    def __init__(self, epsilon: float, *, threshold: float, sensitivity: float,
                 noise: str = "exact") -> None:
        super().__init__(epsilon, threshold=threshold, max_positives=1, sensitivity=sensitivity,
                         split=(1.0, 1.0), noise=noise)


class NumericSparse(Sparse):
    """Sparse vector that also releases a noisy value for each ⊤ (``session.query(q)``).

    Lyu–Su–Li 2017, Alg. 1 with numeric output (their NumericSVT; Dwork–Roth 2014 Alg. 3):
    on ⊤ it releases q_i + Lap(cΔ/ε₃) with fresh noise — never q_i + ν_i, whose ν_i also decided
    the comparison. The c released values cost ε₃ by basic composition, so the session costs
    ε₁ + ε₂ + ε₃ = ε. ``split`` is a triple of relative shares; the default gives half of ε to the
    values and splits the other half 1:(2c)^{2/3} (1:c^{2/3} monotonic) as ``Sparse`` does.

    >>> m = NumericSparse(epsilon=1.0, threshold=10.0, max_positives=1, split=(1, 1, 2),
    ...                   sensitivity=1.0)
    >>> round(m.answer_scale, 12), m.cost
    (2.0, Budget(epsilon=1.0, delta=0.0))
    """

    _shares = 3
    releases_values = True

    def _default_split(self) -> tuple[float, ...]:
        first, second = super()._default_split()
        return (first, second, first + second)

    def _more_scales(self, shares: tuple[float, ...]) -> None:
        self.epsilon_answers = shares[2]
        self.answer_scale = _numeric.div_up(
            _numeric.mul_up(self.max_positives, self.sensitivity), shares[2])
        # Each ⊤ value: grid Laplace on scale cΔ/ε₃, with t = ⌈c(Δ/g + 1)/ε₃⌉ so that each of the
        # at most c answers costs ε₃/c on the rounded value (basic composition: ε₃ in all).
        self._answer_grid = LaplaceGrid(shares[2], self.max_positives * self.sensitivity)
        self._t_answer = self._answer_grid.noise_parameter(self.max_positives)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "epsilon_answers": self.epsilon_answers,
                "answer_scale": self.answer_scale}

    def _open(self, sampler: Sampler) -> "_SparseStream":
        if self._noise_kind == "exact":
            return _ExactNumericSparseStream(self, sampler)
        return _NumericSparseStream(self, sampler)


def above_threshold_accuracy(k: int, beta: float, epsilon: float,
                             sensitivity: float = 1.0) -> float:
    """α = 8Δ(ln k + ln(2/β))/ε: AboveThreshold over k queries is (α, β)-accurate.

    Dwork–Roth 2014, Thm 3.24 (stated for Δ = 1; the noise scales, hence α, scale with Δ). With
    probability ≥ 1 − β the ⊤ query has q ≥ T − α and every earlier ⊥ query has q ≤ T + α.

    >>> round(above_threshold_accuracy(1000, 0.05, 1.0), 8)
    84.77307786
    """
    k = _validate.positive_int("k", k)
    beta = _validate.probability("beta", beta, low_open=True)
    eps = _validate.positive("epsilon", epsilon)
    delta = _validate.positive("sensitivity", sensitivity)
    return 8.0 * delta * (math.log(k) + math.log(2.0 / beta)) / eps


def _weights(split: Any, n: int) -> tuple[float, ...]:
    if not isinstance(split, (tuple, list)) or len(split) != n:
        raise InvalidTypeError("split", split, f"a tuple of {n} positive relative shares")
    return tuple(_validate.positive(f"split[{i}]", w) for i, w in enumerate(split))


def _shares(epsilon: float, weights: tuple[float, ...]) -> tuple[float, ...]:
    """ε·w_i/Σw, each computed exactly and rounded down, so that the shares never sum above ε."""
    total = sum(Fraction(w) for w in weights)
    out = []
    for w in weights:
        exact = Fraction(epsilon) * Fraction(w) / total
        share = float(exact)
        out.append(math.nextafter(share, 0.0) if Fraction(share) > exact else share)
    return tuple(out)


def _real(value: Any) -> float:
    """A query value as a float (the slow path: ints, numpy scalars, Fractions, ...). A query's
    value is data: errors describe it, never show it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidDataTypeError("value", value, "a real number")
    return real_as_float("value", value)


class _SparseStream:
    """A session's private state: the noisy threshold, the query-noise stream, the answer counts.

    Lean on purpose (one generator step and a comparison per query): a scalar stream answers
    hundreds of thousands of queries per second. Not thread-safe by itself: the ``Session`` that
    owns it serialises calls.
    """

    __slots__ = ("_name", "_noisy_threshold", "_noise", "_left", "_max", "answered", "positives",
                 "closed", "_sampler", "_answer_scale")

    def __init__(self, mechanism: Sparse, sampler: Sampler) -> None:
        self._name = mechanism.name
        self._noisy_threshold = mechanism.threshold + sampler.laplace(mechanism.threshold_scale)
        self._noise = sampler.laplace_stream(mechanism.query_scale)
        self._left = self._max = mechanism.max_positives
        self.answered = 0
        self.positives = 0
        self.closed = False

    def test(self, value: Any) -> bool:
        """⊤ (True) or ⊥ (False) for one query's true value."""
        if self._left <= 0:
            raise self._exhausted()
        x = value if type(value) is float else _real(value)
        if x - x != 0.0:  # NaN or infinite; the stream has not advanced
            raise InvalidDataError("value", value, "a finite number")
        self.answered += 1
        if x + next(self._noise) >= self._noisy_threshold:
            self._left -= 1
            self.positives += 1
            return True
        return False

    def close(self) -> None:
        self._left = 0
        self.closed = True

    def _exhausted(self) -> MechanismExhaustedError:
        why = ("is closed" if self.closed else
               f"reached its cutoff of {self._max} ⊤ answer{'s' if self._max > 1 else ''}")
        return MechanismExhaustedError(
            f"this {self._name} session {why} after {self.answered} queries; its cost stays "
            f"spent — open a new session to ask more", self.answered, self.positives)


class _NumericSparseStream(_SparseStream):
    def __init__(self, mechanism: NumericSparse, sampler: Sampler) -> None:
        super().__init__(mechanism, sampler)
        self._sampler = sampler
        self._answer_scale = mechanism.answer_scale

    def query(self, value: Any) -> float | None:
        """None for ⊥; for ⊤, the value plus fresh Lap(cΔ/ε₃) noise."""
        if not self.test(value):
            return None
        return float(value) + float(self._sampler.laplace(self._answer_scale))


class _ExactSparseStream(_SparseStream):
    """The stream on the grid: integer threshold, integer query noise, integer comparisons."""

    __slots__ = ("_g", "_limit", "_mechanism")

    def __init__(self, mechanism: Sparse, sampler: Sampler) -> None:
        bits = sampler.bits
        self._name = mechanism.name
        self._g = mechanism._g
        self._limit = mechanism.limit
        self._noisy_threshold = round(mechanism.threshold / self._g) + discrete_laplace(
            bits, 1, mechanism._t_threshold)
        self._noise = _integer_stream(bits, mechanism._t_query)
        self._left = self._max = mechanism.max_positives
        self.answered = 0
        self.positives = 0
        self.closed = False
        self._sampler = sampler
        self._mechanism: Any = mechanism

    def test(self, value: Any) -> bool:
        if self._left <= 0:
            raise self._exhausted()
        x = value if type(value) is float else _real(value)
        if not -self._limit <= x <= self._limit:  # NaN, infinite or off the grid: not advanced
            raise InvalidDataError("value", value, f"a finite number of magnitude at most "
                                   f"{self._limit:.6g}")
        self.answered += 1
        if round(x / self._g) + next(self._noise) >= self._noisy_threshold:
            self._left -= 1
            self.positives += 1
            return True
        return False


class _ExactNumericSparseStream(_ExactSparseStream):
    __slots__ = ()

    def query(self, value: Any) -> float | None:
        """None for ⊥; for ⊤, the value released on the answer grid with fresh exact noise."""
        if self._left <= 0:
            raise self._exhausted()
        m: NumericSparse = self._mechanism
        x = value if type(value) is float else _real(value)
        if not abs(x) <= m._answer_grid.limit:  # checked before the stream advances
            raise InvalidDataError("value", value, f"a finite number of magnitude at most "
                                   f"{m._answer_grid.limit:.6g}")
        if not self.test(x):
            return None
        answer: float = m._answer_grid.release_scalar(self._sampler.bits, x, m._t_answer)
        return answer


def _integer_stream(bits: Any, t: int) -> Any:
    """Endless independent discrete Laplace(t) draws as Python ints, drawn in growing blocks."""
    block = 16
    while True:
        yield from discrete_laplace_array(bits, 1, t, block).tolist()
        block = min(2 * block, 4096)
