"""Sample-and-aggregate (Nissim, Raskhodnikova, Smith, STOC 2007, §4): any function, made private
by running it on disjoint random chunks of the rows and releasing the noisy mean of the clipped
answers.

Invariant: the function, the number of chunks, ε and the clipping range are public and fixed at
construction; the rows are only counted and checked in ``prepare`` (before the debit); the chunks
are drawn, the function run and the answer released only in ``draw``, after the debit.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataTypeError, InvalidTypeError
from dpbudget.mechanisms import guarded
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.laplace import Laplace
from dpbudget.mechanisms.rows import clamp_range
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.sums import exact_sum

__all__ = ["SampleAndAggregate"]


class SampleAndAggregate(Mechanism):
    """Runs ``function`` on each of ``chunks`` disjoint random chunks of the rows, clips each
    answer into [lower, upper], and releases their mean plus Laplace((upper − lower)/(k·ε)) noise:
    (ε, 0)-DP for any function.

    NRS 2007, §4 (Dwork–Roth 2014, §7.1 describe the same framework). Each row is put into one of
    the k chunks uniformly at random, independently of every other row (drawn from the CSPRNG
    after the debit), so a dataset and its neighbour — one row added, removed or replaced — differ
    in one chunk only; that chunk's clipped answer moves by at most (upper − lower), the mean by
    (upper − lower)/k, which is the Laplace mechanism's sensitivity (exact noise, ``Laplace``).
    The answer is clamped into [lower, upper] (post-processing).

    **Rows are individuals.** The guarantee is per row: if a person has several rows, group them
    into one row first (or they may land in several chunks and be protected only at k times ε).

    **The function must be pure**: no state kept from one chunk to the next, no I/O — what it
    carries across chunks would break the "one chunk differs" argument.

    **The function runs on private data.** A function that raises — anything, ``BaseException``
    included: ``KeyboardInterrupt``, ``SystemExit``, a subclass of its own — or answers something
    that is not a finite number, counts as the midpoint (lower + upper)/2 for its chunk —
    silently: an error that escaped would tell which chunk had which property, without noise. A
    real Ctrl-C during the draw is held until the noisy answer is drawn, then delivered (the
    answer is lost to it; ``dpbudget.mechanisms.guarded``), so a ``KeyboardInterrupt`` out of the
    function is always the function's own. Its running time is not hidden
    (docs/exact-noise.md, timing).

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: ε > 0.
        function: called once per chunk with the chunk's rows (the same type as the value
            released: a numpy array, a list, or a pandas DataFrame/Series), returning a number.
        chunks: k ≥ 1; more chunks, less noise ((upper − lower)/(kε)) but smaller samples.
        lower, upper: the public clipping range of the function's answers.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> m = SampleAndAggregate(1.0, function=lambda rows: float(np.median(rows)), chunks=50,
    ...                        lower=0.0, upper=100.0)
    >>> 40 <= acc.release(m, np.arange(10_001) / 100) <= 60
    True
    """

    _may_be_zero = ("lower", "upper")
    epsilon: float
    function: Any
    chunks: int
    lower: float
    upper: float
    _mean: Laplace

    def __init__(self, epsilon: float, *, function: Any, chunks: int, lower: float,
                 upper: float) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        if not callable(function):
            raise InvalidTypeError("function", function, "a callable run on each chunk")
        if isinstance(chunks, bool) or not isinstance(chunks, numbers.Integral):
            raise InvalidTypeError("chunks", chunks, "an int")
        if not 1 <= chunks <= 1_000_000:
            raise InvalidArgumentError("chunks", chunks, "between 1 and 1,000,000")
        self.function = function
        self.chunks = int(chunks)
        self.lower, self.upper = clamp_range(lower, upper)
        self._mean = Laplace(self.epsilon, sensitivity=(self.upper - self.lower) / self.chunks)
        assert self._mean.grid is not None  # (exact by construction)
        if max(abs(self.lower), abs(self.upper)) > self._mean.grid.limit_for(1):
            raise InvalidArgumentError("upper", upper, "a range whose values the noise grid can "
                                       f"represent (at most {self._mean.grid.limit_for(1):.6g})")
        self.declare(Budget(self.epsilon), noise="exact")


    def params(self) -> dict[str, Any]:
        name = getattr(self.function, "__qualname__", type(self.function).__name__)
        return {"epsilon": self.epsilon, "chunks": self.chunks, "lower": self.lower,
                "upper": self.upper, "function": str(name), "noise": "exact"}

    def prepare(self, value: Any) -> Any:
        """The rows as given: a numpy array (rows along the first axis), a list or tuple, or a
        pandas DataFrame or Series. Nothing is run on them yet.

        Raises:
            InvalidDataTypeError: anything else (a string, a scalar, a 0-d array).
        """
        if hasattr(value, "iloc") and hasattr(value, "__len__"):
            return value
        if isinstance(value, np.ndarray) and value.ndim >= 1:
            return value
        if isinstance(value, (list, tuple)):
            return value
        raise InvalidDataTypeError("value", value, "rows: a numpy array, a list or tuple, or a "
                                   "pandas DataFrame or Series")

    def draw(self, value: Any, sampler: Sampler) -> float:
        with guarded.interrupts_deferred():  # a Ctrl-C is delivered after the noise is drawn
            n = len(value)
            chunk_of = (sampler.bits.below_array(self.chunks, n) if n
                        else np.zeros(0, dtype=np.int64))
            order = np.argsort(chunk_of, kind="stable")
            edges = np.searchsorted(chunk_of[order], np.arange(self.chunks + 1))
            fallback = (self.lower + self.upper) / 2
            answers = np.empty(self.chunks)
            for j in range(self.chunks):
                # Anything it raises, BaseException included, is the fallback: see the class
                # docstring and ``dpbudget.mechanisms.guarded``.
                answer = guarded.call(_answer, self.function,
                                      _take(value, order[edges[j]:edges[j + 1]]))
                if answer is guarded.FAILED or not math.isfinite(answer):
                    answer = fallback
                answers[j] = min(max(answer, self.lower), self.upper)
            # The exact mean (``dpbudget.mechanisms.sums``): a float sum's rounding could move it by more
            # than (upper − lower)/k between neighbours. It lies in [lower, upper] already.
            mean = exact_sum(answers) / self.chunks
            noisy = self._mean.draw(self._mean.prepare(mean), sampler)
        return float(min(max(noisy, self.lower), self.upper))


def _answer(function: Any, rows: Any) -> float:
    """The function's answer as a float (its ``__float__`` is the caller's code too)."""
    return float(function(rows))


def _take(rows: Any, index: np.ndarray) -> Any:
    if hasattr(rows, "iloc"):
        return rows.iloc[index]
    if isinstance(rows, np.ndarray):
        return rows[index]
    return type(rows)(rows[i] for i in index)
