"""Query helpers: the sensitivity each states under each neighbour relation, typed errors for bad
data, and noisy_mean's cost, clamping and accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
)
from dpbudget.mechanisms import Laplace, Neighbouring, noisy_mean
from dpbudget.mechanisms.queries import true_clamped_sum, true_count, true_histogram

AR, RP = Neighbouring.ADD_REMOVE, Neighbouring.REPLACE


def _max_change(f, data, extra):
    """The largest L1 change |f(D) - f(D')| over neighbours D' that replace one row by a value
    from ``extra``."""
    base = f(data)
    return max(np.abs(f(data[:i] + [x] + data[i + 1:]) - base).sum()
               for i in range(len(data)) for x in extra)


def test_count():
    q = true_count([1, 2, 3])
    assert (q.value, q.l1_sensitivity, q.neighbouring) == (3.0, 1.0, AR)
    with pytest.raises(InvalidArgumentError, match="public"):
        true_count([1, 2, 3], neighbouring=RP)
    with pytest.raises(InvalidTypeError):
        true_count(5)


@pytest.mark.parametrize("lower,upper", [(0, 100), (-50, 10), (-5, -1)])
@pytest.mark.parametrize("centred", [False, True])
def test_clamped_sum_sensitivity_bounds_every_neighbour(lower, upper, centred):
    data = [-80.0, -3.0, 0.0, 7.5, 42.0, 500.0]
    extremes = [lower, upper, lower - 100, upper + 100]

    def f(rows):
        return np.array([true_clamped_sum(rows, lower, upper, centred=centred).value])

    q_ar = true_clamped_sum(data, lower, upper, centred=centred)
    q_rp = true_clamped_sum(data, lower, upper, centred=centred, neighbouring=RP)
    mid = (lower + upper) / 2
    # Add/remove: dropping a row changes the (centred) sum by at most the stated Δ.
    drop = max(abs(f(data) - f(data[:i] + data[i + 1:]))[0] for i in range(len(data)))
    assert drop <= q_ar.l1_sensitivity + 1e-12
    assert q_ar.l1_sensitivity == ((upper - lower) / 2 if centred else max(abs(lower), abs(upper)))
    # Replace: one row moves anywhere in range.
    assert _max_change(f, data, extremes) <= q_rp.l1_sensitivity + 1e-12
    assert q_rp.l1_sensitivity == upper - lower
    expected = sum(min(max(x, lower), upper) - (mid if centred else 0) for x in data)
    assert math.isclose(q_ar.value, expected)


def test_histogram_sensitivities_and_errors():
    cats = ["a", "b", "c"]
    data = ["a", "b", "a", "c"]

    def f(rows):
        return true_histogram(rows, cats).value

    q = true_histogram(data, cats)
    assert list(q.value) == [2.0, 1.0, 1.0]
    assert _max_change(f, data, cats) <= true_histogram(data, cats, neighbouring=RP).l1_sensitivity
    assert (q.l1_sensitivity, q.l2_sensitivity) == (1.0, 1.0)
    rp = true_histogram(data, cats, neighbouring=RP)
    assert (rp.l1_sensitivity, rp.l2_sensitivity) == (2.0, math.sqrt(2.0))
    with pytest.raises(InvalidArgumentError, match=r"data\[1\] is not one of them"):
        true_histogram(["a", "z"], cats)
    with pytest.raises(InvalidArgumentError, match="duplicates"):
        true_histogram(data, ["a", "a"])
    with pytest.raises(InvalidArgumentError):
        true_histogram(data, [])


def test_unknown_relation():
    with pytest.raises(InvalidArgumentError, match="neighbouring"):
        true_clamped_sum([1.0], 0, 1, neighbouring="swap")


@pytest.mark.parametrize("relation", [AR, RP])
@pytest.mark.parametrize("centred", [False, True])
def test_noisy_mean_costs_epsilon_and_stays_in_range(relation, centred):
    acc = Accountant(Budget(1.0), rng=3)
    data = list(np.random.default_rng(0).uniform(20, 60, 5000))
    est = noisy_mean(acc, data, 0, 100, epsilon=0.5, neighbouring=relation, centred=centred)
    assert 0 <= est <= 100
    assert abs(est - np.mean(data)) < 1.0  # n = 5000 at ε = 0.5: the noise is far smaller
    assert acc.spent().epsilon == pytest.approx(0.5)
    records = [e.record for e in acc.ledger.entries()]
    assert len(records) == 1  # add/remove: count and sum as one batch; replace: n is public
    assert records[0]["mechanism"]["name"] == ("batch" if relation is AR else "Laplace")


def test_noisy_mean_output_is_clamped_even_for_tiny_data():
    acc = Accountant(None, rng=1)
    for _ in range(50):
        assert 10 <= noisy_mean(acc, [99.0], 10, 20, epsilon=0.01) <= 20


def test_a_refused_mean_spends_nothing_even_when_its_count_would_fit():
    """Attack: a mean whose count fits but whose sum does not must not leave the count's ε
    spent (all or nothing). Released one at a time, 0.25 would stay spent here."""
    acc = Accountant(Budget(1.0), rng=1)
    acc.release(Laplace(0.6, sensitivity=1.0), 1.0)
    with pytest.raises(BudgetExceededError):
        noisy_mean(acc, [1.0, 2.0], 0, 10, epsilon=0.5)  # count 0.25 fits, count + sum does not
    assert acc.spent().epsilon == 0.6
    assert len(list(acc.ledger.entries())) == 1


def test_noisy_mean_refused_leaves_nothing_when_the_first_release_does_not_fit():
    acc = Accountant(Budget(0.1), rng=1)
    with pytest.raises(Exception):
        noisy_mean(acc, [1.0, 2.0], 0, 10, epsilon=0.5)
    assert list(acc.ledger.entries()) == []
