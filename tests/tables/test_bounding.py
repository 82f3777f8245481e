"""Contribution bounding in the engine (dpbudget.accountant.tables.bounding).

The attack: one unit with many rows (or in many groups) moves a per-group aggregate by more than
the sensitivity the query is priced at. Here, on small tables and for many key draws, with the
keys of the rows two neighbours share kept the same (the coupling of the proof), removing any
unit moves each aggregate vector by at most the formula of ``sensitivities`` — and each unit keeps
at most its bounds. Negative control: the same engine without bounding lets a unit through.
The keep is uniform: each of a unit's groups (whatever its size) and rows is kept equally often,
by a χ² test with α = 1e-6 and a power check against the size-biased keep (ranking groups by their
smallest row key).
"""

from __future__ import annotations

from typing import Any

import narwhals as nw
import numpy as np
import pandas as pd
import polars as pl
import pytest
from scipy import stats

from dpbudget.accountant.tables import bounding, frames, sensitivities as sens
from dpbudget.accountant.tables.frames import KEY
from dpbudget.accountant.tables.sensitivities import Contribution

from tests.tables._tables import small_table, without

ALPHA = 1e-6
GROUPS = ["a", "b", "c"]


def _keyed(frame: pd.DataFrame, keys: tuple[np.ndarray, ...]) -> Any:
    return nw.from_native(pl.DataFrame(frame.assign(**{KEY: keys[0]}))).lazy()


def _per_group(frame: pd.DataFrame, keys: tuple[np.ndarray, ...], c: Contribution
               ) -> dict[str, np.ndarray]:
    found = frames.collect(bounding.per_group(_keyed(frame, keys), "unit", ["group"], c, "x",
                                              0.0, 10.0))
    index = {g: i for i, g in enumerate(found["group"].tolist())}
    out = {}
    for name in (bounding.ROWS, bounding.UNITS, bounding.SUM):
        vec = np.zeros(len(GROUPS))
        for j, g in enumerate(GROUPS):
            if g in index:
                vec[j] = float(found[name][index[g]])
        out[name] = vec
    return out


def _max_change(c: Contribution, draws: int = 15, tables: int = 6) -> dict[str, float]:
    worst = {bounding.ROWS: 0.0, bounding.UNITS: 0.0, bounding.SUM: 0.0}
    rng = np.random.default_rng(7)
    for seed in range(tables):
        frame = small_table(seed, units=3, max_rows=8)
        for _ in range(draws):
            keys = (rng.random(len(frame)),)
            full = _per_group(frame, keys, c)
            for unit in frame["unit"].unique():
                rest, rest_keys = without(frame, keys, unit)
                less = _per_group(rest, rest_keys, c)
                for name in worst:
                    worst[name] = max(worst[name], float(np.abs(full[name] - less[name]).sum()))
    return worst


@pytest.mark.parametrize("c", [Contribution(2, 2, 4, True), Contribution(1, 3, 3, True),
                               Contribution(3, 3, 3, False)])
def test_removing_a_unit_moves_each_aggregate_by_at_most_its_sensitivity(c: Contribution) -> None:
    worst = _max_change(c)
    assert worst[bounding.ROWS] <= sens.count(c)
    assert worst[bounding.UNITS] <= sens.distinct_units(c)
    assert worst[bounding.SUM] <= sens.sum_of(c, sens.clamp(0.0, 10.0)) + 1e-9
    assert worst[bounding.ROWS] == sens.count(c)  # reached by some draw: not vacuous


def test_without_bounding_one_unit_moves_a_count_past_the_bound() -> None:
    """Negative control: the engine with bounds it never reaches (the old row-level queries)."""
    worst = _max_change(Contribution(100, 100, 100, True), draws=2)
    assert worst[bounding.ROWS] > sens.count(Contribution(2, 2, 4, True))


def test_each_unit_keeps_at_most_its_bounds_for_every_draw() -> None:
    frame = small_table(3, units=40, max_rows=12)
    rng = np.random.default_rng(1)
    for c in (Contribution(2, 3, 6, True), Contribution(4, 4, 4, False)):
        for _ in range(10):
            keys = (rng.random(len(frame)),)
            pairs = frames.collect(bounding.unit_groups(_keyed(frame, keys), "unit", ["group"], c))
            per_unit = pd.DataFrame(pairs).groupby("unit")[bounding.ROWS]
            assert per_unit.count().max() <= c.groups
            assert per_unit.max().max() <= c.per_group and per_unit.sum().max() <= c.total


