"""Query helpers for the seed workloads: counts, clamped sums, noisy means, quantiles, histograms.

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
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NamedTuple, Protocol

import numpy as np

from dpbudget.accountant import _numeric, _validate
from dpbudget.accountant.errors import (
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
)
from dpbudget.mechanisms.laplace import Laplace
from dpbudget.mechanisms.quantile import Quantile
from dpbudget.mechanisms.rows import clamp_range, row_values
from dpbudget.mechanisms.sums import exact_sum

__all__ = ["Neighbouring", "Query", "Releaser", "clamped_sum", "count", "histogram", "noisy_mean",
           "noisy_quantiles"]


class Neighbouring(str, enum.Enum):
    """Which datasets count as neighbours."""

    ADD_REMOVE = "add/remove"
    REPLACE = "replace"


class Query(NamedTuple):
    """A true answer and its sensitivities. Never store or log ``value``: it is the secret.

    Attributes:
        value: the true answer: a float, an array for a histogram, or for a sum the exact sum of
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
        return (f"Query(value=<hidden>, l1_sensitivity={self.l1_sensitivity!r}, "
                f"l2_sensitivity={self.l2_sensitivity!r}, neighbouring={self.neighbouring!r})")


class Releaser(Protocol):
    """What a query helper releases through: an ``Accountant``, a ``Pipeline``, or the handle a
    ``@acc.budgeted`` function is given (a ``Pipeline``). Both take these keywords; a pipeline
    admits only its own dataset and analyst, and charges its own allocation.

    A helper validates all its arguments, then makes one call (``release`` or ``release_many``,
    one debit): a bad argument or a refusal debits nothing, wherever it runs.
    """

    def release(self, mechanism: Any, value: Any, *, dataset: Any = ...,
                analyst: str | None = ..., label: str | None = ...) -> Any: ...

    def release_many(self, items: Any, *, dataset: Any = ..., analyst: str | None = ...,
                     label: str | None = ...) -> list[Any]: ...


def _releaser(accountant: Any) -> Releaser:
    """``accountant`` if it can release; checked first, before anything is computed or debited."""
    if not (callable(getattr(accountant, "release", None))
            and callable(getattr(accountant, "release_many", None))):
        raise InvalidTypeError("accountant", accountant,
                               "an Accountant or a Pipeline (what the helper releases through)")
    return accountant  # type: ignore[no-any-return]


def _where(dataset: str | None, analyst: str | None) -> dict[str, Any]:
    """Where a helper's release is charged, as ``release``'s keywords: ``dataset`` only when the
    caller named one, so that an accountant uses its default dataset and a pipeline its own."""
    return {"analyst": analyst} if dataset is None else {"dataset": dataset, "analyst": analyst}


def _relation(neighbouring: Any) -> Neighbouring:
    try:
        return Neighbouring(neighbouring)
    except ValueError:
        raise InvalidArgumentError("neighbouring", neighbouring,
                                   f"one of {[n.value for n in Neighbouring]}") from None


def count(data: Sequence[Any], *, neighbouring: Neighbouring = Neighbouring.ADD_REMOVE) -> Query:
    """The number of rows: Δ = 1 under add/remove.

    Under replace-one neighbours the count is public (Δ = 0) and needs no noise, so asking for it
    privately is refused.

    >>> count([3, 1, 4]).value, count([3, 1, 4]).l1_sensitivity
    (3.0, 1.0)
    """
    if _relation(neighbouring) is Neighbouring.REPLACE:
        raise InvalidArgumentError("neighbouring", neighbouring, "'add/remove' for a count",
                                   "Under replace-one neighbours the row count is public.")
    if not hasattr(data, "__len__"):
        raise InvalidDataTypeError("data", data, "a sized collection of rows")
    return Query(float(len(data)), 1.0, 1.0, Neighbouring.ADD_REMOVE)


