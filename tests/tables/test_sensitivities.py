"""Each bounded query's sensitivity, by brute force: on small tables, for every unit removed and
every subset the bounding can keep (each is the keep of some key draw: ranks of iid keys realise
every order), the change of each aggregate vector is at most the formula — and reaches it on some
table (the formula is not loose, the test not vacuous). Negative control: without bounding, the
change exceeds the row-level sensitivity (1 for a count) that the old helpers used.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant.tables import sensitivities as sens
from dpbudget.accountant.tables.sensitivities import Contribution, contribution
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError

from tests.tables._tables import small_table

GROUPS = ("a", "b", "c")
LOWER, UPPER = 0.0, 10.0


def _choices(rows: list[tuple[str, float]], c: Contribution) -> Iterator[list[tuple[str, float]]]:
    """Every subset of one unit's rows the bounding can keep."""
    if not c.by_group:
        yield from (list(s) for s in itertools.combinations(rows, min(c.total, len(rows))))
        return
    by: dict[str, list[tuple[str, float]]] = {}
    for row in rows:
        by.setdefault(row[0], []).append(row)
    for kept in itertools.combinations(sorted(by), min(c.groups, len(by))):
        per = [list(itertools.combinations(by[g], min(c.per_group, len(by[g])))) for g in kept]
        for pick in itertools.product(*per):
            yield [row for part in pick for row in part]


def _aggregates(rows: list[tuple[str, float]], centre: float = 0.0) -> dict[str, np.ndarray]:
    count = np.array([sum(1 for g, _ in rows if g == k) for k in GROUPS], dtype=float)
    clamped = [(g, min(max(x, LOWER), UPPER) - centre) for g, x in rows]
    return {"count": count,
            "sum": np.array([sum(x for g, x in clamped if g == k) for k in GROUPS]),
            "units": (count > 0).astype(float)}


def _worst(c: Contribution, tables: int = 60) -> dict[str, float]:
    """max over tables, removed units and kept subsets of the L1 and L2 change of each vector;
    the other units' keeps are the same in both neighbours (coupled keys), so the change is the
    removed unit's kept rows."""
    worst: dict[str, float] = {}
    for seed in range(tables):
        frame = small_table(seed, units=2, max_rows=5)
        for unit, part in frame.groupby("unit"):
            rows = list(zip(part["group"], part["x"]))
            for kept in _choices(rows, c):
                for name, vec in _aggregates(kept).items():
                    for norm, value in (("l1", np.abs(vec).sum()), ("l2", math.hypot(*vec))):
                        key = f"{name}_{norm}"
                        worst[key] = max(worst.get(key, 0.0), float(value))
    return worst


@pytest.mark.parametrize("c", [Contribution(2, 2, 4, True), Contribution(1, 3, 3, True),
                               Contribution(3, 1, 3, True), Contribution(3, 3, 3, False)])
def test_each_formula_bounds_every_keep_and_is_reached(c: Contribution) -> None:
    worst = _worst(c)
    l1 = sens.count(c)
    weight = sens.clamp(LOWER, UPPER)
    assert worst["count_l1"] <= l1
    assert worst["sum_l1"] <= sens.sum_of(c, weight) + 1e-9
    assert worst["units_l1"] <= sens.distinct_units(c)
    assert worst["count_l1"] == l1  # reached: the bound is the sensitivity, not a slack one


def test_without_bounding_a_unit_moves_a_count_past_the_row_level_sensitivity() -> None:
    """Negative control: the row-level helpers' Δ = 1 is exceeded by one unit's rows."""
    unbounded = Contribution(10 ** 6, 10 ** 6, 10 ** 6, False)
    assert _worst(unbounded)["count_l1"] > 1
    assert _worst(unbounded)["count_l1"] > sens.count(Contribution(2, 2, 4, True))


@pytest.mark.parametrize("bounds", [{"max_groups_per_unit": 1}, {"max_groups_per_unit": 2},
                                    {"max_rows_per_unit": 2},
                                    {"max_groups_per_unit": 2, "max_rows_per_unit": 20}])
