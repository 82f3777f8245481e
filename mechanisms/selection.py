"""Selection mechanisms: pick one of a public set of candidates (or categories) privately.

Invariant: the candidates and every noise scale are fixed at construction; the only data-dependent
input is the score vector (or, for randomized response, the true category), validated before any
debit; only the selected candidate is released — never a noisy score. Each mechanism costs (ε, 0).
"""

from __future__ import annotations

import math
import numbers
import sys
from fractions import Fraction
from abc import abstractmethod
from collections.abc import Hashable
from typing import Any

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
)
from dpbudget.mechanisms.base import Mechanism, array_as_float, noise_kind
from dpbudget.mechanisms.bits import RandomBits
from dpbudget.mechanisms.exact import bernoulli_exp, discrete_laplace_array
from dpbudget.mechanisms.grid import ceil_log2
from dpbudget.mechanisms.sampling import Sampler

__all__ = ["Exponential", "PermuteAndFlip", "RandomizedResponse", "ReportNoisyMax"]


def _candidates(name: str, values: Any, minimum: int) -> tuple[Any, ...]:
    """A tuple of at least ``minimum`` distinct hashable candidates (no NaN)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidTypeError(name, values, "a sequence of candidates")
    if isinstance(values, (set, frozenset, dict)) or type(values).__name__ in ("dict_keys",
                                                                                 "dict_values"):
        # Scores are matched to candidates by position: an unordered collection has no position
        # that is the same from one run (or process) to the next.
        raise InvalidTypeError(name, values, "an ordered sequence of candidates (a list or "
                               "tuple; a set has no stable order)")
    out = tuple(values)
    if len(out) < minimum:
        raise InvalidArgumentError(name, values, f"a sequence of at least {minimum} candidates")
    seen: dict[Any, int] = {}
    for i, c in enumerate(out):
        if not isinstance(c, Hashable):
            raise InvalidTypeError(f"{name}[{i}]", c, "a hashable candidate")
        if isinstance(c, numbers.Real) and not math.isfinite(c):
            raise InvalidArgumentError(f"{name}[{i}]", c, "a candidate other than NaN or inf")
        if c in seen:
            raise InvalidArgumentError(f"{name}[{i}]", c,
                                       f"distinct from every other candidate (repeats index "
                                       f"{seen[c]})")
        seen[c] = i
    return out


class _NoisyArgmax(Mechanism):
    """Releases one candidate, chosen with a law that depends on the scores.

    The scale is 2Δ/ε, or Δ/ε for monotonic scores (between neighbours every score moves in the
    same direction). With ``noise="exact"`` (the default) each subclass samples its law exactly
    (``_exact``: exact Bernoulli(exp(−γ)) draws on the scores' exact rational values, or integer
    noise on a grid); ``noise="float"`` is the textbook float path (argmax of score + float noise,
    ``_noise``), an explicit opt-out.
    """

    def __init__(self, epsilon: float, *, candidates: Any, sensitivity: float,
                 monotonic: bool = False, noise: str = "exact") -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.candidates = _candidates("candidates", candidates, 1)
        self.sensitivity = _validate.positive("sensitivity", sensitivity)
        if not isinstance(monotonic, bool):
            raise InvalidTypeError("monotonic", monotonic, "True or False")
        self.monotonic = monotonic
        self.scale = _numeric.div_up(
            self.sensitivity if monotonic else 2.0 * self.sensitivity, self.epsilon)
        self._noise_kind = noise_kind(noise)
        # γ_r = (u* − u_r)·rate is the exact exponent of the selection law.
        self._rate = Fraction(self.epsilon) / (Fraction(self.sensitivity) * (1 if monotonic else 2))
        self.declare(Budget(self.epsilon), noise=self._noise_kind)


    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "candidates": len(self.candidates),
                "sensitivity": self.sensitivity, "monotonic": self.monotonic, "scale": self.scale,
                "noise": self._noise_kind}

    def prepare(self, value: Any) -> np.ndarray:
        """One finite real score per candidate, as a ``float64`` array.

        Raises:
            InvalidTypeError: not a sequence of real numbers.
            InvalidArgumentError: the wrong length, or a NaN / infinite score.
        """
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise InvalidDataTypeError("scores", value, "a sequence with one real score per candidate")
        try:
            arr = np.asarray(value)
        except Exception:  # a ragged nested sequence (or an object whose conversion fails)
            raise InvalidDataTypeError("scores", value, "a flat sequence of real numbers") from None
        if (arr.dtype == bool or not np.issubdtype(arr.dtype, np.number)
                or np.issubdtype(arr.dtype, np.complexfloating)):
            raise InvalidDataTypeError("scores", value, "a sequence of real numbers")
        if arr.shape != (len(self.candidates),):
            raise InvalidDataError("scores", value, f"one score per candidate, shape "
                                   f"({len(self.candidates)},)")
        arr = np.asarray(array_as_float("scores", value, arr), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise InvalidDataError("scores", value, "finite everywhere",
                                   f"; scores[{bad[0]}] is not finite")
        return arr

    def draw(self, value: np.ndarray, sampler: Sampler) -> Any:
        if self._noise_kind == "exact":
            return self.candidates[self._exact(value, sampler.bits)]
        return self.candidates[int(np.argmax(value + self._noise(sampler, value.size)))]

    def _gap(self, value: np.ndarray, top: Fraction, r: int) -> Fraction:
        """γ_r = (u* − u_r)·rate, exactly (the scores are doubles, hence exact rationals)."""
        return (top - Fraction(float(value[r]))) * self._rate

    @abstractmethod
    def _exact(self, value: np.ndarray, bits: RandomBits) -> int: ...

    @abstractmethod
    def _noise(self, sampler: Sampler, n: int) -> np.ndarray: ...


class Exponential(_NoisyArgmax):
    """The exponential mechanism: P[r] ∝ exp(ε u(x, r)/(2Δu)) (ε/Δu in the exponent if monotonic).

    McSherry and Talwar, FOCS 2007, Thm 6 (Dwork–Roth 2014 Thm 3.10). Sampled exactly by rejection
    (von Neumann 1951): propose r uniformly, accept it with probability exp(−γ_r),
    γ_r = ε(u* − u_r)/(2Δu) ≥ 0 for the top score u*, an exact Bernoulli(exp(−γ)) on the exact
    rational γ_r (Canonne–Kamath–Steinke 2020, Alg. 1); an accepted r has probability
    ∝ exp(−γ_r) ∝ exp(ε u_r/(2Δu)), and the expected number of proposals is at most the number of
    candidates. The float opt-out uses the Gumbel-max trick (Gumbel 1954; Durfee–Rogers 2019 §3).
    Cost (ε, 0).

    Only ``epsilon`` is positional; every other parameter is keyword-only (here and in
    ``ReportNoisyMax`` and ``PermuteAndFlip``), so that two numbers cannot be swapped (issue 30).

    Args:
        epsilon: ε > 0.
        candidates: the public candidates, distinct and hashable.
        sensitivity: Δu > 0, the sensitivity of every score.
        monotonic: True only if all scores move in the same direction between neighbours.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> m = Exponential(epsilon=1.0, candidates=("a", "b", "c"), sensitivity=1.0)
    >>> acc.release(m, [0.0, 40.0, 1.0])
    'b'
    """

    def _exact(self, value: np.ndarray, bits: RandomBits) -> int:
        top = Fraction(float(value.max()))
        n = value.size
        while True:
            r = bits.below(n)
            gap = self._gap(value, top, r)
            if bernoulli_exp(bits, gap.numerator, gap.denominator):
                return r

    def _noise(self, sampler: Sampler, n: int) -> np.ndarray:
        noise: np.ndarray = sampler.gumbel(self.scale, size=n)
        return noise


class ReportNoisyMax(_NoisyArgmax):
    """Report noisy max: argmax_r u_r + Lap(2Δ/ε) (Lap(Δ/ε) for monotonic scores); only the argmax.

    Dwork–Roth 2014, Claim 3.9 (counting queries, Lap(1/ε)); for general scores of sensitivity Δ
    the scale is 2Δ/ε (docs/theory.md §3). Releasing the noisy maximum itself is a known broken variant
    and is not possible here. Cost (ε, 0). Same arguments as :class:`Exponential`.

    Exact noise (the default): the scores are rounded to a grid g = 2^⌈log₂(scale/2^40)⌉, so each
    moves by at most D = ⌊Δ/g⌋ + 1 grid steps between neighbours; each gets discrete Laplace noise
    P(z) ∝ exp(−|z|/t) with t = ⌈2D/ε⌉ (⌈D/ε⌉ monotonic), and ties go to the lowest index. The
    Dwork–Roth proof carries over: with the other noises fixed, candidate i wins iff Z_i ≥ T_i for
    an integer threshold that moves by at most 2D (D, both ways, when monotonic) between
    neighbours, and P(Z ≥ m − k) ≤ e^{k/t} P(Z ≥ m) for the discrete Laplace (docs/exact-noise.md).

    >>> m = ReportNoisyMax(epsilon=0.5, candidates=[10, 20, 30], sensitivity=1.0)
    >>> round(m.scale, 12), m.cost
    (4.0, Budget(epsilon=0.5, delta=0.0))
    """

    def __init__(self, epsilon: float, *, candidates: Any, sensitivity: float,
                 monotonic: bool = False, noise: str = "exact") -> None:
        super().__init__(epsilon, candidates=candidates, sensitivity=sensitivity,
                         monotonic=monotonic, noise=noise)
        spread = 1 if monotonic else 2
        scale = spread * Fraction(self.sensitivity) / Fraction(self.epsilon)
        k = ceil_log2(scale / 2 ** 40)
        if not -1074 <= k <= 1023:
            raise OverflowError("the noise grid is not a finite, non-zero double")
        self._g = math.ldexp(1.0, k)
        steps = math.floor(Fraction(self.sensitivity) / Fraction(2) ** k) + 1  # D, in grid steps
        self._t = math.ceil(spread * steps / Fraction(self.epsilon))
        self._limit = sys.float_info.max * min(self._g, 1.0) / 4.0

    def prepare(self, value: Any) -> np.ndarray:
        arr = super().prepare(value)
        if self._noise_kind == "exact" and not bool(np.all(np.abs(arr) <= self._limit)):
            raise InvalidDataError("scores", value, f"at most {self._limit:.6g} in magnitude "
                                   "(the noise grid of this scale cannot represent more)")
        return arr

    def _exact(self, value: np.ndarray, bits: RandomBits) -> int:
        steps = np.rint(value / self._g)  # exact integers (a power-of-two division)
        noise = discrete_laplace_array(bits, 1, self._t, value.size)
        if noise.dtype != object and float(np.abs(steps).max()) < 2.0 ** 52 \
                and int(np.abs(noise).max()) < 1 << 52:
            return int(np.argmax(steps + noise.astype(np.float64)))  # exact sums; first of ties
        noisy = [int(q) + int(z) for q, z in zip(steps.tolist(), noise.tolist())]
        return noisy.index(max(noisy))  # the lowest index among ties

    def _noise(self, sampler: Sampler, n: int) -> np.ndarray:
        noise: np.ndarray = sampler.laplace(self.scale, size=n)
        return noise


class PermuteAndFlip(_NoisyArgmax):
    """Permute-and-flip: argmax_r u_r + Exponential(2Δ/ε) (mean Δ/ε for monotonic scores).

    McKenna and Sheldon, NeurIPS 2020 (ε-DP, never worse in expected score than the exponential
    mechanism). Exact noise (the default) runs their algorithm: visit the candidates in a uniformly
    random order (drawn lazily, exactly) and return the first r that passes Bernoulli(exp(−γ_r)),
    γ_r = ε(u* − u_r)/(2Δ) (ε/Δ monotonic), an exact Bernoulli on the exact rational γ_r
    (Canonne–Kamath–Steinke 2020, Alg. 1); the top candidate always passes. The float opt-out is
    report-noisy-max with exponential noise, the same law (Ding, Kifer, et al. 2021). Cost (ε, 0);
    not ε-bounded-range, so no tighter zCDP cost is claimed. Same arguments as
    :class:`Exponential`.

    >>> PermuteAndFlip(epsilon=1.0, candidates=["x", "y"], monotonic=True, sensitivity=1.0).scale
    1.0000000000000002
    """

    def _exact(self, value: np.ndarray, bits: RandomBits) -> int:
        top = Fraction(float(value.max()))
        order = list(range(value.size))
        for i in range(value.size):  # a lazy Fisher–Yates shuffle
            j = i + bits.below(value.size - i)
            order[i], order[j] = order[j], order[i]
            r = order[i]
            gap = self._gap(value, top, r)
            if bernoulli_exp(bits, gap.numerator, gap.denominator):
                return r
        raise AssertionError("unreachable: the top candidate always passes")  # pragma: no cover

    def _noise(self, sampler: Sampler, n: int) -> np.ndarray:
        noise: np.ndarray = sampler.exponential(self.scale, size=n)
        return noise


class RandomizedResponse(Mechanism):
    """Randomized response: report the true category with p = e^ε/(e^ε + k − 1), otherwise a
    uniformly random other one (binary: p = e^ε/(1 + e^ε)).

    Warner 1965; k-ary form as in Kairouz, Oh, Viswanath 2016 ("Discrete distribution estimation
    under local privacy", k-RR): the ratio of any output's probabilities under two inputs is at most
    p/((1 − p)/(k − 1)) = e^ε, so it is (ε, 0)-DP.

    Exact noise (the default): draw a category j uniformly; the true one is kept, another is
    kept with probability e^{−ε} (an exact Bernoulli(exp(−ε)) on ε's exact rational value,
    Canonne–Kamath–Steinke 2020, Alg. 1), else draw again. The truth then has probability
    1/(1 + (k − 1)e^{−ε}) = p exactly and every other category (1 − p)/(k − 1). The float
    opt-out compares a float uniform with p rounded down (never more truthful).

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: ε > 0.
        categories: the k ≥ 2 public categories, distinct and hashable.
        noise: ``"exact"`` (default) or ``"float"``.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(10.0), rng=0)
    >>> acc.release(RandomizedResponse(epsilon=8.0, categories=("yes", "no")), "yes")
    'yes'
    """

    def __init__(self, epsilon: float, *, categories: Any, noise: str = "exact") -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.categories = _candidates("categories", categories, 2)
        self._index = {c: i for i, c in enumerate(self.categories)}
        k = len(self.categories)
        self.p = math.nextafter(1.0 / (1.0 + (k - 1) * math.exp(-self.epsilon)), 0.0)
        self._noise_kind = noise_kind(noise)
        exponent = Fraction(self.epsilon)
        self._e_num, self._e_den = exponent.numerator, exponent.denominator
        self.declare(Budget(self.epsilon), noise=self._noise_kind)


    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "categories": len(self.categories), "p": self.p,
                "noise": self._noise_kind}

    def prepare(self, value: Any) -> int:
        """The index of the true category.

        Raises:
            InvalidTypeError: an unhashable value.
            InvalidArgumentError: not one of the categories.
        """
        if not isinstance(value, Hashable):
            raise InvalidDataTypeError("value", value, "one of the categories")
        index = self._index.get(value)
        if index is None:
            raise InvalidDataError("value", value, f"one of the {len(self.categories)} "
                                       f"categories")
        return index

    def draw(self, value: int, sampler: Sampler) -> Any:
        if self._noise_kind == "exact":
            bits = sampler.bits
            k = len(self.categories)
            # The loop runs against index 0, not the true index, so that the number of draws
            # (and the time taken) does not depend on the data; the result is then relabelled
            # (0 <-> value), a bijection that maps the law onto the one the cost is for.
            while True:
                j = bits.below(k)
                if j == 0 or bernoulli_exp(bits, self._e_num, self._e_den):
                    break
            return self.categories[value if j == 0 else (0 if j == value else j)]
        if sampler.uniform() < self.p:
            return self.categories[value]
        other = sampler.index(len(self.categories) - 1)
        return self.categories[other + (other >= value)]