def clamped_sum(data: Sequence[float], lower: float, upper: float, *, centred: bool = False,
                neighbouring: Neighbouring = Neighbouring.ADD_REMOVE) -> Query:
    """The sum of values clipped into [lower, upper] (or of their distance from the midpoint).

    Sensitivity (Dwork–Roth 2014, §3.3; the centring trick is standard, e.g. Biswas et al. 2020
    "CoinPress", and the seed notes on noisy averages):

    - add/remove: max(|lower|, |upper|), the most one row can add; centred on c = (lower+upper)/2,
      the summand x − c lies in [−(upper−lower)/2, (upper−lower)/2], so Δ = (upper − lower)/2.
    - replace: upper − lower (one row moves from one end to the other), centred or not.

    The value is the exact sum (a ``Fraction``; ``dpbudget.mechanisms.sums``): a float sum rounds, by an
    amount that depends on the other rows, so neighbouring float sums can differ by more than
    the sensitivity. Centred, it is the exact Σx − n·(lower + upper)/2; widths are rounded up.

    >>> q = clamped_sum([5, 50, 500], 0, 100)
    >>> q.value, q.l1_sensitivity
    (Fraction(155, 1), 100.0)
    >>> clamped_sum([5, 50, 500], 0, 100, centred=True).value
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


def histogram(data: Sequence[Any], categories: Sequence[Any], *,
              neighbouring: Neighbouring = Neighbouring.ADD_REMOVE) -> Query:
    """Counts per category, in the order of ``categories``.

    One row changes one count by 1 under add/remove (Δ₁ = Δ₂ = 1) and two counts by 1 under replace
    (Δ₁ = 2, Δ₂ = √2) — Dwork–Roth 2014, §3.3, "histogram queries". A value outside ``categories``
    is refused: silently dropping it would make the released counts disagree with the data.

    >>> histogram(["a", "b", "a"], ["a", "b", "c"]).value
    array([2., 1., 0.])
    """
    relation = _relation(neighbouring)
    cats = list(categories)
    if not cats:
        raise InvalidArgumentError("categories", categories, "a non-empty sequence")
    index = {c: i for i, c in enumerate(cats)}
    if len(index) != len(cats):
        raise InvalidArgumentError("categories", categories, "free of duplicates")
    counts = np.zeros(len(cats))
    for row, value in enumerate(data):
        i = index.get(value)
        if i is None:
            raise InvalidDataError("data", data, "values among the declared categories",
                                   f"; data[{row}] is not one of them")
        counts[i] += 1.0
    if relation is Neighbouring.ADD_REMOVE:
        return Query(counts, 1.0, 1.0, relation)
    return Query(counts, 2.0, math.sqrt(2.0), relation)


def noisy_mean(accountant: Releaser, data: Sequence[float], lower: float, upper: float, *,
               epsilon: float, dataset: str | None = None, count_share: float = 0.5,
               centred: bool = True, neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
               analyst: str | None = None, label: str | None = None) -> float:
    """A differentially private mean of values clamped into [lower, upper], costing ``epsilon``.

    Under add/remove neighbours the mean is a noisy sum over a noisy count, ε split between them
    (``count_share`` to the count), two Laplace releases debited through ``accountant`` as one
    batch (``release_many``): both or neither, ε in total under basic composition. With ``centred`` the sum is taken around the
    midpoint, halving its sensitivity. Under replace neighbours n is public and only the sum is
    noised (all of ε). The noisy count is floored at 1 and the result clamped back into
    [lower, upper] — post-processing, which costs no privacy (Dwork–Roth 2014, Prop. 2.1).

    Args:
        accountant: the ``Accountant`` that debits both releases, or a ``Pipeline`` (the
            handle of a ``@budgeted`` function too), which debits its own allocation.
        dataset: the dataset charged (None: the accountant's default, or the pipeline's own).
        data, lower, upper: the values and the clamping range (chosen without looking at data).
        epsilon: total ε for the mean.
        count_share: the fraction of ε spent on the count, in (0, 1).
        dataset: as for ``Accountant.release``; ``None`` (left out): left out there too, so
            the accountant's rule for an unnamed dataset applies (``dpbudget.accountant.unnamed``).

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=1)
    >>> 30 <= noisy_mean(acc, [40] * 1000, 0, 100, epsilon=1.0) <= 50
    True
    >>> acc.spent()
    Budget(epsilon=1.0, delta=0.0)
    """
    releaser = _releaser(accountant)
    eps = _validate.positive("epsilon", epsilon)
    share = _validate.probability("count_share", count_share, low_open=True)
    relation = _relation(neighbouring)
    lo, hi = clamp_range(lower, upper)
    total = clamped_sum(data, lo, hi, centred=centred, neighbouring=relation)
    common = _where(dataset, analyst)
    tag = label or "mean"
    if relation is Neighbouring.REPLACE:
        n = float(len(data))
        if n == 0:
            raise InvalidDataError("data", data, "non-empty under replace neighbours")
        noisy_n = n
        noisy_sum = releaser.release(Laplace(eps, sensitivity=total.l1_sensitivity), total.value,
                                       label=f"{tag}: sum", **common)
    else:
        n_query = count(data)
        # All or nothing: the count and the sum are one batch, debited in one transaction, so
        # a mean that does not fit spends nothing (released one at a time, a refused sum would
        # leave the count's ε spent on an answer nobody gets).
        noisy_n, noisy_sum = releaser.release_many(
            [(Laplace(eps * share, sensitivity=n_query.l1_sensitivity), n_query.value),
             (Laplace(eps * (1.0 - share), sensitivity=total.l1_sensitivity), total.value)],
            label=tag, **common)
    noisy_n = max(noisy_n, 1.0)
    estimate = ((lo + hi) / 2.0 if centred else 0.0) + noisy_sum / noisy_n
    return float(min(max(estimate, lo), hi))


def noisy_quantiles(accountant: Releaser, data: Sequence[float], qs: Sequence[float],
                    lower: float, upper: float, *, epsilon: float, dataset: str | None = None,
                    analyst: str | None = None, label: str | None = None,
                    bins: int = 1000) -> list[float]:
    """Several quantiles of values clamped into [lower, upper], costing ``epsilon`` in total.

    Each quantile is a ``Quantile`` of ε/m (m = ``len(qs)``) over the same public grid of
    ``bins + 1`` candidates, released as one batch (``release_many``): all or none, debited in
    one transaction. Under basic composition the batch costs ε (Dwork–Roth 2014, Thm 3.16: the
    m releases read the same rows); the batch rule may charge less for a list fixed in advance
    (docs/theory.md §2, "Batches"). Joint methods (Gillenwater et al., ICML 2021) are more
    accurate for many quantiles; this is the simple, standard one.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=4)
    >>> lo, hi = noisy_quantiles(acc, list(range(1000)), [0.1, 0.9], 0, 1000, epsilon=1.0)
    >>> 50 <= lo <= 150 and 850 <= hi <= 950
    True
    """
    releaser = _releaser(accountant)
    if isinstance(qs, (str, bytes)) or not hasattr(qs, "__len__") or len(qs) == 0:
        raise InvalidArgumentError("qs", qs, "a non-empty sequence of quantiles in [0, 1]")
    share = _validate.positive("epsilon", epsilon) / len(qs)
    items = [(Quantile(share, q=q, lower=lower, upper=upper, bins=bins), data) for q in qs]
    return [float(v) for v in releaser.release_many(items, label=label or "quantiles",
                                                     **_where(dataset, analyst))]
