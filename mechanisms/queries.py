"""True answers with their sensitivities: ``Query``, and the helpers that compute one (counts,
clamped sums, histograms). ``import dpbudget as dp`` shows them as ``dp.queries``.

What these helpers return is the TRUE, NOT PRIVATE answer: it is the secret a mechanism protects,
and is never itself released, stored or logged. Their names say so (``true_count``...), and a
``Query`` keeps its value out of its repr. Releasing a ``Query`` — ``acc.release(Laplace(ε),
true_count(rows))`` — calibrates the mechanism to the query's own sensitivity (``bind``): L1 for the
Laplace family, L2 for the Gaussian family (each mechanism class's ``query_norm``), so no Δ is
guessed or defaulted.

Each helper computes a true answer together with its sensitivity under a stated neighbour relation,
so that the mechanism is calibrated to the right Δ:

- ``ADD_REMOVE`` (unbounded DP): neighbours differ by adding or removing one person's row. The row
  count is then private.
- ``REPLACE`` (bounded DP): neighbours have the same number of rows and differ in one row's value.
  The row count is public (sensitivity 0), and sums have twice the reach (Dwork–Roth 2014, §2.3).

Clamping is what makes a sum's sensitivity finite: each value is clipped into ``[lower, upper]``
first, and the bounds must be chosen without looking at the data (or with a private method such as
the sparse vector technique). NaN in the data is refused (it has no clamped value), naming its row.
"""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
)
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.sensitivity import rounded_up
from dpbudget.mechanisms.rows import clamp_range, row_values
from dpbudget.mechanisms.sums import exact_sum

__all__ = ["Neighbouring", "Query", "bind", "true_clamped_sum", "true_count", "true_histogram"]


class Neighbouring(str, enum.Enum):
    """Which datasets count as neighbours."""

    ADD_REMOVE = "add/remove"
    REPLACE = "replace"


class Query(NamedTuple):
    """A TRUE, NOT PRIVATE answer and its sensitivities: release it through a mechanism
    (``acc.release(Laplace(ε), query)``), never directly. Never store or log ``value``: it is
    the secret.

    Released, it sets the mechanism's sensitivity (``bind``): ``l1_sensitivity`` for the Laplace
    family, ``l2_sensitivity`` for the Gaussian family. The helpers here compute them; a Query
    built by hand states them, exactly as ``sensitivity=`` does, and the caller answers for them
    (a subclass is refused: its fields could be computed at will).

    Attributes:
        value: the true answer: an int for a count, an int64 array for a histogram, or for a sum the exact sum of
            the clamped values as a ``fractions.Fraction`` (no rounding, so the sensitivity holds
            for it; ``Laplace`` and the Gaussians round it to their grid exactly, float noise
            to the nearest double).
        l1_sensitivity: Δ₁, for Laplace-family mechanisms.
        l2_sensitivity: Δ₂, for Gaussian-family mechanisms.
        neighbouring: the neighbour relation the sensitivities hold under.
    """

    value: Any
    l1_sensitivity: float
    l2_sensitivity: float
    neighbouring: Neighbouring

    def __repr__(self) -> str:  # never the value: a repr ends up in logs and notebooks
        return ("Query(value=<hidden: the TRUE, NOT PRIVATE answer>, "
                f"l1_sensitivity={self.l1_sensitivity!r}, l2_sensitivity={self.l2_sensitivity!r}, neighbouring={self.neighbouring!r})")


def _relation(neighbouring: Any) -> Neighbouring:
    try:
        return Neighbouring(neighbouring)
    except ValueError:
        raise InvalidArgumentError("neighbouring", neighbouring,
                                   f"one of {[n.value for n in Neighbouring]}") from None


def true_count(data: Sequence[Any], *,
               neighbouring: Neighbouring = Neighbouring.ADD_REMOVE) -> Query:
    """The TRUE, NOT PRIVATE number of rows (an ``int``), Δ = 1 under add/remove; release it
    through a mechanism (``acc.release(Laplace(ε), true_count(rows))``).

    Under replace-one neighbours the count is public (Δ = 0) and needs no noise, so asking for it
    privately is refused.

    >>> true_count([3, 1, 4]).value, true_count([3, 1, 4]).l1_sensitivity
    (3, 1.0)
    """
    if _relation(neighbouring) is Neighbouring.REPLACE:
        raise InvalidArgumentError("neighbouring", neighbouring, "'add/remove' for a count",
                                   "Under replace-one neighbours the row count is public.")
    if not hasattr(data, "__len__"):
        raise InvalidDataTypeError("data", data, "a sized collection of rows")
    # An int, exactly: the integer mechanisms (DiscreteLaplace...) take it as it is.
    return Query(len(data), 1.0, 1.0, Neighbouring.ADD_REMOVE)