def _kept_group_counts(biased: bool, monkeypatch: Any) -> np.ndarray:
    """600 units, each with groups a, b, c of one row and d of ten, L0 = 1: how often each group
    is kept. ``biased``: groups ranked by their smallest row key (a size-biased keep)."""
    units = 600
    groups = ["a", "b", "c"] + ["d"] * 10
    frame = pd.DataFrame({"unit": np.repeat(np.arange(units), len(groups)),
                          "group": groups * units})
    rng = np.random.default_rng(11)
    keys = (rng.random(len(frame)),)
    if biased:
        monkeypatch.setattr(bounding, "group_key", lambda kmin, n: kmin)
    c = Contribution(1, 1, 1, True)
    pairs = frames.collect(bounding.unit_groups(_keyed(frame, keys), "unit", ["group"], c))
    return np.array([(pairs["group"] == g).sum() for g in "abcd"])


@pytest.mark.statistical
def test_each_of_a_units_groups_is_kept_equally_often_whatever_its_size(
        monkeypatch: Any) -> None:
    observed = _kept_group_counts(False, monkeypatch)
    assert stats.chisquare(observed).pvalue > ALPHA
    # Power: the size-biased keep (by k_min: d kept 10/13 of the time) is rejected by the test.
    assert stats.chisquare(_kept_group_counts(True, monkeypatch)).pvalue < ALPHA


@pytest.mark.statistical
def test_each_row_of_a_group_is_kept_equally_often() -> None:
    """500 units of 5 rows in one group, L∞ = 2: each row position kept 2/5 of the time."""
    units, rows = 500, 5
    frame = pd.DataFrame({"unit": np.repeat(np.arange(units), rows), "group": "a",
                          "x": np.tile(np.arange(rows, dtype=float), units)})
    rng = np.random.default_rng(5)
    keys = (rng.random(len(frame)),)
    kept = frames.collect(bounding.kept_rows(_keyed(frame, keys), "unit", ["group"],
                                             Contribution(1, 2, 2, True)).select("x"))["x"]
    observed = np.bincount(kept.astype(int), minlength=rows)
    assert observed.sum() == units * 2
    assert stats.chisquare(observed).pvalue > ALPHA
    # Power: keeping the first two rows of each unit (no random keys) is rejected.
    assert stats.chisquare(np.array([units, units, 0, 0, 0]) + 1).pvalue < ALPHA


@pytest.mark.parametrize("c", [Contribution(2, 3, 6, True), Contribution(1, 2, 2, True)])
def test_counts_from_the_kept_groups_alone_are_those_of_the_kept_rows(c: Contribution) -> None:
    """Without a value, a kept group's rows are min(n, L∞), read from its size: the same pairs
    and counts as aggregating the kept rows."""
    frame = small_table(6, units=40, max_rows=12)
    keys = (np.random.default_rng(8).random(len(frame)),)
    fast = frames.collect(bounding.per_group(_keyed(frame, keys), "unit", ["group"], c))
    rows = frames.collect(bounding.per_group(_keyed(frame, keys), "unit", ["group"], c, "x",
                                             0.0, 10.0))
    for name in (bounding.ROWS, bounding.UNITS):
        assert fast[name][np.argsort(fast["group"])].tolist() == \
            rows[name][np.argsort(rows["group"])].tolist()


@pytest.mark.parametrize("groups", [["group"], []])
def test_totals_without_units_are_those_through_the_unit_groups(groups: list[str]) -> None:
    """Under C rows per unit, ``per_group(units=False)`` aggregates the kept rows straight by
    group: the same ``ROWS``, ``SUM`` and ``SQUARES`` as through one row per unit × group."""
    frame = small_table(4, units=30, max_rows=9)
    keys = (np.random.default_rng(3).random(len(frame)),)
    args = (_keyed(frame, keys), "unit", groups, Contribution(4, 4, 4, False), "x", 0.0, 10.0,
            5.0)
    want = frames.collect(bounding.per_group(*args))
    got = frames.collect(bounding.per_group(*args, units=False))
    assert bounding.UNITS not in got
    for name in (bounding.ROWS, bounding.SUM, bounding.SQUARES):
        order_w = np.argsort(want["group"]) if groups else [0]
        order_g = np.argsort(got["group"]) if groups else [0]
        np.testing.assert_allclose(got[name][order_g], want[name][order_w], rtol=1e-12)


def test_quantile_bins_count_the_kept_rows() -> None:
    frame = pd.DataFrame({"unit": [1, 1, 1, 2], "x": [0.0, 2.5, 99.0, -3.0]})
    keys = (np.array([0.1, 0.2, 0.9, 0.5]),)
    found = frames.collect(bounding.bin_counts(_keyed(frame, keys), "unit",
                                               Contribution(2, 2, 2, False), "x", 0.0, 10.0, 10))
    bins = dict(zip(found[bounding.BIN].tolist(), found[bounding.ROWS].tolist()))
    assert bins == {0: 2, 3: 1}  # 0.0 and −3.0 (clamped) at 0, 2.5 in (2, 3]; 99.0 not kept
