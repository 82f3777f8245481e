"""The "optimal" rule's k_max: the same answers as ``bounds.kov_max_steps``, computed on first
use (once per process and parameters), never when a rule is built or a ledger opened."""

from __future__ import annotations

import itertools

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import bounds, optimal
from dpbudget.accountant.composition.optimal import OptimalComposition


@pytest.fixture
def kov_calls(monkeypatch):
    """Every call of the KOV δ (the O(√k) sum a k_max search evaluates), counted afresh."""
    optimal._k_max.cache_clear()
    calls = []
    real = bounds.kov_delta
    monkeypatch.setattr(bounds, "kov_delta", lambda *a: calls.append(a) or real(*a))
    yield calls
    optimal._k_max.cache_clear()


GRID = list(itertools.product((0.5, 1.0, 3.0), (1e-6, 1e-5), (0.01, 0.05), (0.0, 1e-9)))


@pytest.mark.parametrize(("eps", "delta", "eps0", "delta0"), GRID)
def test_k_max_is_the_one_kov_max_steps_gives(eps, delta, eps0, delta0):
    rule = OptimalComposition(Budget(eps, delta), Budget(eps0, delta0))
    expected = bounds.kov_max_steps(eps, delta, eps0, delta0)
    assert rule.k_max == expected
    assert rule.describe()["k_max"] == expected
    assert rule.max_steps({"count": 3}, Charge(eps0, delta0)) == max(0, expected - 3)


def test_k_max_of_the_docstring_and_without_a_limit():
    assert OptimalComposition(Budget(1.0, 1e-6), Budget(0.01)).k_max == 562
    assert OptimalComposition(None, Budget(0.01)).describe()["k_max"] is None


def test_opening_at_a_tiny_per_query_epsilon_computes_nothing(kov_calls, tmp_path):
    """ε₀ = 1e-6 (k_max ~ 5.6e10, ~15 s to compute): building the rule, an accountant and
    opening a durable ledger on it evaluate the KOV sum zero times."""
    OptimalComposition(Budget(1.0, 1e-6), Budget(1e-6))
    Accountant(Budget(1.0, 1e-6), composition="optimal", per_query=Budget(1e-6))
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Accountant(Budget(1.0, 1e-6), composition="optimal", per_query=Budget(1e-6),
               ledger=url).close()
    Accountant.open(url).close()
    assert kov_calls == []


def test_k_max_is_computed_once_per_parameters(kov_calls):
    first = OptimalComposition(Budget(1.0, 1e-6), Budget(0.01)).k_max
    n = len(kov_calls)
    assert n > 0
    assert OptimalComposition(Budget(1.0, 1e-6), Budget(0.01)).k_max == first
    assert len(kov_calls) == n  # the second rule reused the first's answer


def test_negative_control_an_eager_rule_evaluates_the_sum_when_built(kov_calls, monkeypatch):
    """The old rule computed k_max in ``__init__``: the count above would then not be zero."""
    init = OptimalComposition.__init__

    def eager(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.k_max  # noqa: B018  (the old constructor's work)

    monkeypatch.setattr(OptimalComposition, "__init__", eager)
    Accountant(Budget(1.0, 1e-6), composition="optimal", per_query=Budget(0.01))
    assert kov_calls
