"""Renewal windows (``policies.periods``): each window is its own account (a weaker guarantee than a
lifetime budget); sessions and pipelines end with the window that paid for them; time comes from
the ledger, never from the caller (issue 28). The clock is injected, so nothing here depends on
wall time."""

from __future__ import annotations

import json

import pytest

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError,
    LedgerConflictError, WindowEndedError,
)
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.ledger import MemoryLedger, SqliteLedger
from dpbudget.accountant.ledger.record import time_micros
from dpbudget.accountant.ledger.transaction import Transaction
from dpbudget.mechanisms import AboveThreshold, Laplace, NumericSparse
from dpbudget.policies import Period
from dpbudget.policies.blocks import block_start
from dpbudget.policies.periods import split_window
from tests.policies.conftest import Clock
from tests.support import charged_accounts, set_ledger_clock, snapshot

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
    below): the next day it refuses, and the next day's budget is untouched."""
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


# -- sessions and pipelines end with the renewal window that paid for them (issue 15's attack)

DAILY_BESIDE_LIFETIME = """
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
    acc = make(DAILY_BESIDE_LIFETIME)
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
    acc = make(DAILY_BESIDE_LIFETIME)
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
    acc = make(DAILY_BESIDE_LIFETIME)
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
    acc = make(DAILY_BESIDE_LIFETIME)
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


# -- time comes from the ledger (issue 28): the caller chooses no window, no block, no unlock share

DAILY_ONLY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    period = "1d"
"""
UNLOCKING = """
    [datasets.events]
    [datasets.events.blocks]
    by = "day"
    first = "2026-11-15"
    limit = { epsilon = 1.0 }
    unlock = { every = "1d", fraction = 0.25 }
"""
BLOCK = "2026-11-20"
AN_HOUR_IN = block_start(BLOCK, "day") + 3600  # 25 % of the block unlocked


