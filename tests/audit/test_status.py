"""Budget status (``dpbudget.accountant.audit.status``): read from the accounts' stored state, never
from the records; with a policy, each account against the limit the policy gives it now."""

from __future__ import annotations

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.status import budget_rows, budget_table
from dpbudget.mechanisms import Laplace
from dpbudget.policies.policy import parse_policy

POLICY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    [other_datasets]
    limit = { epsilon = 2.0 }
"""


def _spent() -> Accountant:
    acc = Accountant(Budget(2.0), rng=0)
    acc.release(Laplace(0.75, sensitivity=1.0), 1.0, dataset="adult")
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="census")
    return acc


def test_rows_are_read_from_the_stored_state_never_the_records(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = _spent()
    monkeypatch.setattr(acc.ledger, "entries", lambda *a, **k: pytest.fail("the records were read"))
    rows = {r["account"]: r for r in budget_rows(acc.ledger)}
    assert set(rows) == {"dataset:adult", "dataset:census"}
    assert rows["dataset:adult"]["spent"]["epsilon"] == 0.75
    assert rows["dataset:adult"]["remaining"]["epsilon"] == 1.25
    assert rows["dataset:census"]["limit"] == {"epsilon": 2.0, "delta": 0.0}
    assert not any(r["exhausted"] for r in rows.values())


def test_a_policy_that_lowered_a_limit_below_the_spend_shows_over_limit() -> None:
    acc = _spent()
    lowered = parse_policy(POLICY.replace("epsilon = 1.0", "epsilon = 0.5"), "toml")
    rows = {r["account"]: r for r in budget_rows(acc.ledger, lowered)}
    assert rows["dataset:adult"]["over_limit"] and "OVER LIMIT" in rows["dataset:adult"]["note"]
    assert rows["dataset:adult"]["limit"] == {"epsilon": 0.5, "delta": 0.0}
    assert not rows["dataset:census"]["over_limit"] and rows["dataset:census"]["new_dataset"]
    assert "OVER LIMIT" in budget_table(acc.ledger, lowered)


def test_negative_control_the_recorded_limit_alone_shows_no_account_over() -> None:
    """Without the policy, the recorded limit (2.0) is not exceeded: only the policy's view shows
    the lowered limit, so the test above reads the policy, not the ledger."""
    rows = budget_rows(_spent().ledger)
    assert all("over_limit" not in r for r in rows)
    assert "OVER LIMIT" not in budget_table(_spent().ledger)


def test_an_empty_ledger_says_so() -> None:
    assert budget_table(Accountant(Budget(1.0)).ledger) == "  (no releases recorded)"
