"""Accountant.release_many: one step, one debit, all or nothing, composed per rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError,
    MechanismNotAllowedError,
)
from dpbudget.accountant.composition import BasicComposition, Charge, bounds
from dpbudget.mechanisms import AnalyticGaussian, Laplace

LIMIT = Budget(1.0, 1e-6)


def snapshot(acc, rng):
    return list(acc.ledger.entries()), rng.bit_generator.state


def batch(m, k, value=1.0):
    return [(m, value)] * k


def test_one_entry_and_same_noise_as_sequential():
    a = Accountant(LIMIT, rng=5)
    b = Accountant(LIMIT, rng=5)
    items = [(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(0.2, sensitivity=1.0), np.arange(3.0)), (Laplace(0.3, sensitivity=1.0), 7)]
    got = a.release_many(items)
    want = [b.release(m, v) for m, v in items]
    assert len(list(a.ledger.entries())) == 1
    assert a.spent() == b.spent()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    record = next(a.ledger.entries()).record
    assert record["mechanism"]["name"] == "batch"
    assert len(record["mechanism"]["params"]["items"]) == 3
    assert a.last_receipt.mechanism == "batch"


def test_basic_uses_kov_thm_3_3_for_a_homogeneous_batch():
    acc = Accountant(LIMIT, rng=0)
    acc.release_many(batch(Laplace(0.01, sensitivity=1.0), 562))
    spent = acc.spent()
    assert spent.delta == 1e-6
    assert spent.epsilon == pytest.approx(bounds.kov_epsilon(562, 0.01, 1e-6), rel=1e-12)
    rng = np.random.default_rng(0)
    acc = Accountant(LIMIT, rng=rng)
    before = snapshot(acc, rng)
    with pytest.raises(BudgetExceededError):
        acc.release_many(batch(Laplace(0.01, sensitivity=1.0), 563))
    assert snapshot(acc, rng) == before


def test_basic_uses_basic_total_when_it_fits():
    acc = Accountant(LIMIT, rng=0)
    acc.release_many(batch(Laplace(0.01, sensitivity=1.0), 50))
    assert acc.spent().delta == 0.0
    assert acc.spent().epsilon == pytest.approx(0.5)


def test_basic_heterogeneous_batch_uses_the_tighter_of_kov_3_5_and_zcdp():
    eps = list(np.linspace(0.0100, 0.0106, 300))
    acc = Accountant(LIMIT, rng=0)
    acc.release_many([(Laplace(e, sensitivity=1.0), 1.0) for e in eps])
    spent = acc.spent()
    assert spent.epsilon <= 1.0 and spent.delta == 1e-6
    zcdp = bounds.cks_epsilon(math.fsum(e * e / 2 for e in eps), 1e-6)
    kov35 = bounds.kov_heterogeneous_epsilon(eps, 1e-6)
    assert spent.epsilon == pytest.approx(min(zcdp, kov35), rel=1e-9)


def test_basic_batch_with_an_approximate_item_uses_kov_3_5():
    rule = BasicComposition(LIMIT)
    parts = tuple(Charge(e, 0.0) for e in np.linspace(0.0100, 0.0106, 299)) + (
        Charge(0.01, 1e-7, mechanism="approx"),)
    state = rule.debit(rule.initial_state(), Charge(1.0, 1e-7, parts=parts))
    slack = 1e-6 - 1e-7 * (1 + 1e-12)
    assert state["epsilon"] == pytest.approx(
        bounds.kov_heterogeneous_epsilon([p.epsilon for p in parts], slack), rel=1e-9)
    assert state["delta"] == 1e-6


def test_advanced_batch_equals_sequential_zcdp():
    a = Accountant(LIMIT, composition="advanced", rng=0)
    b = Accountant(LIMIT, composition="advanced", rng=0)
    a.release_many(batch(Laplace(0.01, sensitivity=1.0), 300))
    for _ in range(300):
        b.release(Laplace(0.01, sensitivity=1.0), 1.0)
    assert a.spent() == b.spent()
    assert a.max_releases(Laplace(0.01, sensitivity=1.0)) == 187
    with pytest.raises(BudgetExceededError):
        a.release_many(batch(Laplace(0.01, sensitivity=1.0), 188))


def test_gaussian_batch_composes_mu_squared_and_refuses_laplace():
    g = AnalyticGaussian(0.1, delta=1e-7, noise="float", sensitivity=1.0)
    rng = np.random.default_rng(0)
    acc = Accountant(LIMIT, composition="gaussian", rng=rng)
    n = acc.max_releases(g)
    acc.release_many(batch(g, n - 1))
    assert acc.max_releases(g) == 1
    before = snapshot(acc, rng)
    with pytest.raises(BudgetExceededError):
        acc.release_many(batch(g, 2))
    with pytest.raises(MechanismNotAllowedError):
        acc.release_many([(g, 1.0), (Laplace(0.001, sensitivity=1.0), 1.0)])
    assert snapshot(acc, rng) == before
    acc.release_many(batch(g, 1))
    assert math.isclose(acc.ledger.accounts()[0].state["mu2"], n * g.mu ** 2, rel_tol=1e-12)


def test_optimal_batch_is_k_fixed_cost_releases():
    rng = np.random.default_rng(0)
    acc = Accountant(LIMIT, composition="optimal", per_query=Budget(0.01), rng=rng)
    acc.release_many(batch(Laplace(0.005, sensitivity=1.0), 500))
    assert acc.max_releases(Laplace(0.01, sensitivity=1.0)) == 62
    before = snapshot(acc, rng)
    with pytest.raises(BudgetExceededError):
        acc.release_many(batch(Laplace(0.01, sensitivity=1.0), 63))
    with pytest.raises(MechanismNotAllowedError):
        acc.release_many([(Laplace(0.01, sensitivity=1.0), 1.0), (Laplace(0.02, sensitivity=1.0), 1.0)])
    assert snapshot(acc, rng) == before


def test_invalid_items_are_refused_before_anything():
    rng = np.random.default_rng(0)
    acc = Accountant(LIMIT, rng=rng)
    before = snapshot(acc, rng)
    with pytest.raises(InvalidArgumentError, match="'value'"):
        acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(0.1, sensitivity=1.0), float("nan"))])
    with pytest.raises(InvalidArgumentError, match="'items'"):
        acc.release_many([])
    with pytest.raises(InvalidTypeError, match="items\\[1\\]"):
        acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), Laplace(0.1, sensitivity=1.0)])
    with pytest.raises(InvalidTypeError, match="'mechanism'"):
        acc.release_many([("laplace", 1.0)])
    with pytest.raises(InvalidTypeError, match="'items'"):
        acc.release_many(Laplace(0.1, sensitivity=1.0))
    assert snapshot(acc, rng) == before


def test_per_query_cap_applies_to_each_item():
    acc = Accountant(LIMIT, per_query=Budget(0.1), rng=0)
    with pytest.raises(BudgetExceededError, match="per-query"):
        acc.release_many(batch(Laplace(0.2, sensitivity=1.0), 2))
    acc.release_many(batch(Laplace(0.1, sensitivity=1.0), 5))
    assert acc.spent().epsilon == pytest.approx(0.5)
