"""Each statistic's mechanisms, budget split and answer (dpbudget.accountant.tables.aggregates):
the parts of a query cost its ε in all (a mean: ε/2 + ε/2; a variance: three ε/3), each part is
calibrated to its sensitivity, and the answer is a post-processing of the noisy parts only."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpbudget as dp
from dpbudget.accountant.composition.batch import batch_charge
from dpbudget.accountant.tables import aggregates
from dpbudget.accountant.tables.aggregates import KINDS, MAX_CLAMP, Statistic, clipped, fitted
from dpbudget.accountant.tables.sensitivities import Contribution
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidTypeError,
                                               PrivacyError)
from dpbudget.mechanisms import BinnedQuantile, DiscreteLaplace, Laplace
from dpbudget.mechanisms.partition_selection import PartitionSelection
from tests.tables import _tables

C = Contribution(3, 2, 6, True)


@pytest.mark.parametrize("kind", KINDS)
def test_the_parts_cost_epsilon_in_all(kind: str) -> None:
    args: tuple[Any, ...] = () if kind in ("count", "count_distinct_units") else ("x", 0.0, 10.0)
    parts = Statistic(kind, 0.9, *args).mechanisms(C)
    assert sum(m.cost.epsilon for m in parts) == pytest.approx(0.9)
    assert all(m.cost.delta == 0.0 for m in parts)


def test_each_part_is_calibrated_to_its_sensitivity() -> None:
    count, centred = Statistic("mean", 1.0, "x", 0.0, 10.0).mechanisms(C)
    assert isinstance(count, DiscreteLaplace) and count.sensitivity == 6
    assert isinstance(centred, Laplace) and centred.sensitivity == 6 * 5.0  # (u − l)/2 centred
    (plain,) = Statistic("sum", 1.0, "x", -2.0, 10.0).mechanisms(C)
    assert plain.sensitivity == 6 * 10.0  # max(|l|, |u|)
    squares = Statistic("variance", 1.0, "x", 0.0, 10.0).mechanisms(C)[2]
    assert squares.sensitivity == 6 * 25.0
    (distinct,) = Statistic("count_distinct_units", 1.0).mechanisms(C)
    assert distinct.sensitivity == 3
    (median,) = Statistic("quantile", 1.0, "x", 0.0, 10.0, 0.5, 100).mechanisms(C)
    assert isinstance(median, BinnedQuantile) and median.rows_per_unit == 6


def test_a_mean_is_clamped_and_its_count_kept_at_least_one() -> None:
    stat = Statistic("mean", 1.0, "x", 0.0, 10.0)
    out = stat.answer([np.array([0, 4]), np.array([-100.0, 4.0])])
    assert out["mean"].tolist() == [0.0, 6.0]  # centre 5 + 4/4; the first clamped to lower


def test_a_variance_is_between_zero_and_the_largest_possible() -> None:
    stat = Statistic("variance", 1.0, "x", 0.0, 10.0)
    out = stat.answer([np.array([10, 10]), np.array([0.0, 0.0]), np.array([-50.0, 1e6])])
    assert out["variance"].tolist() == [0.0, 25.0]


def test_accuracy_is_the_scale_and_a_95_percent_interval() -> None:
    acc = Statistic("sum", 0.5, "x", 0.0, 10.0).accuracy(C)
    assert acc["sum"]["scale"] == pytest.approx(6 * 10 / 0.5)
    assert acc["sum"]["interval95"] == pytest.approx(120 * np.log(20))


@pytest.mark.parametrize("args,error", [
    (("sum", 1.0, None, 0.0, 1.0), InvalidArgumentError),
    (("sum", 1.0, "x", 1.0, 1.0), InvalidArgumentError),
    (("sum", 1.0, "x", 0.0, float("inf")), InvalidArgumentError),
    (("mean", 1.0, "x", None, 1.0), InvalidArgumentError),
    (("count", 0.0), InvalidArgumentError), (("count", "1"), InvalidTypeError)])
def test_bad_parameters_are_refused(args: tuple[Any, ...], error: type) -> None:
    with pytest.raises(error):
        Statistic(*args)


# -- third review, finding 1: no error after the debit that one person decides -----------------

def _heavy(rows: int, private: bool, kind: str = "sum", lower: float = 1e306,
           upper: float = 2e306) -> tuple[Any, Any]:
    """The a5b attack: clamped into [1e306, 2e306] every kept row weighs 1e306 whatever its
    value, so a key's sum crosses the exact Laplace's limit (4.49e307) iff it keeps >= 45 rows:
    one person (the 45th row) decides between an answer and an error after the debit. Returns
    (what the release gave — an answer's type name or an error's — and the spend)."""
    frame = pd.DataFrame({"unit": np.arange(rows), "g": ["a"] * rows,
                          "x": np.random.default_rng(0).uniform(0, 100, rows)})
    acc = _tables.accountant(eps=10.0)
    t = dp.table(acc, frame, dataset="t")
    q = t.group_by("g") if private else t
    try:
        out = getattr(q, kind)("x", lower=lower, upper=upper, epsilon=1.0,
                               delta=1e-6 if private else None, max_rows_per_unit=1).release()
    except PrivacyError as error:
        return type(error).__name__, acc.spent("t")
    return type(out).__name__ if not private else type(out["a"]).__name__, acc.spent("t")


@pytest.mark.parametrize("private", [False, True])
def test_a5b_clamps_past_2_64_are_refused_before_the_debit(private: bool) -> None:
    """The attack, now refused for its clamps whatever the table: 44 and 45 rows alike, nothing
    debited (a5 too: a variance's centred squares at ±1e153)."""
    for rows in (44, 45):
        assert _heavy(rows, private) == ("InvalidArgumentError", Budget(0.0))
        assert _heavy(rows, private, "variance", -1e153, 1e153)[0] == "InvalidArgumentError"
    assert _heavy(45, private, "sum", 0.0, MAX_CLAMP)[0] != "InvalidArgumentError"


@pytest.mark.parametrize("private", [False, True])
def test_a5b_without_the_cap_clipping_gives_an_answer_of_one_kind(
        private: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap lifted: each true value is clipped to what its mechanism accepts, so 44 and 45
    rows both give an answer, never an error after the debit (the cap's second line)."""
    monkeypatch.setattr(aggregates, "MAX_CLAMP", math.inf)
    assert _heavy(44, private)[0] == _heavy(45, private)[0] == "float"
    assert _heavy(45, private, "variance", -1e153, 1e153)[0] == "dict"


@pytest.mark.parametrize("private", [False, True])
def test_negative_control_neither_cap_nor_clip_one_row_flips_answer_to_error(
        private: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old behaviour re-created (no cap, no clip): 44 rows answer, 45 refuse AFTER the
    debit, which stands — the one-bit oracle the review found."""
    monkeypatch.setattr(aggregates, "MAX_CLAMP", math.inf)
    monkeypatch.setattr(aggregates, "clipped", lambda value, mechanism: value)
    assert _heavy(44, private)[0] == "float"
    error, spent = _heavy(45, private)
    assert error == "InvalidDataError" and spent.epsilon == pytest.approx(1.0)


def test_clipping_keeps_every_value_prepare_accepts_and_moves_none_inside() -> None:
    """``clipped`` lands on the smallest limit of any length (so a subset of a clipped vector
    passes too) and leaves a value within it as it was: 1-Lipschitz, the sensitivity kept."""
    m = Laplace(0.01, sensitivity=1e-3)
    limit = m.grid.limit_for(1 << 62)  # type: ignore[union-attr]
    big = np.array([math.inf, -3 * limit, 0.5, limit])
    out = clipped(big, m)
    assert out.tolist() == [limit, -limit, 0.5, limit]
    for n in (1, 2, 4):
        m.prepare(out[:n])
    assert clipped(math.inf, m) == limit and clipped(-0.25, m) == -0.25
    assert clipped(7, DiscreteLaplace(1.0, sensitivity=1)) == 7


# -- finding 5: the parts add up to at most ε, as the gate adds them ---------------------------

@pytest.mark.parametrize("kind", ["mean", "variance", "sum"])
def test_the_parts_never_add_up_to_an_ulp_over_epsilon(kind: str) -> None:
    """The review's figure: a variance on private keys at ε = 1 was charged
    1.0000000000000002. Now the spend is at most ε for every ε and share tried."""
    rng = np.random.default_rng(5)
    for eps in [1.0, 0.3, 0.7, *rng.uniform(0.01, 10.0, 40)]:
        for share in (0.5, 0.1, 1 / 3):
            sel = PartitionSelection(eps * share, delta=1e-6, max_groups_per_unit=3,
                                     max_rows_per_group=2, max_rows_per_unit=6)
            s = fitted(eps, kind, eps - eps * share, ("x", 0.0, 10.0), C, sel)
            parts = [sel, *s.mechanisms(C)]
            assert batch_charge(tuple(m.charge for m in parts)).epsilon <= eps
    frame = pd.DataFrame({"unit": np.arange(30), "g": ["a"] * 30, "x": np.ones(30)})
    acc = _tables.accountant(eps=10.0)
    dp.table(acc, frame, dataset="t").group_by("g").variance(
        "x", lower=0.0, upper=1.0, epsilon=1.0, delta=1e-6, max_rows_per_unit=1).release()
    assert acc.spent("t").epsilon <= 1.0


def test_negative_control_the_plain_split_went_an_ulp_over() -> None:
    """Without ``fitted`` (ε − ε·share, then ε/3 each, as before): one ulp over ε = 1."""
    sel = PartitionSelection(0.5, delta=1e-6, max_groups_per_unit=3, max_rows_per_group=2,
                             max_rows_per_unit=6)
    parts = [sel, *Statistic("variance", 0.5, "x", 0.0, 10.0).mechanisms(C)]
    assert batch_charge(tuple(m.charge for m in parts)).epsilon == 1.0000000000000002
