"""Renewal windows: each window is its own account (a weaker guarantee than a lifetime budget);
the clock is injected, so nothing here depends on wall time."""

from __future__ import annotations

import pytest

from tests.support import charged_accounts

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, InvalidTypeError, LedgerConflictError,
    WindowEndedError,
)
from dpbudget.accountant.ledger import MemoryLedger
from dpbudget.mechanisms import Laplace
from dpbudget.policies import Period
from dpbudget.policies.periods import split_window

from conftest import DAY, T0

DAILY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    period = "1d"
    [datasets.adult.analysts.alice]
    limit = { epsilon = 0.5 }
    [datasets.adult.analysts.carol]
    limit = { epsilon = 0.5 }
    period = "1h"
"""


def test_each_window_is_its_own_account(make, clock, untouched):
    acc = make(DAILY)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult")
    with untouched(acc), pytest.raises(BudgetExceededError) as info:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    assert info.value.account == "dataset:adult@2026-11-21+1d"
    clock.now += DAY  # the next day: a fresh window
    assert acc.remaining("adult") == Budget(1.0)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    assert sorted(a.key for a in acc.ledger.accounts()) == [
        "dataset:adult/analyst:alice@2026-11-21+1d", "dataset:adult/analyst:alice@2026-11-22+1d",
        "dataset:adult@2026-11-21+1d", "dataset:adult@2026-11-22+1d"]


def test_window_boundaries_are_utc_aligned(make, clock):
    acc = make(DAILY)
    clock.now = T0 - 10 * 3600 + DAY - 0.001  # 23:59:59.999 on the 21st
    assert charged_accounts(acc, "adult") == ["dataset:adult@2026-11-21+1d"]
    clock.now += 0.001
    assert charged_accounts(acc, "adult") == ["dataset:adult@2026-11-22+1d"]


def test_analysts_inherit_or_override_the_period(make, clock):
    acc = make(DAILY)
    keys = charged_accounts(acc, "adult", "carol")
    assert keys == ["dataset:adult/analyst:carol@2026-11-21T10+1h", "dataset:adult@2026-11-21+1d"]
    acc.release(Laplace(0.4, sensitivity=1.0), 1.0, dataset="adult", analyst="carol")
    clock.now += 3600
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="carol")  # a new hour for carol
    with pytest.raises(BudgetExceededError) as info:
        clock.now += 3600
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="carol")  # the day is full
    assert info.value.account == "dataset:adult@2026-11-21+1d"


def test_lifetime_limits_beside_windows(make, clock):
    acc = make("""
        limit = { epsilon = 1.5 }      # lifetime, all datasets together
        [datasets.adult]
        limit = { epsilon = 1.0 }
        period = "1d"
    """)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    clock.now += DAY
    with pytest.raises(BudgetExceededError) as info:
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    assert info.value.account == "global"


def test_a_pipeline_ends_with_its_window(make, clock):
    """The window that paid for a pipeline is the only one it releases in (more in
    test_window_allocations.py): the next day it refuses, and the next day's budget is untouched."""
    acc = make(DAILY)
    with acc.pipeline("r", dataset="adult", budget=Budget(0.5)) as p:
        clock.now += DAY
        with pytest.raises(WindowEndedError):
            p.release(Laplace(0.5, sensitivity=1.0), 1.0)
        assert p.spent() == Budget(0.0)
    assert acc.spent("adult") == Budget(0.0)  # today's window is untouched
    clock.now -= DAY
    assert acc.spent("adult") == Budget(0.5)


def test_adding_or_changing_a_window_is_a_conflict(write, clock):
    ledger = MemoryLedger()
    lifetime = write('[datasets.adult]\nlimit = { epsilon = 1.0 }')
    Accountant.from_policy(lifetime, ledger=ledger, rng=0).release(Laplace(0.9, sensitivity=1.0), 1.0,
                                                                   dataset="adult")
    with pytest.raises(LedgerConflictError, match="renewal window"):
        Accountant.from_policy(write(DAILY), ledger=ledger, clock=clock)
    ledger2 = MemoryLedger()
    Accountant.from_policy(write(DAILY), ledger=ledger2, rng=0, clock=clock).release(
        Laplace(0.9, sensitivity=1.0), 1.0, dataset="adult")
    weekly = DAILY.replace('period = "1d"', 'period = "7d"')
    with pytest.raises(LedgerConflictError, match="'1d'"):
        Accountant.from_policy(write(weekly), ledger=ledger2, clock=clock)
    with pytest.raises(LedgerConflictError, match="without a renewal window|period"):
        Accountant.from_policy(lifetime, ledger=ledger2, clock=clock)


def test_period_parsing_and_keys():
    assert Period("30d").seconds == 30 * 86400 and Period("1h").seconds == 3600
    assert Period("7d").suffix(T0) == "@2026-11-19+7d"  # weeks from the epoch: a Thursday
    assert split_window("dataset:a/analyst:b@2026-11-21T10+1h") == ("dataset:a/analyst:b", "1h")
    assert split_window("dataset:a@b") == ("dataset:a@b", None)


def test_clock_must_be_callable(write):
    with pytest.raises(InvalidTypeError, match="clock"):
        Accountant.from_policy(write(DAILY), clock=5)
