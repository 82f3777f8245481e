"""Policy changes against an existing ledger: lowering a limit below its spend is allowed but the
account then refuses everything (and ``status --policy`` says so); changing a rule is refused."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import RNGS

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerConflictError
from dpbudget.accountant.audit.status import budget_rows
from dpbudget.mechanisms import Laplace
from dpbudget.policies import load_policy
from tests.support import OWNER

ORIGINAL = """
    limit = { epsilon = 5.0 }
    [datasets.adult]
    limit = { epsilon = 2.0 }
    [datasets.adult.analysts.alice]
    limit = { epsilon = 1.0 }
    [analysts.bob]
    limit = { epsilon = 1.0 }
"""


@pytest.fixture
def used(write, tmp_path):
    """An SQLite ledger on which alice spent 0.8 and bob 0.2 on adult under ORIGINAL."""
    db = tmp_path / "budget.db"
    with Accountant.from_policy(write(ORIGINAL), ledger=db, rng=0, simulation=True,
                                owner_key=OWNER) as acc:
        acc.release(Laplace(0.8, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
        acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset="adult", analyst="bob")
    return db


def test_lowering_a_limit_below_spend_refuses_everything(write, used, untouched):
    lowered = write(ORIGINAL.replace("limit = { epsilon = 2.0 }", "limit = { epsilon = 0.5 }"))
    rng = np.random.default_rng(0)
    with pytest.raises(LedgerConflictError, match="datasets.adult.limit.epsilon: stored 2.0"):
        Accountant.from_policy(lowered, ledger=used, rng=rng,
                               simulation=True)  # other limits: refused
    acc = Accountant.open(used, rng=rng, simulation=True)
    change = acc.apply_policy(lowered, by="test", reason="lower adult", owner_key=OWNER)
    assert change.raised == [] and change.changes
    RNGS[id(acc)] = rng
    assert acc.remaining("adult") == Budget(0.0)
    for who in ("alice", "bob", "carol", None):
        with untouched(acc), pytest.raises(BudgetExceededError) as info:
            acc.release(Laplace(1e-6, sensitivity=1.0), 1.0, dataset="adult", analyst=who)
        assert info.value.account == "dataset:adult"
    rows = {r["account"]: r for r in budget_rows(acc.ledger, load_policy(lowered))}
    assert rows["dataset:adult"]["over_limit"] and "OVER LIMIT" in rows["dataset:adult"]["note"]
    assert rows["dataset:adult"]["limit"] == {"epsilon": 0.5, "delta": 0.0}
    assert not rows["dataset:adult/analyst:alice"]["over_limit"]
    acc.close()


def test_lowering_an_analyst_limit(write, used):
    alice = "[datasets.adult.analysts.alice]\n    limit = { epsilon = "
    lowered = write(ORIGINAL.replace(alice + "1.0 }", alice + "0.5 }"))
    with Accountant.open(used, rng=0, simulation=True) as acc:
        acc.apply_policy(lowered, by="test", reason="lower alice", owner_key=OWNER)
        with pytest.raises(BudgetExceededError) as info:
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
        assert info.value.account == "dataset:adult/analyst:alice"
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult", analyst="bob")


def test_raising_a_limit_resumes_from_the_recorded_spend(write, used):
    raised = write(ORIGINAL.replace("limit = { epsilon = 2.0 }", "limit = { epsilon = 3.0 }"))
    with Accountant.open(used, rng=0, simulation=True) as acc:
        change = acc.apply_policy(raised, by="test", reason="raise adult", owner_key=OWNER)
        assert change.raised == ["policy.datasets.adult.limit.epsilon: 2.0 -> 3.0"]
        assert acc.spent("adult").epsilon == pytest.approx(1.0)
        assert acc.remaining("adult").epsilon == pytest.approx(2.0)


@pytest.mark.parametrize("table", [
    "[datasets.adult]",
    "[datasets.adult.analysts.alice]",
    "[analysts.bob]",
    None,  # the global limit
])
def test_a_different_rule_is_a_conflict_for_every_kind_of_account(write, used, other_rule,
                                                                   table):
    text = ORIGINAL
    if table is None:
        bob = "[analysts.bob]\n    limit = { epsilon = 1.0 }"
        # only the global rule changes: bob keeps "basic" explicitly
        text = 'composition = "other"\n' + text.replace(bob, bob + '\n    composition = "basic"')
    else:
        text = text.replace(table, f'{table}\n    composition = "other"')
    with pytest.raises(LedgerConflictError, match="rule cannot change"):
        Accountant.from_policy(write(text), ledger=used)


def test_plain_accountant_also_checks_windowed_and_declared_accounts(used, other_rule):
    with pytest.raises(LedgerConflictError):
        Accountant(limits={"adult": Budget(2.0)}, composition="other", ledger=used)
