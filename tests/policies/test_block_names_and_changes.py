"""Independent review of issue 15 (per-block budgets): each test here demonstrates a finding."""

from __future__ import annotations


import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerConflictError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.values.errors import InvalidArgumentError, PolicyError, PrivacyError
from dpbudget.mechanisms import Laplace
from dpbudget.policies.blocks import Blocks, block_names, rows_in_blocks
from tests.support import OWNER

WEEKLY = """
    [datasets.events]
    limit = { epsilon = 100.0 }
    [datasets.events.blocks]
    by = "week"
    first = "2026-W45"
    limit = { epsilon = 1.0 }
"""
DAILY = """
    [datasets.events]
    limit = { epsilon = 100.0 }
    [datasets.events.blocks]
    by = "day"
    limit = { epsilon = 1.0 }
"""


# 1. Privacy violation: a week name with non-ASCII digits is a second account for the same week.
def test_a_week_has_one_name_only(make) -> None:
    acc = make(WEEKLY)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-W46")  # week 46 exhausted
    with pytest.raises((BudgetExceededError, PrivacyError)):
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-W\u0664\u0666")  # "٤٦"
    assert block_names(Blocks(by="week", limit=Budget(1.0)), "2026-W46") == ("2026-W46",)


def test_moving_first_earlier_with_another_spelling_is_refused_or_flagged(
        make, write, tmp_path, clock, ledger_clock) -> None:
    acc = Accountant.from_policy(write(WEEKLY), ledger=tmp_path / "l.db", rng=0,
                                 simulation=True, owner_key=OWNER)
    spelled = WEEKLY.replace('first = "2026-W45"', 'first = "2026-W\u0664\u0660"')  # week 40
    with pytest.raises(PolicyError, match="week block name"):  # only ASCII names exist
        acc.apply_policy(write(spelled), by="admin", reason="test", owner_key=OWNER)
    earlier = WEEKLY.replace('first = "2026-W45"', 'first = "2026-W40"')
    change = acc.apply_policy(write(earlier), by="admin", reason="test", owner_key=OWNER)
    assert any("blocks.first" in r for r in change.raised)
    acc.close()


# 2. Audit false positive: every release inside a pipeline opened on blocks fails the audit.
def test_a_pipeline_on_blocks_audits_clean(write, tmp_path, clock, ledger_clock) -> None:
    db = tmp_path / "l.db"
    with Accountant.from_policy(write(DAILY), ledger=db, rng=0, simulation=True) as acc:
        with acc.pipeline("p", dataset="events", budget=Budget(0.4), blocks="2026-11-20") as p:
            p.release(Laplace(0.2, sensitivity=1.0), 1.0)
    report = audit(f"sqlite:///{db}")
    assert report.ok, report.problems


# 3. Privacy (unflagged raise): dropping [datasets.X.blocks] removes every per-block limit.
def test_removing_blocks_is_flagged_as_a_raise(write, tmp_path, clock, ledger_clock) -> None:
    acc = Accountant.from_policy(write(DAILY), ledger=tmp_path / "l.db", rng=0,
                                 simulation=True, owner_key=OWNER)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")  # block exhausted
    plain = "[datasets.events]\nlimit = { epsilon = 100.0 }\n"
    change = acc.apply_policy(write(plain), by="admin", reason="test", owner_key=OWNER)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events")  # reads 2026-11-20 again, unflagged
    assert change.raised, "per-block limits removed without a raise being reported"
    acc.close()


# 4. Robustness: apply_policy (and opening) never check recorded block accounts' rules.
def test_a_block_rule_change_under_recorded_spend_is_refused_by_apply_policy(
        write, tmp_path, clock, ledger_clock) -> None:
    acc = Accountant.from_policy(write(DAILY), ledger=tmp_path / "l.db", rng=0,
                                 simulation=True, owner_key=OWNER)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    advanced = DAILY.replace('by = "day"\n    limit = { epsilon = 1.0 }',
                             'by = "day"\n    composition = "advanced"\n'
                             '    limit = { epsilon = 1.0, delta = 1e-6 }')
    assert "advanced" in advanced
    with pytest.raises(LedgerConflictError):  # as for any other account (docstring's promise)
        acc.apply_policy(write(advanced), by="admin", reason="test", owner_key=OWNER)
    acc.close()