def _url(tmp_path, name: str = "l.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _records(url: str) -> list[dict]:
    with SqliteLedger(url[len("sqlite:///"):], create=False) as ledger:
        return [json.loads(e.text) for e in ledger.entries()]


def _old_behaviour(monkeypatch, clock) -> None:
    """The old path, re-created: the debit's windows, blocks and unlock shares from the caller's
    ``clock``, the record's time from the ledger's own (as ``utc_now`` wrote it)."""
    monkeypatch.setattr(Transaction, "time", property(lambda self: clock()))
    monkeypatch.setattr(SqliteLedger, "now", lambda self: clock())


def test_a_clock_with_a_durable_ledger_is_refused_and_nothing_is_opened(
        write, tmp_path, ledger_clock) -> None:
    url = _url(tmp_path)
    Accountant.from_policy(write(DAILY_ONLY), ledger=url).close()
    with SqliteLedger(tmp_path / "l.db") as ledger:
        before = snapshot(ledger)
    advancing = Clock()
    for opener in (lambda: Accountant.open(url, clock=advancing),
                   lambda: Accountant.from_policy(write(DAILY_ONLY), ledger=url, clock=advancing),
                   lambda: Accountant.from_policy(write(DAILY_ONLY), ledger=tmp_path / "l.db",
                                                  clock=advancing)):
        with pytest.raises(InvalidArgumentError, match="'clock'") as refused:
            opener()
        assert refused.value.argument == "clock"
    with pytest.raises(InvalidArgumentError, match="'clock'"):
        Accountant.from_policy(write(DAILY_ONLY), ledger=_url(tmp_path, "new.db"), clock=advancing)
    assert not (tmp_path / "new.db").exists()  # nothing was opened, or created
    with SqliteLedger(tmp_path / "l.db") as ledger:
        assert snapshot(ledger) == before
    # In memory (tests, simulations) a clock is still the ledger's time.
    memory = MemoryLedger()
    Accountant.from_policy(write(DAILY_ONLY), ledger=memory, clock=advancing, rng=0).release(
        Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    assert memory.clock is advancing


def test_365_epsilon_in_seconds_is_refused_and_the_old_path_let_it_through(
        write, tmp_path, monkeypatch, ledger_clock) -> None:
    """The issue's figure: ε = 1 a day, a clock advancing a day per call, 365 calls."""
    url = _url(tmp_path)
    Accountant.from_policy(write(DAILY_ONLY), ledger=url).close()
    days = Clock()

    def attack(acc_of) -> float:
        released = 0.0
        for _ in range(365):
            days.now += DAY
            try:
                acc_of().release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
                released += 1.0
            except (BudgetExceededError, InvalidArgumentError):
                pass
        return released

    # Now: the attacker's clock is refused, and the honest ledger's time (a day that does not
    # move) grants one day's budget once.
    honest = Accountant.open(url)
    assert attack(lambda: Accountant.open(url, clock=days)) == 0.0
    assert attack(lambda: honest) == 1.0
    assert audit(url).ok
    honest.close()
    # Negative control: the old path (windows from the caller's clock) releases ε = 365, and
    # the audit flags every record charged to a window that does not contain its time.
    old = _url(tmp_path, "old.db")
    Accountant.from_policy(write(DAILY_ONLY), ledger=old).close()
    with monkeypatch.context() as m:
        _old_behaviour(m, days)
        acc = Accountant.open(old)
        assert attack(lambda: acc) == 365.0
        acc.close()
    report = audit(old)
    assert sum(p.kind == "time" for p in report.problems) == 365
    assert cli(["audit", old]) & EXIT_BITS["time"]
    assert cli(["audit", url]) == 0


def test_a_block_a_quarter_unlocked_cannot_be_spent_in_full(
        write, tmp_path, monkeypatch, ledger_clock) -> None:
    ledger_clock.now = AN_HOUR_IN
    url = _url(tmp_path)
    acc = Accountant.from_policy(write(UNLOCKING), ledger=url)
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks=BLOCK)
    with SqliteLedger(tmp_path / "l.db") as ledger:
        before = snapshot(ledger)
    with pytest.raises(BudgetExceededError, match="unlocked 25%"):
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks=BLOCK)
    with SqliteLedger(tmp_path / "l.db") as ledger:
        assert snapshot(ledger) == before  # refused: nothing written
    pushed = Clock(AN_HOUR_IN + 30 * DAY)
    with pytest.raises(InvalidArgumentError, match="'clock'"):
        Accountant.open(url, clock=pushed)
    acc.close()
    assert audit(url).ok
    # Negative control: the old path (the unlock share of the caller's clock) spends the block in
    # full; the audit flags it against the record's time.
    old = _url(tmp_path, "old.db")
    with monkeypatch.context() as m:
        _old_behaviour(m, pushed)
        with Accountant.from_policy(write(UNLOCKING), ledger=old) as acc:
            for _ in range(4):
                acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks=BLOCK)
    report = audit(old)
    assert [p.kind for p in report.problems] == ["time"] * 3  # the 2nd, 3rd and 4th quarters
    assert "unlocked 25%" in report.problems[0].message
    assert cli(["audit", old]) == EXIT_BITS["time"]


def test_a_block_that_has_not_begun_by_the_ledgers_time_is_refused(
        write, tmp_path, monkeypatch, ledger_clock) -> None:
    ledger_clock.now = block_start(BLOCK, "day") - 1.0
    url = _url(tmp_path)
    with Accountant.from_policy(write(UNLOCKING), ledger=url) as acc:
        with pytest.raises(InvalidArgumentError, match="have begun"):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks=BLOCK)
        assert acc.ledger.head()[0] == 1  # only the policy record
    # Negative control: charged by the old path (the block's start by the caller's clock), the
    # record's time precedes the block, which the audit flags.
    with monkeypatch.context() as m:
        _old_behaviour(m, Clock(AN_HOUR_IN))
        with Accountant.open(url) as acc:
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks=BLOCK)
    report = audit(url)
    assert [p.kind for p in report.problems] == ["time"]
    assert "before the block begins" in report.problems[0].message


