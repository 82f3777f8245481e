"""A transaction (``accountant.ledger.transaction``) ends committed, or rolled back with its lock
free. A caller can tell by type whether a retry pays again: ``LedgerUnconfirmedError`` is raised
exactly where the debit was (or may have been) committed but not confirmed on disk — the budget
is spent, the answer withheld — and a ledger error before the commit stays a plain
``LedgerError`` (nothing written: a retry pays once). Nothing is drawn in either case.

Each fault is injected where the ledger tests already inject it
(``tests/ledger/postgres/test_session.py``), with their stand-ins; the refusals before the commit are
the negative controls: the same assertions fail on them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import dpbudget as dp
from dpbudget.accountant import Accountant, Budget, LedgerError, LedgerUnconfirmedError
from dpbudget.accountant.ledger.entry import Account
from dpbudget.accountant.ledger.sqlite import SqliteLedger
from dpbudget.accountant.ledger.transaction import Transaction
from dpbudget.mechanisms import Laplace
from tests.contracts import LedgerContract, debit_fields
from tests.ledger.postgres.test_session import _Watched

CANARY = 987654.321  # the true answer: never in a message


def _watched(acc: Accountant) -> list[str]:
    events: list[str] = []
    acc._gate.sampler = _Watched(acc._gate.sampler, events)  # type: ignore[assignment]
    return events


def _outcome(acc: Accountant, epsilon: float = 0.25) -> LedgerError:
    """The ledger error a release ends in (asserting that it returns no answer)."""
    answers: list[Any] = []
    with pytest.raises(LedgerError) as caught:
        answers.append(acc.release(Laplace(epsilon, sensitivity=1.0), CANARY))
    assert answers == []
    assert str(CANARY) not in str(caught.value) and "987654" not in str(caught.value)
    return caught.value


def test_the_type_is_public_and_a_ledger_error() -> None:
    assert dp.LedgerUnconfirmedError is LedgerUnconfirmedError
    assert issubclass(LedgerUnconfirmedError, LedgerError)  # old `except LedgerError` still catch
    assert "do not retry" in (LedgerUnconfirmedError.__doc__ or "").lower()


def test_sqlite_a_failed_commit_is_unconfirmed(tmp_path: Path) -> None:
    """SQLite writes and syncs the WAL inside the COMMIT (``synchronous=FULL``): a COMMIT that
    fails may have left the debit's frames on disk, so the budget is treated as spent."""
    import sqlite3

    acc = Accountant(Budget(1.0), ledger=f"sqlite:///{tmp_path / 'l.db'}", rng=0, simulation=True)
    events = _watched(acc)
    real = acc.ledger._conn  # type: ignore[attr-defined]

    class FailingCommit:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

    acc.ledger._conn = FailingCommit()  # type: ignore[attr-defined]
    error = _outcome(acc)
    acc.ledger._conn = real  # type: ignore[attr-defined]
    assert isinstance(error, LedgerUnconfirmedError) and "nothing was drawn" in str(error)
    assert events == []
    acc.close()


def test_sqlite_a_refusal_before_the_commit_is_plain(tmp_path: Path) -> None:
    """Negative control: a ledger file deleted while in use is refused at the begin; nothing
    written, so a retry (on the restored file) pays once."""
    path = tmp_path / "l.db"
    acc = Accountant(Budget(1.0), ledger=f"sqlite:///{path}", rng=0, simulation=True)
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    events = _watched(acc)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    error = _outcome(acc)
    assert type(error) is LedgerError and "nothing was written" in str(error)
    assert events == []
    acc.close()


# --- PostgreSQL ---------------------------------------------------------------------------------


@pytest.fixture
def dsn(postgres_database: str) -> str:
    from tests.conftest import _fresh_schema

    return _fresh_schema(postgres_database)


@pytest.mark.postgres
def test_postgres_a_commit_refused_by_the_server_is_plain(dsn: str) -> None:
    """The COMMIT itself fails (a deferred constraint trigger) on a live session: nothing was
    committed, and the type is the plain one (the control of the test below)."""
    import psycopg

    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    events = _watched(acc)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$")
        conn.execute("CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON dpbudget_entries "
                     "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()")
        error = _outcome(acc)
        conn.execute("DROP TRIGGER refuse ON dpbudget_entries")
    assert type(error) is LedgerError
    assert events == [] and acc.spent().epsilon == 0.0  # nothing written: a retry pays once
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    assert acc.spent().epsilon == 0.25
    acc.close()


@pytest.mark.postgres
def test_postgres_a_session_lost_during_the_commit_is_unconfirmed(
        dsn: str, postgres_database: str) -> None:
    """The session dies before the commit's round trip: the ledger cannot tell whether the
    COMMIT ran, so the debit may stand — unconfirmed, never the plain type."""
    from dpbudget.accountant.ledger.postgres import PostgresLedger
    from tests.ledger.postgres.test_session import sessions_killed_before_each_write

    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    events = _watched(acc)
    with sessions_killed_before_each_write(ledger, postgres_database):
        error = _outcome(acc)
    assert isinstance(error, LedgerUnconfirmedError) and "may have been" in str(error)
    assert events == []
    acc.close()


def test_abandon_rolls_back_and_frees_every_level_of_the_lock(tmp_path: Path) -> None:
    """``Transaction.abandon`` (the explicit form the gate uses): after a begin and an append, and
    with the lock taken once more (as an interrupt between two acquisitions leaves it), nothing is
    written and another thread debits at once; a second abandon is harmless. The negative
    control: one plain release (the naive clean-up) leaves the lock held."""
    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        tx = ledger.transaction()
        assert isinstance(tx, Transaction) and tx.begin() is tx
        accounts = [Account("dataset:a", "basic", {"rule": "basic"},
                            {"epsilon": 9.0, "delta": 0.0}, 0)]
        tx.append(debit_fields(accounts, kind="release", dataset="dataset:a"), accounts)
        ledger._lock.acquire()
        ledger._lock.release()
        assert ledger._lock._is_owned()  # the control: one release is not enough
        ledger._lock.acquire()
        tx.abandon()
        tx.abandon()
        assert not ledger._lock._is_owned()
        other = threading.Thread(target=LedgerContract._append, args=(ledger, 1))
        other.start()
        other.join(timeout=30)
        assert not other.is_alive()
        assert [e.seq for e in ledger.entries()] == [1]
        assert ledger.account("dataset:a").state["epsilon"] == 0.25  # not the abandoned 9.0
    finally:
        ledger.close()