def true_clamped_sum(data: Sequence[float], lower: float, upper: float, *,
                     centred: bool = False,
                     neighbouring: Neighbouring = Neighbouring.ADD_REMOVE) -> Query:
    """The TRUE, NOT PRIVATE sum of values clipped into [lower, upper] (or of their distance from
    the midpoint); release it through a mechanism, which then takes its sensitivity.

    Sensitivity (Dwork–Roth 2014, §3.3; the centring trick is standard, e.g. Biswas et al. 2020
    "CoinPress", and the seed notes on noisy averages):

    - add/remove: max(|lower|, |upper|), the most one row can add; centred on c = (lower+upper)/2,
      the summand x − c lies in [−(upper−lower)/2, (upper−lower)/2], so Δ = (upper − lower)/2.
    - replace: upper − lower (one row moves from one end to the other), centred or not.

    The value is the exact sum (a ``Fraction``; ``dpbudget.mechanisms.sums``): a float sum rounds, by an
    amount that depends on the other rows, so neighbouring float sums can differ by more than
    the sensitivity. Centred, it is the exact Σx − n·(lower + upper)/2; widths are rounded up.

    >>> q = true_clamped_sum([5, 50, 500], 0, 100)
    >>> q.value, q.l1_sensitivity
    (Fraction(155, 1), 100.0)
    >>> true_clamped_sum([5, 50, 500], 0, 100, centred=True).value
    Fraction(5, 1)
    """
    lo, hi = clamp_range(lower, upper)
    relation = _relation(neighbouring)
    clipped = np.clip(row_values(data), lo, hi)
    value = exact_sum(clipped)
    width = _numeric.add_up(hi, -lo)
    if centred:
        value -= clipped.size * (Fraction(lo) + Fraction(hi)) / 2
        sens = width / 2.0 if relation is Neighbouring.ADD_REMOVE else width
    else:
        sens = max(abs(lo), abs(hi)) if relation is Neighbouring.ADD_REMOVE else width
    return Query(value, sens, sens, relation)


def true_histogram(data: Sequence[Any], categories: Sequence[Any], *,
                   neighbouring: Neighbouring = Neighbouring.ADD_REMOVE) -> Query:
    """The TRUE, NOT PRIVATE counts per category (``int64``), in the order of ``categories``;
    release them through a mechanism, which then takes their sensitivity.

    One row changes one count by 1 under add/remove (Δ₁ = Δ₂ = 1) and two counts by 1 under replace
    (Δ₁ = 2, Δ₂ = √2) — Dwork–Roth 2014, §3.3, "histogram queries". A value outside ``categories``
    is refused: silently dropping it would make the released counts disagree with the data.

    >>> true_histogram(["a", "b", "a"], ["a", "b", "c"]).value
    array([2, 1, 0])
    """
    relation = _relation(neighbouring)
    cats = list(categories)
    if not cats:
        raise InvalidArgumentError("categories", categories, "a non-empty sequence")
    index = {c: i for i, c in enumerate(cats)}
    if len(index) != len(cats):
        raise InvalidArgumentError("categories", categories, "free of duplicates")
    counts = np.zeros(len(cats), dtype=np.int64)
    for row, value in enumerate(data):
        i = index.get(value)
        if i is None:
            raise InvalidDataError("data", data, "values among the declared categories",
                                   f"; data[{row}] is not one of them")
        counts[i] += 1
    if relation is Neighbouring.ADD_REMOVE:
        return Query(counts, 1.0, 1.0, relation)
    return Query(counts, 2.0, math.sqrt(2.0), relation)


def bind(mechanism: Any, value: Any) -> tuple[Any, Any]:
    """``(mechanism, value)`` as a release takes them: a ``Query`` is replaced by its value, and the
    mechanism by one calibrated to the query's sensitivity; anything else is returned as it is.

    The mechanism's class says which sensitivity it takes (``query_norm``: ``"l1"`` or ``"l2"``).
    One that states none (``sensitivity=None``) is rebuilt — the same class, its other parameters
    unchanged, ``sensitivity`` set — so that the ledger records the Δ actually used; one that
    states a Δ keeps it, if it is at least the query's. The gate calls this before it validates
    or debits anything: every refusal here debits nothing.

    Raises:
        InvalidTypeError: a mechanism that takes no ``Query`` (``query_norm`` None), or one whose
            constructor cannot be called again with its own parameters.
        InvalidArgumentError: a stated ``sensitivity`` below the query's, or a query whose
            sensitivity is not a finite positive number.
    """
    if not isinstance(value, Query) or not isinstance(mechanism, Mechanism):
        return mechanism, value  # (not a Mechanism: the gate refuses it by name)
    if type(value) is not Query:  # a subclass could compute its sensitivities at will
        raise InvalidTypeError("value", value, "a dpbudget.queries Query itself, not a subclass")
    norm = type(mechanism).query_norm
    if norm not in ("l1", "l2"):
        raise InvalidTypeError("value", value, f"what {type(mechanism).__name__} releases (it "
                               "takes no Query: compute its input yourself and state its "
                               "sensitivity; Queries go to the Laplace or Gaussian family)")
    needed = rounded_up(getattr(value, f"{norm}_sensitivity"),
                        _validate.positive(f"{norm}_sensitivity",
                                           getattr(value, f"{norm}_sensitivity")))
    stated = getattr(mechanism, "sensitivity", None)
    if stated is not None:
        if not stated >= needed:
            raise InvalidArgumentError(
                "sensitivity", stated, f"at least the query's {norm}_sensitivity {needed!r} "
                f"({type(mechanism).__name__} takes the {norm.upper()} norm)",
                "State none to take the query's; nothing was drawn or debited")
        return mechanism, value.value
    # A new instance of the same class (mechanisms are frozen): its own constructor parameters,
    # as it reports them, with the sensitivity set. A whole Δ is passed as an int, which the
    # integer mechanisms (DiscreteLaplace, DiscreteGaussian) require and the others convert.
    params = mechanism.params()
    signature = inspect.signature(type(mechanism))
    kwargs = {k: params[k] for k in signature.parameters
              if k != "sensitivity" and params.get(k) is not None}
    sensitivity: Any = int(needed) if needed.is_integer() else needed
    cls: Any = type(mechanism)
    try:
        bound = cls(**kwargs, sensitivity=sensitivity)
    except InvalidTypeError:  # (its own refusal of the value, e.g. a non-integer Δ: as it is)
        raise
    except TypeError:
        raise InvalidTypeError("mechanism", mechanism, "a mechanism that can be rebuilt from its "
                               "params() with a sensitivity (state sensitivity= instead)") from None
    return bound, value.value