def test_sqlite_time_never_runs_earlier_than_the_head_record(
        write, tmp_path, ledger_clock) -> None:
    """A wall clock set back (a day, across midnight) reopens no window: the record's time stays
    the head's, its window the later one, and the audit is clean."""
    ledger_clock.now = T0 - 10 * 3600 + DAY + 60  # 00:01 on the 22nd
    url = _url(tmp_path)
    with Accountant.from_policy(write(DAILY_ONLY), ledger=url) as acc:
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
        ledger_clock.now -= DAY  # back to the 21st, whose budget is untouched
        with pytest.raises(BudgetExceededError):
            acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
        ledger_clock.now -= 3600
        acc.release(Laplace(1e-9, sensitivity=1.0), 1.0, dataset="adult")  # (fits; charged to the 22nd again)
    first, last = _records(url)[1], _records(url)[-1]
    assert last["time"] == first["time"]
    assert list(last["accounts"]) == list(first["accounts"]) == ["dataset:adult@2026-11-22+1d"]
    assert audit(url).ok


def test_record_times_running_backwards_are_flagged(
        write, tmp_path, monkeypatch, ledger_clock) -> None:
    url = _url(tmp_path)
    acc = Accountant.from_policy(write("[datasets.adult]\nlimit = { epsilon = 10.0 }"),
                                 ledger=url)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    # Negative control: the process's wall clock without the head's floor (the old utc_now).
    monkeypatch.setattr(SqliteLedger, "_tx_micros", lambda self, head: round(
        ledger_clock() * 1e6))
    ledger_clock.now -= 60
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    acc.close()
    report = audit(url)
    assert [(p.kind, p.seq) for p in report.problems] == [("time", 3)]
    assert "never run backwards" in report.problems[0].message
    assert cli(["audit", url]) == EXIT_BITS["time"]
    # An in-memory ledger's records carry its clock as given: set back, the audit says so.
    clock = Clock()
    memory = Accountant.from_policy(write(DAILY_ONLY), clock=clock, rng=0)
    memory.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    clock.now -= 1.0
    memory.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    assert [p.kind for p in audit(memory.ledger).problems] == ["time"]


@pytest.mark.postgres
def test_postgres_uses_the_servers_clock_not_the_clients(
        write, postgres_database, monkeypatch) -> None:
    """The client's wall clock 400 days wrong: the record's time is the server's, read in the
    debit's transaction, and so is the window charged, on a lifetime limit too; the audit's
    per-lane order holds."""
    import psycopg

    import dpbudget.accountant.ledger.postgres.ledger as postgres_ledger
    from tests.conftest import _fresh_schema

    dsn = _fresh_schema(postgres_database)
    skewed = T0 - 400 * DAY
    set_ledger_clock(lambda: skewed, monkeypatch)

    class _Skewed:  # this process's wall clock, wrong; its monotonic clock as it is
        time = staticmethod(lambda: skewed)
        time_ns = staticmethod(lambda: round(skewed * 1e9))
        monotonic_ns = staticmethod(postgres_ledger.time.monotonic_ns)

    monkeypatch.setattr(postgres_ledger, "time", _Skewed)

    def server_now() -> float:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())")
                         .fetchone()[0])

    lifetime = DAILY_ONLY + "[datasets.people]\nlimit = { epsilon = 10.0 }\n"
    with Accountant.from_policy(write(lifetime), ledger=dsn) as acc:
        before = server_now()
        for dataset in ("adult", "adult", "people", "people", "people", "adult"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=dataset)
        after = server_now()
        records = [json.loads(e.text) for e in acc.ledger.entries()][1:]
    assert len(records) == 6
    for record in records:
        when = time_micros(record["time"]) / 1e6
        assert before - 1.0 <= when <= after + 1.0  # the server's time, not the client's
        if record["dataset"] == "adult":
            window = Period("1d").suffix(when)
            assert list(record["accounts"]) == [f"dataset:adult{window}"]
            assert window != Period("1d").suffix(skewed)  # (the client's clock: another window)
    assert audit(dsn).ok
