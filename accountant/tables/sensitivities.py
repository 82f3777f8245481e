"""How far one privacy unit can move each bounded query: the sensitivities under add/remove of
all rows of one unit, after contribution bounding.

Invariant: every number here is a function of the bounds alone (never of the data), and is a
bound for every table and every key draw: after bounding, the two neighbouring tables differ only
in the removed unit's kept rows (``dpbudget.accountant.tables.bounding``; proof in docs/theory.md,
"Privacy units"), and those are at most ``groups`` groups of at most ``per_group`` rows, at most
``total`` rows in all. Each formula is checked by brute force on small tables
(tests/tables/test_sensitivities.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["BOUND_NAMES", "Contribution", "clamp", "contribution", "count",
           "distinct_contribution", "distinct_units", "quantile_utility", "sum_of"]

BOUND_NAMES = ("max_rows_per_unit", "max_groups_per_unit", "max_rows_per_group")


class Contribution(NamedTuple):
    """What one unit keeps after bounding.

    Attributes:
        groups: at most this many groups (L0; with a total cap C alone, C: one row per group).
        per_group: at most this many rows in any one group (L∞; with C alone, C).
        total: at most this many rows in all (L0·L∞, or C).
        by_group: True: L0 groups, then L∞ rows in each (Wilson et al. 2020); False: C rows.
    """

    groups: int
    per_group: int
    total: int
    by_group: bool


def contribution(bounds: Mapping[str, Any], grouped: bool) -> Contribution:
    """The bounding a query uses, from its bounds (``None``: not set).

    A grouped query uses L0 = ``max_groups_per_unit`` and L∞ = ``max_rows_per_group`` when both
    are set, else C = ``max_rows_per_unit``; a query over the whole table uses C, else L∞ (one
    group).

    Raises:
        InvalidArgumentError: no bound the query needs is set (``argument`` names the bound to
            set), or a bound that is not a positive int.
    """
    given = {name: None if bounds.get(name) is None else _validate.positive_int(name, bounds[name])
             for name in BOUND_NAMES}
    c, l0, linf = given["max_rows_per_unit"], given["max_groups_per_unit"], \
        given["max_rows_per_group"]
    if grouped and l0 is not None and linf is not None:
        return Contribution(l0, linf, l0 * linf, True)
    if c is not None:
        return Contribution(c, c, c, False)
    if not grouped and linf is not None:
        return Contribution(1, linf, linf, True)
    missing = "max_rows_per_unit" if not grouped or (l0 is None and linf is None) else \
        ("max_groups_per_unit" if l0 is None else "max_rows_per_group")
    raise InvalidArgumentError(missing, None, "set (a positive int): a query per privacy unit "
                               "needs a bound on each unit's rows" + (
                                   ", or max_groups_per_unit with max_rows_per_group"
                                   if grouped else ""))


def recorded(c: Contribution, grouped: bool) -> dict[str, int]:
    """The bounds the bounding ``c`` applies, as a record names them (only those: a bound the
    query or the policy set but the bounding does not use would claim a cap never applied)."""
    if not c.by_group:
        return {"max_rows_per_unit": c.total}
    if grouped:
        return {"max_groups_per_unit": c.groups, "max_rows_per_group": c.per_group}
    return {"max_rows_per_group": c.per_group}


def count(c: Contribution) -> int:
    """Δ₁ of the vector of row counts per group: L0·L∞ (or C)."""
    return c.total


def clamp(lower: float, upper: float, centre: float = 0.0) -> float:
    """The most one row's clamped value, less ``centre``, weighs: max(|l − m|, |u − m|)."""
    return max(abs(lower - centre), abs(upper - centre))


def sum_of(c: Contribution, weight: float) -> float:
    """Δ₁ of the vector of sums per group of values of magnitude at most ``weight`` (``clamp``):
    the counts' times ``weight``."""
    return count(c) * weight


def distinct_units(c: Contribution) -> int:
    """Δ₁ of the vector of distinct-unit counts per group: L0 (a unit is in at most L0 groups,
    and counts once in each; over the whole table, L0 = 1: ``distinct_contribution``)."""
    return c.groups


def distinct_contribution(bounds: Mapping[str, Any], grouped: bool) -> Contribution:
    """The bounding of a distinct-unit count: a unit counts once per group whatever its rows, so
    only L0 matters — ``max_groups_per_unit``, else C = ``max_rows_per_unit`` (C rows reach at
    most C groups); over the whole table no bound at all (L0 = 1). One row per kept group
    (L∞ = 1) is kept, which changes no distinct count.

    Raises:
        InvalidArgumentError: grouped, and neither bound set (``max_groups_per_unit``), or a
            bound that is not a positive int.
    """
    given = {name: None if bounds.get(name) is None else _validate.positive_int(name, bounds[name])
             for name in BOUND_NAMES}
    l0 = (given["max_groups_per_unit"] or given["max_rows_per_unit"]) if grouped else 1
    if l0 is None:
        raise InvalidArgumentError("max_groups_per_unit", None, "set (a positive int): a "
                                   "distinct-unit count per group needs a bound on each unit's "
                                   "groups (or max_rows_per_unit)")
    return Contribution(l0, 1, l0, True)


def quantile_utility(c: Contribution) -> int:
    """The utility sensitivity of a quantile's exponential mechanism: the rows one unit keeps
    (``dpbudget.mechanisms.quantile.BinnedQuantile``)."""
    return c.total
