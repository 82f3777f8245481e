"""Counts, sums and means per group over a declared, public set of group keys, charged once for
the whole table: the groups are disjoint, so one row moves one group's answer (parallel
composition, McSherry, SIGMOD 2009, Thm 4), which is exactly the L1 sensitivity of the vector of
all groups' answers that one Laplace release is calibrated to.

The group keys are never read from the data: a key that only the data knows would be released by
its mere presence in the output. Rows whose key is not declared are dropped (silently: refusing
them would tell, without noise, that such a row exists) before anything else of them is read: a
NaN, a wrong type or a huge value there changes nothing. The guarantee is per row: a person with
several rows must be bounded to one (or the sensitivity multiplied by their number) first.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataTypeError, InvalidTypeError
from dpbudget.mechanisms.laplace import Laplace
from dpbudget.mechanisms.noisy import Releaser, _releaser, _where
from dpbudget.mechanisms.queries import Neighbouring, _relation
from dpbudget.mechanisms.rows import clamp_range, row_values
from dpbudget.mechanisms.sums import exact_sums

__all__ = ["STATISTICS", "group_by"]

STATISTICS = ("count", "sum", "mean")


def group_by(accountant: Releaser, keys: Sequence[Any], groups: Sequence[Hashable], *,
             epsilon: float, statistic: str = "count", values: Sequence[float] | None = None,
             lower: float | None = None, upper: float | None = None,
             neighbouring: Neighbouring = Neighbouring.ADD_REMOVE, dataset: str | None = None,
             analyst: str | None = None, label: str | None = None) -> dict[Any, float]:
    """The ``statistic`` of each declared group, costing ``epsilon`` for the whole table.

    - ``"count"``: rows per group. Δ₁ = 1 under add/remove (one row, one group); 2 under replace
      (a row can move from one group to another).
    - ``"sum"``: values clamped into [lower, upper], summed per group. Δ₁ = max(|L|, |U|) under
      add/remove; max(U − L, 2·max(|L|, |U|)) under replace.
    - ``"mean"``: a noisy sum around the midpoint over a noisy count per group, ε/2 each, released
      as one batch (both or neither); Δ₁ of the centred sums = (U − L)/2 under add/remove, U − L
      under replace; each count floored at 1, each mean clamped into [L, U] (post-processing).

    One Laplace release (exact noise) of the whole vector, so the ledger shows one debit of ε
    (two, as one batch, for means) whatever the number of groups (McSherry 2009, Thm 4;
    Dwork–Roth 2014, §3.3).

    Args:
        accountant: the ``Accountant`` that debits the release, or a ``Pipeline`` (the handle
            of a ``@budgeted`` function too), which debits its own allocation.
        keys: each row's group key (a list, array or pandas Series).
        groups: the declared public keys, distinct and hashable, in the order of the result.
        epsilon: total ε.
        statistic: ``"count"``, ``"sum"`` or ``"mean"``.
        values: each row's value (same length as ``keys``), for sums and means.
        lower, upper: the public clamping range, for sums and means.

    Returns:
        ``{group: noisy statistic}`` in the order of ``groups``.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> out = group_by(acc, ["a"] * 500 + ["b"] * 300, ["a", "b", "c"], epsilon=1.0)
    >>> abs(out["a"] - 500) < 20 and abs(out["c"]) < 20
    True
    >>> acc.spent()
    Budget(epsilon=1.0, delta=0.0)
    """
    releaser = _releaser(accountant)
    eps = _validate.positive("epsilon", epsilon)
    relation = _relation(neighbouring)
    declared = _groups(groups)
    if statistic not in STATISTICS:
        raise InvalidArgumentError("statistic", statistic, f"one of {list(STATISTICS)}")
    index = _group_index(keys, declared)
    common = {**_where(dataset, analyst), "label": label or f"group-by {statistic}"}
    counts = np.bincount(index[index >= 0], minlength=len(declared)).astype(np.float64)
    if statistic == "count":
        sensitivity = 1.0 if relation is Neighbouring.ADD_REMOVE else 2.0
        noisy = releaser.release(Laplace(eps, sensitivity=sensitivity), counts, **common)
        return dict(zip(declared, (float(v) for v in noisy)))
    if lower is None or upper is None:
        raise InvalidArgumentError("lower" if lower is None else "upper", None,
                                   f"the public clamping range of the values, for a {statistic}")
    lo, hi = clamp_range(lower, upper)
    if values is None:
        raise InvalidArgumentError("values", None, f"each row's value, for a {statistic}")
    kept = index >= 0
    data = np.clip(row_values(_declared_values(values, kept), "values"), lo, hi)
    reach = max(abs(lo), abs(hi))
    width = _numeric.add_up(hi, -lo)
    # Exact sums per group (``dpbudget.mechanisms.sums``): a float sum's rounding could move a group's
    # answer by more than the sensitivity between neighbours.
    sums = exact_sums(data[kept], index[kept], len(declared))
    if statistic == "sum":
        delta = reach if relation is Neighbouring.ADD_REMOVE else max(width, 2 * reach)
        noisy = releaser.release(Laplace(eps, sensitivity=delta), _rationals(sums), **common)
        return dict(zip(declared, (float(v) for v in noisy)))
    mid = (lo + hi) / 2
    centre = (Fraction(lo) + Fraction(hi)) / 2
    centred = _rationals([s - int(c) * centre for s, c in zip(sums, counts.tolist())])
    delta = width / 2 if relation is Neighbouring.ADD_REMOVE else width
    count_delta = 1.0 if relation is Neighbouring.ADD_REMOVE else 2.0
    noisy_counts, noisy_sums = releaser.release_many(
        [(Laplace(eps / 2, sensitivity=count_delta), counts),
         (Laplace(eps / 2, sensitivity=delta), centred)], **common)
    means = mid + np.asarray(noisy_sums) / np.maximum(np.asarray(noisy_counts), 1.0)
    return dict(zip(declared, (float(min(max(v, lo), hi)) for v in means)))


def _rationals(values: list[Fraction]) -> np.ndarray:
    """A one-dimensional object array of the exact sums (what ``Laplace`` rounds exactly)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _groups(groups: Any) -> list[Any]:
    if isinstance(groups, (str, bytes, set, frozenset, dict)) or not hasattr(groups, "__iter__"):
        raise InvalidTypeError("groups", groups, "an ordered sequence of declared group keys")
    out = list(groups)
    if not out:
        raise InvalidArgumentError("groups", groups, "a non-empty sequence of group keys")
    seen: dict[Any, int] = {}
    for i, g in enumerate(out):
        if not isinstance(g, Hashable):
            raise InvalidTypeError(f"groups[{i}]", g, "a hashable key")
        if g in seen:
            raise InvalidArgumentError(f"groups[{i}]", g, f"distinct (repeats index {seen[g]})")
        seen[g] = i
    return out


