"""Time comes from the ledger (issue 28): the caller chooses no window, no block, no unlock share.

The attack measured on the old code: ``Accountant.open(url, clock=...)`` with ``period = "1d"`` and
ε = 1 a day, and a clock advancing a day per call, released ε = 365 in 3 seconds; a block 25 %
unlocked was spent in full with the clock pushed forward; ``dpbudget audit`` exited 0. Each test
below is that attack, now refused or flagged, and where a test could pass vacuously a negative
control re-creates the old behaviour by monkeypatching (the windows from the caller's clock, the
record's time from the ledger's) and shows it let the attack through, or that the audit flags it.
No test reads the wall clock: durable ledgers read a test's clock (``tests.support``).
"""

from __future__ import annotations

import json

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, InvalidArgumentError
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.ledger import MemoryLedger, SqliteLedger
from dpbudget.accountant.ledger.record import time_micros
from dpbudget.accountant.ledger.transaction import Transaction
from dpbudget.mechanisms import Laplace
from dpbudget.policies.blocks import block_start
from dpbudget.policies.periods import Period
from tests.policies.conftest import DAY, T0, Clock
from tests.support import set_ledger_clock, snapshot

DAILY = """
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
    Accountant.from_policy(write(DAILY), ledger=url).close()
    with SqliteLedger(tmp_path / "l.db") as ledger:
        before = snapshot(ledger)
    advancing = Clock()
    for opener in (lambda: Accountant.open(url, clock=advancing),
                   lambda: Accountant.from_policy(write(DAILY), ledger=url, clock=advancing),
                   lambda: Accountant.from_policy(write(DAILY), ledger=tmp_path / "l.db",
                                                  clock=advancing)):
        with pytest.raises(InvalidArgumentError, match="'clock'") as refused:
            opener()
        assert refused.value.argument == "clock"
    with pytest.raises(InvalidArgumentError, match="'clock'"):
        Accountant.from_policy(write(DAILY), ledger=_url(tmp_path, "new.db"), clock=advancing)
    assert not (tmp_path / "new.db").exists()  # nothing was opened, or created
    with SqliteLedger(tmp_path / "l.db") as ledger:
        assert snapshot(ledger) == before
    # In memory (tests, simulations) a clock is still the ledger's time.
    memory = MemoryLedger()
    Accountant.from_policy(write(DAILY), ledger=memory, clock=advancing, rng=0).release(
        Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    assert memory.clock is advancing


def test_365_epsilon_in_seconds_is_refused_and_the_old_path_let_it_through(
        write, tmp_path, monkeypatch, ledger_clock) -> None:
    """The issue's figure: ε = 1 a day, a clock advancing a day per call, 365 calls."""
    url = _url(tmp_path)
    Accountant.from_policy(write(DAILY), ledger=url).close()
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
    Accountant.from_policy(write(DAILY), ledger=old).close()
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
    with Accountant.from_policy(write(DAILY), ledger=url) as acc:
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
    memory = Accountant.from_policy(write(DAILY), clock=clock, rng=0)
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

    lifetime = DAILY + "[datasets.people]\nlimit = { epsilon = 10.0 }\n"
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
