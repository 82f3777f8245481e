"""The "optimal" rule's k_max: the same answers as ``bounds.kov_max_steps``, computed on first
use (once per process and parameters), never when a rule is built or a ledger opened."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, MechanismNotAllowedError
from dpbudget.accountant.composition import bounds, optimal
from dpbudget.accountant.composition.optimal import OptimalComposition
from dpbudget.accountant.values.charge import Charge
from dpbudget.mechanisms import AnalyticGaussian, Laplace
from tests.composition.support import LIMIT, batch, snapshot
from tests.contracts import fill


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


def test_optimal_refuses_costlier_and_charges_cheaper_at_fixed_cost():
    rng = np.random.default_rng(2)
    acc = Accountant(LIMIT, composition="optimal", per_query=Budget(0.01), rng=rng)
    acc.release(Laplace(0.001, sensitivity=1.0), 1.0)  # cheaper: charged one full slot
    assert acc.max_releases(Laplace(0.01, sensitivity=1.0)) == 561
    before = snapshot(acc, rng)
    with pytest.raises(MechanismNotAllowedError, match="per-query cost"):
        acc.release(Laplace(0.02, sensitivity=1.0), 1.0)
    with pytest.raises(MechanismNotAllowedError):
        acc.release(AnalyticGaussian(0.005, delta=1e-9, sensitivity=1.0), 1.0)  # δ above δ₀ = 0
    assert snapshot(acc, rng) == before


def test_optimal_account_cannot_resume_at_another_per_query(tmp_path):
    """The optimal rule's count means k releases at one fixed cost: reopening the ledger with a
    smaller per_query must not reuse it (found in review: 10 x 0.1 then 552 x 0.01 admitted)."""
    from dpbudget.accountant.audit.run import EXIT_BITS, audit
    from dpbudget.accountant.values.errors import LedgerConflictError

    url = f"sqlite:///{tmp_path / 'o.db'}"
    with Accountant(Budget(1.0, 1e-6), composition="optimal", per_query=Budget(0.1),
                    ledger=url, rng=0, simulation=True) as acc:
        for _ in range(acc.max_releases(Laplace(0.1, sensitivity=1.0))):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with pytest.raises(LedgerConflictError, match="per_query"):
        Accountant(limits={"default": Budget(1.0, 1e-6)}, composition="optimal",
                   per_query=Budget(0.01), ledger=url)
    with pytest.raises(LedgerConflictError, match="default.per_query.epsilon: stored 0.1"):
        Accountant(Budget(1.0, 1e-6), composition="optimal", per_query=Budget(0.01),
                   ledger=url)  # the stored policy is checked when the ledger is opened
    # A ledger forged by rewriting the configuration mid-stream is flagged by the audit.
    from dpbudget.accountant.composition import OptimalComposition
    from dpbudget.accountant.ledger import Account, MemoryLedger
    from tests.support import release_fields

    ledger = MemoryLedger()
    for eps0 in (0.1, 0.01):
        rule = OptimalComposition(Budget(1.0, 1e-6), Budget(eps0))
        mech = Laplace(eps0, sensitivity=1.0)
        with ledger.transaction() as tx:
            prev = tx.account("dataset:d")
            state = rule.debit(rule.initial_state() if prev is None else prev.state, mech.charge)
            account = Account("dataset:d", "optimal", rule.describe(), state, 0)
            tx.append(release_fields(mech, "d", [(rule, account)]), [account])
    report = audit(ledger)
    assert report.exit_status & EXIT_BITS["limit"]
    assert any("per_query" in p.message for p in report.problems)


def test_optimal_rule_under_a_pure_limit_admits_the_exact_count() -> None:
    acc = Accountant(Budget(1.0), composition="optimal", per_query=Budget(0.125), rng=0)
    assert acc.max_releases(Laplace(0.125, sensitivity=1.0)) == 8
    assert fill(acc, Laplace(0.125, sensitivity=1.0), 1.0) == 8


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
