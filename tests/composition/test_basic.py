"""The "basic" rule: Σε and Σδ within the limit (the filter of basic composition), and a batch charged its basic total when it fits, else its tightest fixed-parameter bound (KOV 2015 Thm 3.3 / 3.5, or the zCDP conversion)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.composition import Charge, bounds
from dpbudget.accountant.composition.basic import BasicComposition
from dpbudget.mechanisms import Laplace
from tests.composition.support import LIMIT, batch, snapshot
from tests.contracts import fill


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


def test_basic_rule_under_the_same_pure_limit_admits_the_exact_count() -> None:
    """The control for the test above: the same limit and steps under 'basic'."""
    acc = Accountant(Budget(1.0), composition="basic", rng=0)
    assert acc.max_releases(Laplace(0.125, sensitivity=1.0)) == 8
    assert fill(acc, Laplace(0.125, sensitivity=1.0), 1.0) == 8
