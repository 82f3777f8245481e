"""Selection mechanisms: pick one of a public set of candidates (or categories) privately.

Invariant: the candidates and every noise scale are fixed at construction; the only data-dependent
input is the score vector (or, for randomized response, the true category), validated before any
debit; only the selected candidate is released — never a noisy score. Each mechanism costs (ε, 0).
"""

from __future__ import annotations

import math
import numbers
from abc import abstractmethod
from collections.abc import Hashable
from typing import Any

import numpy as np

from accountant import _numeric, _validate
from accountant.budget import Budget
from accountant.errors import (
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
)
from mechanisms.base import Mechanism
from mechanisms.sampling import Sampler

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
    """Releases the candidate whose score plus independent noise is largest.

    Subclasses choose the noise (``_noise``); the scale is 2Δ/ε, or Δ/ε for monotonic scores
    (between neighbours every score moves in the same direction).
    """

    def __init__(self, epsilon: float, candidates: Any, sensitivity: float = 1.0,
                 monotonic: bool = False) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.candidates = _candidates("candidates", candidates, 1)
        self.sensitivity = _validate.positive("sensitivity", sensitivity)
        if not isinstance(monotonic, bool):
            raise InvalidTypeError("monotonic", monotonic, "True or False")
        self.monotonic = monotonic
        self.scale = _numeric.div_up(
            self.sensitivity if monotonic else 2.0 * self.sensitivity, self.epsilon)
        self._cost = Budget(self.epsilon)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "candidates": len(self.candidates),
                "sensitivity": self.sensitivity, "monotonic": self.monotonic, "scale": self.scale}

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
        arr = arr.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise InvalidDataError("scores", value, "finite everywhere",
                                   f"; scores[{bad[0]}] is not finite")
        return arr

    def _release(self, value: np.ndarray, sampler: Sampler) -> Any:
        return self.candidates[int(np.argmax(value + self._noise(sampler, value.size)))]

    @abstractmethod
    def _noise(self, sampler: Sampler, n: int) -> np.ndarray: ...


class Exponential(_NoisyArgmax):
    """The exponential mechanism: P[r] ∝ exp(ε u(x, r)/(2Δu)) (ε/Δu in the exponent if monotonic).

    McSherry and Talwar, FOCS 2007, Thm 6 (Dwork–Roth 2014 Thm 3.10). Sampled in log space by the
    Gumbel-max trick: argmax_r u_r + Gumbel(0, 2Δu/ε) has exactly that law (Gumbel 1954; see e.g.
    Durfee–Rogers 2019 §3), and no exponential is ever computed. Cost (ε, 0).

    Args:
        epsilon: ε > 0.
        candidates: the public candidates, distinct and hashable.
        sensitivity: Δu > 0, the sensitivity of every score.
        monotonic: True only if all scores move in the same direction between neighbours.

    >>> from accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> acc.release(Exponential(epsilon=1.0, candidates=("a", "b", "c")), [0.0, 40.0, 1.0])
    'b'
    """

    def _noise(self, sampler: Sampler, n: int) -> np.ndarray:
        noise: np.ndarray = sampler.gumbel(self.scale, size=n)
        return noise


class ReportNoisyMax(_NoisyArgmax):
    """Report noisy max: argmax_r u_r + Lap(2Δ/ε) (Lap(Δ/ε) for monotonic scores); only the argmax.

    Dwork–Roth 2014, Claim 3.9 (counting queries, Lap(1/ε)); for general scores of sensitivity Δ
    the scale is 2Δ/ε (docs/theory.md §3). Releasing the noisy maximum itself is a known broken variant
    and is not possible here. Cost (ε, 0). Same arguments as :class:`Exponential`.

    >>> m = ReportNoisyMax(epsilon=0.5, candidates=[10, 20, 30], sensitivity=1.0)
    >>> round(m.scale, 12), m.cost
    (4.0, Budget(epsilon=0.5, delta=0.0))
    """

    def _noise(self, sampler: Sampler, n: int) -> np.ndarray:
        noise: np.ndarray = sampler.laplace(self.scale, size=n)
        return noise


class PermuteAndFlip(_NoisyArgmax):
    """Permute-and-flip: argmax_r u_r + Exponential(2Δ/ε) (mean Δ/ε for monotonic scores).

    McKenna and Sheldon, NeurIPS 2020 (ε-DP, never worse in expected score than the exponential
    mechanism); implemented as report-noisy-max with exponential noise, which Ding, Kifer, et al.
    2021 ("The permute-and-flip mechanism is identical to report-noisy-max with exponential
    noise") prove is the same distribution. Cost (ε, 0). Same arguments as :class:`Exponential`.

    >>> PermuteAndFlip(epsilon=1.0, candidates=["x", "y"], monotonic=True).scale
    1.0000000000000002
    """

    def _noise(self, sampler: Sampler, n: int) -> np.ndarray:
        noise: np.ndarray = sampler.exponential(self.scale, size=n)
        return noise


class RandomizedResponse(Mechanism):
    """Randomized response: report the true category with p = e^ε/(e^ε + k − 1), otherwise a
    uniformly random other one (binary: p = e^ε/(1 + e^ε)).

    Warner 1965; k-ary form as in Kairouz, Oh, Viswanath 2016 ("Discrete distribution estimation
    under local privacy", k-RR): the ratio of any output's probabilities under two inputs is at most
    p/((1 − p)/(k − 1)) = e^ε, so it is (ε, 0)-DP. p is rounded down (never more truthful).

    Args:
        epsilon: ε > 0.
        categories: the k ≥ 2 public categories, distinct and hashable.

    >>> from accountant import Accountant, Budget
    >>> acc = Accountant(Budget(10.0), rng=0)
    >>> acc.release(RandomizedResponse(epsilon=8.0, categories=("yes", "no")), "yes")
    'yes'
    """

    def __init__(self, epsilon: float, categories: Any) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.categories = _candidates("categories", categories, 2)
        self._index = {c: i for i, c in enumerate(self.categories)}
        k = len(self.categories)
        self.p = math.nextafter(1.0 / (1.0 + (k - 1) * math.exp(-self.epsilon)), 0.0)
        self._cost = Budget(self.epsilon)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "categories": len(self.categories), "p": self.p}

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

    def _release(self, value: int, sampler: Sampler) -> Any:
        if sampler.uniform() < self.p:
            return self.categories[value]
        other = sampler.index(len(self.categories) - 1)
        return self.categories[other + (other >= value)]
