"""Sessions and pipelines end with the renewal window that paid for them (issue 15's attack):
opened at 23:59:59 under a 1.0-per-day limit, they must not go on releasing on the next day, when
the new day grants another 1.0 — else 2.0 would be released within one day. The clock is
injected; nothing depends on wall time."""

from __future__ import annotations

import json

import pytest

from dpbudget.accountant import Budget, WindowEndedError
from dpbudget.mechanisms import AboveThreshold, Laplace, NumericSparse

from conftest import DAY, T0

DAILY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    period = "1d"
    [datasets.lifetime]
    limit = { epsilon = 1.0 }
"""
MIDNIGHT = T0 - 10 * 3600 + DAY  # 00:00 UTC on the 22nd (T0 is 10:00 on the 21st)


def _released_on(acc, day_suffix: str) -> float:
    """ε charged to the daily account of ``day_suffix`` (what was released that day)."""
    return acc._gate.spent(acc._gate.planner.plan("adult", None).targets[0]._replace(
        period=None, key=f"dataset:adult@{day_suffix}+1d")).epsilon


def test_the_attack_of_the_issue_two_epsilon_within_one_day_is_refused(make, clock) -> None:
    acc = make(DAILY)
    clock.now = MIDNIGHT - 1  # 23:59:59 on the 21st
    pipeline = acc.pipeline("report", dataset="adult", budget=Budget(0.5))
    session = acc.session(NumericSparse(0.5, threshold=0.0, max_positives=5, sensitivity=1.0), dataset="adult")
    assert pipeline.release(Laplace(0.1, sensitivity=1.0), 1.0) is not None  # still the 21st: fine
    assert session.query(-1e9) is None
    clock.now = MIDNIGHT + 1  # the 22nd: a fresh 1.0 …
    before = (pipeline.spent(), session.answered)
    with pytest.raises(WindowEndedError) as ended:
        pipeline.release(Laplace(0.1, sensitivity=1.0), 1.0)  # … but the 21st's allocations are over
    assert ended.value.ended == MIDNIGHT
    with pytest.raises(WindowEndedError):
        session.query(1e9)
    with pytest.raises(WindowEndedError):
        session.test(1e9)
    assert (pipeline.spent(), session.answered) == before  # nothing drawn, nothing debited
    # The 22nd's own budget is intact, and its allocations work as usual.
    assert acc.remaining("adult") == Budget(1.0)
    with acc.pipeline("report", dataset="adult", budget=Budget(1.0)) as fresh:
        fresh.release(Laplace(0.5, sensitivity=1.0), 1.0)
    session.close()  # (closing still records the answer counts)
    assert _released_on(acc, "2026-11-21") == pytest.approx(1.0)
    assert _released_on(acc, "2026-11-22") == pytest.approx(1.0)


def test_nested_pipelines_and_their_sessions_end_with_the_window(make, clock) -> None:
    acc = make(DAILY)
    clock.now = MIDNIGHT - 10
    outer = acc.pipeline("outer", dataset="adult", budget=Budget(0.8))
    inner = outer.pipeline("inner", budget=Budget(0.4))
    svt = inner.session(AboveThreshold(0.2, threshold=0.0, sensitivity=1.0))
    clock.now = MIDNIGHT
    for call in (lambda: outer.release(Laplace(0.1, sensitivity=1.0), 1.0),
                 lambda: inner.release(Laplace(0.1, sensitivity=1.0), 1.0),
                 lambda: inner.pipeline("deeper", budget=Budget(0.1)),
                 lambda: svt.test(1.0)):
        with pytest.raises(WindowEndedError):
            call()


def test_a_lifetime_limit_has_no_end(make, clock) -> None:
    acc = make(DAILY)
    pipeline = acc.pipeline("p", dataset="lifetime", budget=Budget(0.5))
    session = acc.session(AboveThreshold(0.2, threshold=0.0, sensitivity=1.0), dataset="lifetime")
    clock.now += 400 * DAY
    pipeline.release(Laplace(0.1, sensitivity=1.0), 1.0)
    session.test(-1e9)


def test_an_allocation_opened_across_midnight_is_charged_and_ends_by_its_record_time(
        make, clock) -> None:
    """The keys a debit locks come from an estimate of the ledger's time; the window charged and
    the allocation's end come from its transaction's own time (its record's). A debit estimated
    at 23:59:59.999999 whose transaction runs at 00:00:01 is redone on the next day's window and
    answers until the next midnight — never charged to one day and answering through the next."""
    acc = make(DAILY)
    ticks = iter([MIDNIGHT - 1e-6, MIDNIGHT + 1.0] + [MIDNIGHT + 1.0] * 10)
    acc.ledger.clock = lambda: next(ticks)  # (the in-memory ledger's clock: estimate, then tx)
    session = acc.session(AboveThreshold(0.2, threshold=0.0, sensitivity=1.0), dataset="adult")
    assert _released_on(acc, "2026-11-22") == pytest.approx(0.2)
    assert _released_on(acc, "2026-11-21") == 0.0
    record = json.loads(acc.ledger.entry(session.receipt.seq).text)
    assert record["time"] == "2026-11-22T00:00:01.000000+00:00"
    assert list(record["accounts"]) == ["dataset:adult@2026-11-22+1d"]
    acc.ledger.clock = lambda: MIDNIGHT + DAY - 1e-6
    session.test(1.0)  # (the 22nd's last instant: still answering)
    acc.ledger.clock = lambda: MIDNIGHT + DAY
    with pytest.raises(WindowEndedError):
        session.test(1.0)
