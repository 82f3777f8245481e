"""Each statistic's mechanisms, budget split and answer (dpbudget.accountant.tables.aggregates):
the parts of a query cost its ε in all (a mean: ε/2 + ε/2; a variance: three ε/3), each part is
calibrated to its sensitivity, and the answer is a post-processing of the noisy parts only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpbudget.accountant.tables.aggregates import KINDS, Statistic
from dpbudget.accountant.tables.sensitivities import Contribution
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError
from dpbudget.mechanisms import BinnedQuantile, DiscreteLaplace, Laplace

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
