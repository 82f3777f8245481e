"""Whether a ledger's accounts can continue under a planner's rules
(``dpbudget.accountant.gate.continuity``): the same composition rule and renewal window for every
recorded account, and, when a ledger from before stored policies adopts one, no limit above the
ones its releases were recorded under."""

from __future__ import annotations

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.gate.continuity import check_ledger, refuse_raised
from dpbudget.accountant.gate.planner import Planner
from dpbudget.accountant.ledger import MemoryLedger
from dpbudget.accountant.values.errors import LedgerConflictError
from dpbudget.mechanisms import Laplace
from dpbudget.policies.policy import parse_policy


def _planner(text: str) -> Planner:
    return Planner(parse_policy(text, "toml"), None)


def _recorded() -> MemoryLedger:
    """A ledger with releases on ``adult`` recorded under basic composition, ε ≤ 1, no window."""
    ledger = MemoryLedger()
    acc = Accountant(limits={"adult": Budget(1.0)}, ledger=ledger, rng=0)
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="adult")
    return ledger


SAME = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
"""


def test_the_same_rule_and_window_continue_and_the_datasets_become_known() -> None:
    planner = _planner(SAME.replace("adult", "census"))
    check_ledger(_recorded(), planner)  # adult is not in this policy: nothing to hold it to
    assert "adult" in planner._known  # (the twin check now knows the ledger's datasets)
    check_ledger(_recorded(), _planner(SAME))
    refuse_raised(_recorded(), _planner(SAME))


@pytest.mark.parametrize("text, why", [
    (SAME.replace("limit = { epsilon = 1.0 }", 'limit = { epsilon = 1.0, delta = 1e-6 }\n'
                  '    composition = "renyi"'), "cannot continue"),
    (SAME + '    period = "1d"\n', "renewal window"),
])
def test_another_rule_or_window_for_a_recorded_account_is_refused(text: str, why: str) -> None:
    with pytest.raises(LedgerConflictError, match=why):
        check_ledger(_recorded(), _planner(text))


def test_a_limit_above_the_recorded_one_is_refused_one_below_is_not() -> None:
    with pytest.raises(LedgerConflictError, match="dataset:adult: recorded"):
        refuse_raised(_recorded(), _planner(SAME.replace("1.0", "5.0")))
    refuse_raised(_recorded(), _planner(SAME.replace("1.0", "0.5")))