# 5. Correctness: object-dtype integer seconds are read as nanoseconds (all rows -> 1970-01-01).
def test_block_rows_reads_object_integers_as_seconds() -> None:
    pd = pytest.importorskip("pandas")
    spec = Blocks(by="day", limit=Budget(1.0))
    nov1 = 1_793_491_200
    as_int = pd.DataFrame({"t": [nov1, nov1 + 86_400]})
    as_obj = pd.DataFrame({"t": pd.Series([nov1, nov1 + 86_400], dtype=object)})
    assert len(rows_in_blocks(as_int, "t", spec, "1970-01-01")) == 0
    with pytest.raises(InvalidArgumentError, match="'column'"):  # read as nanoseconds before
        rows_in_blocks(as_obj, "t", spec, "1970-01-01")


# 6. Data in errors: a Series / array / timestamp passed as blocks is shown in the message.
def test_blocks_errors_never_show_data(make) -> None:
    pd = pytest.importorskip("pandas")
    acc = make(DAILY)
    secret = pd.Series(pd.to_datetime(["2026-11-20 13:45:12.123456"], utc=True))
    for bad in (secret, secret.to_numpy(), secret.iloc[0]):
        with pytest.raises(PrivacyError) as info:
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events", blocks=bad)
        assert "13:45:12" not in str(info.value)
        with pytest.raises(PrivacyError) as info:
            acc.spent("events", block=bad)
        assert "13:45:12" not in str(info.value)


# 7. Robustness: untyped exceptions from the blocks= path.
def test_blocks_refusals_are_typed(make) -> None:
    acc = make(DAILY)
    with pytest.raises(PrivacyError):  # raw TypeError: unhashable plan-cache key
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events", analyst=["alice"], blocks="2026-11-20")
    with pytest.raises(PrivacyError):  # raw OverflowError in _between
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events",
                    blocks=slice("9999-12-31", "9999-12-31"))


# 8. Status: block accounts of a dataset under other_datasets are reported "not in the policy".
def test_status_knows_default_blocks(make, write, tmp_path, clock, ledger_clock) -> None:
    from dpbudget.accountant.audit.status import budget_rows

    text = ('[datasets.a]\nlimit = { epsilon = 1.0 }\n[other_datasets]\n'
            'limit = { epsilon = 10.0 }\n[other_datasets.blocks]\nby = "day"\n'
            'limit = { epsilon = 1.0 }\n')
    with Accountant.from_policy(write(text), ledger=tmp_path / "l.db",
                                rng=0, simulation=True) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="logs", blocks="2026-11-20")
        rows = budget_rows(acc.ledger, acc.policy)
    note = next(r["note"] for r in rows if "/block:" in r["account"])
    assert note != "not in the policy"


# Checked and sound (passes): PostgreSQL, several processes on overlapping ranges in any order.


def test_removing_a_dataset_that_falls_under_other_datasets_is_flagged(
        write, tmp_path, clock, ledger_clock) -> None:
    """Found by the review of issue 15 (older than blocks): a dataset removed from a policy that
    admits unlisted datasets is not refused afterwards but held to the default limit."""
    acc = Accountant.from_policy(write(WEEKLY + "\n[other_datasets]\nlimit = { epsilon = 1.0 }\n"),
                                 ledger=tmp_path / "l.db", rng=0, simulation=True,
                                 owner_key=OWNER)
    change = acc.apply_policy(write("[datasets.other]\nlimit = { epsilon = 1.0 }\n"
                                    "[other_datasets]\nlimit = { epsilon = 5.0 }\n"),
                              by="admin", reason="test", owner_key=OWNER)
    assert any("policy.datasets.events: removed" in r for r in change.raised)
    acc.close()