def _group_index(keys: Any, declared: list[Any]) -> np.ndarray:
    """Each row's group number, or −1 for a key that is not declared (dropped) — an unhashable
    key included: it cannot be a declared group, and refusing it would tell that it exists."""
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
        raise InvalidDataTypeError("keys", keys, "a sequence of group keys, one per row")
    position = {g: i for i, g in enumerate(declared)}

    def number(key: Any) -> int:
        try:
            return position.get(key, -1)
        except TypeError:  # unhashable
            return -1

    return np.fromiter((number(k) for k in keys), dtype=np.int64)


def _declared_values(values: Any, kept: np.ndarray) -> Any:
    """``values`` with every row of an undeclared group replaced by 0.0 before anything reads
    it: a NaN, a string or a huge number there must change nothing (refusing it would tell,
    without noise, that such a row exists). The rows kept are validated by ``row_values``
    afterwards, their errors naming their own index.

    Raises:
        InvalidDataTypeError: not a sized sequence.
        InvalidArgumentError: not one value per key (the lengths are public).
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") \
            or not hasattr(values, "__iter__"):
        raise InvalidDataTypeError("values", values, "a one-dimensional sequence of numbers")
    if len(values) != kept.size:
        raise InvalidArgumentError("values", f"a sequence of {len(values)}",
                                   f"one value per key ({kept.size})")
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype != object:
        # One dtype for the whole column: there is no row of another type to hide.
        out = values.copy()
        out[~kept] = 0
        return out
    return [v if k else 0.0 for v, k in zip(values, kept.tolist())]