def test_a_distinct_count_needs_only_l0_grouped_and_no_bound_over_the_whole_table(
        bounds: dict[str, int]) -> None:
    """Review F8: a distinct-unit count is moved by L0 per group (L0 = max_groups_per_unit, else
    C), and by 1 over the whole table whatever the unit's rows — not by C = 20. Brute force over
    every keep; reached, so not loose. Negative control: without the L0 bound, one unit moves
    the grouped distinct counts past L0 = 1."""
    c = sens.distinct_contribution(bounds, grouped=True)
    worst = _worst(c)
    assert worst["units_l1"] <= sens.distinct_units(c)
    assert worst["units_l1"] == min(sens.distinct_units(c), len(GROUPS))  # reached
    whole = sens.distinct_contribution(bounds, grouped=False)
    assert sens.distinct_units(whole) == 1  # a unit is in the table or not
    assert sens.distinct_contribution({}, grouped=False) == whole  # no bound needed
    unbounded = Contribution(10 ** 6, 10 ** 6, 10 ** 6, False)
    assert _worst(unbounded)["units_l1"] > sens.distinct_units(
        sens.distinct_contribution({"max_groups_per_unit": 1}, grouped=True))


def test_a_grouped_distinct_count_without_l0_or_c_is_refused_naming_l0() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        sens.distinct_contribution({"max_rows_per_group": 3}, grouped=True)
    assert err.value.argument == "max_groups_per_unit"


@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
def test_quantile_utility_moves_by_at_most_the_rows_kept(q: float) -> None:
    """u(x, c) = −|k_c − q·n| over every removed unit's keep (C = 3): |Δu| <= C; without the
    bound (a unit's 5 rows) it moves past the row-level Δu = 1 of ``Quantile`` (negative
    control)."""
    grid = np.linspace(LOWER, UPPER, 11)

    def utility(values: list[float]) -> np.ndarray:
        v = np.clip(values, LOWER, UPPER)
        return -np.abs(np.searchsorted(np.sort(v), grid, side="right") - q * len(v))

    c = Contribution(3, 3, 3, False)
    worst, unbounded = 0.0, 0.0
    for seed in range(60):
        frame = small_table(seed, units=3, max_rows=5)
        for unit in frame["unit"].unique():
            mine = frame[frame["unit"] == unit]
            others = list(frame[frame["unit"] != unit]["x"])
            rows = list(zip(mine["group"], mine["x"]))
            for kept in _choices(rows, c):
                delta = np.abs(utility(others + [x for _, x in kept]) - utility(others)).max()
                worst = max(worst, float(delta))
            full = np.abs(utility(others + list(mine["x"])) - utility(others)).max()
            unbounded = max(unbounded, float(full))
    assert worst <= sens.quantile_utility(c)
    assert unbounded > 1


def test_contribution_picks_the_bounds_a_query_needs() -> None:
    both = {"max_groups_per_unit": 3, "max_rows_per_group": 2, "max_rows_per_unit": 20}
    assert contribution(both, grouped=True) == Contribution(3, 2, 6, True)
    assert contribution(both, grouped=False) == Contribution(20, 20, 20, False)
    assert contribution({"max_rows_per_group": 4}, grouped=False) == Contribution(1, 4, 4, True)
    assert contribution({"max_rows_per_unit": 5}, grouped=True) == Contribution(5, 5, 5, False)


@pytest.mark.parametrize("given,grouped,named", [
    ({}, False, "max_rows_per_unit"), ({}, True, "max_rows_per_unit"),
    ({"max_groups_per_unit": 3}, True, "max_rows_per_group"),
    ({"max_rows_per_group": 3}, True, "max_groups_per_unit"),
    ({"max_groups_per_unit": 3}, False, "max_rows_per_unit")])
def test_a_query_without_the_bound_it_needs_is_refused_naming_it(
        given: dict[str, Any], grouped: bool, named: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        contribution(given, grouped=grouped)
    assert err.value.argument == named


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_a_bound_is_a_positive_int(bad: Any) -> None:
    with pytest.raises((InvalidArgumentError, InvalidTypeError)):
        contribution({"max_rows_per_unit": bad}, grouped=False)
