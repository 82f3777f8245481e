"""A batch (``Accountant.release_many``): one step, one debit, all or nothing; its charge
(``accountant.composition.batch.batch_charge``) adds up only what every rule can read off the parts,
each total rounded up (how each rule composes a batch: tests/composition/test_<rule>.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError,
)
from dpbudget.accountant.composition.batch import batch_charge
from dpbudget.accountant.values.charge import Charge
from dpbudget.mechanisms import Laplace
from tests.composition.support import LIMIT, batch, snapshot


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


def test_batch_charge_sums_round_up_and_keep_only_what_every_part_has():
    """Each total is at least the exact one (sums of doubles that round down are rounded up), ρ
    and μ only where every part declares one, and the parts are carried for the rule."""
    from fractions import Fraction

    eps = [0.5, 0.25, 1e-18, 1e-18]  # their float sum rounds down to 0.75
    parts = tuple(Charge(e, 1e-7, rho=e * e / 2, mu=e) for e in eps)
    c = batch_charge(parts)
    assert Fraction(c.epsilon) >= sum(Fraction(e) for e in eps)
    assert Fraction(c.delta) >= 4 * Fraction(1e-7)
    assert Fraction(c.rho) >= sum(Fraction(e * e / 2) for e in eps)
    assert c.mu is not None and Fraction(c.mu) ** 2 >= sum(Fraction(e) ** 2 for e in eps)
    assert c.parts == parts and c.mechanism == "a batch of 4"
    # The negative control: the plain float sum is below the exact one, so the test can fail.
    assert Fraction(sum(eps)) < sum(Fraction(e) for e in eps)
    # One part without a zCDP or GDP parameter: the batch has none (no rule may read one off).
    mixed = batch_charge(parts + (Charge(0.1, 0.0),))
    assert mixed.rho is None and mixed.mu is None and len(mixed.parts) == 5
