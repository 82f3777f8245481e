"""The PostgreSQL ledger keeps its promise when the connection does not: a session killed by the
server is replaced on the next call (never a release without its debit), a writer holding the lock
too long ends in a typed error, and a process forked with an open ledger never uses its parent's
session. Against the real server the test session starts."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, LedgerError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.mechanisms import Laplace
from tests.conftest import _fresh_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn(postgres_database: str) -> str:
    return _fresh_schema(postgres_database)


def _kill_sessions(database: str) -> int:
    with psycopg.connect(database, autocommit=True) as conn:
        return len(conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
            "pg_backend_pid() AND datname = current_database()").fetchall())


@contextlib.contextmanager
def sessions_killed_before_each_write(ledger: Any, database: str) -> Iterator[None]:
    """Every record ``ledger`` writes meanwhile is written after the server ended its sessions
    (what a restart does to clients, in the middle of a debit's transaction)."""
    original = ledger._write_entry

    def dying(entry: Any) -> None:
        _kill_sessions(database)
        time.sleep(0.05)
        original(entry)

    ledger._write_entry = dying
    try:
        yield
    finally:
        ledger._write_entry = original


def test_a_killed_session_is_replaced_on_the_next_call(dsn: str, postgres_database: str) -> None:
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    for _ in range(3):
        assert _kill_sessions(postgres_database) >= 1  # what a server restart does to clients
        time.sleep(0.05)
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # no error: BEGIN found the session dead, nothing ran
    assert acc.spent().epsilon == pytest.approx(0.4)
    report = audit(acc.ledger)
    assert report.ok and report.records == 5  # record 1 states the ledger's policy
    acc.close()


def test_a_session_killed_mid_debit_loses_nothing(dsn: str, postgres_database: str) -> None:
    """A session that dies inside the transaction fails that release with a typed error and
    nothing drawn; the next release reconnects, and every answer has its debit."""
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    with sessions_killed_before_each_write(ledger, postgres_database), \
            pytest.raises(LedgerError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert audit(acc.ledger).ok
    assert acc.spent().epsilon == pytest.approx(0.2)
    acc.close()


def test_a_held_lock_ends_in_a_typed_error_not_a_hang(dsn: str) -> None:
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(dsn, timeout=0.5), rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with psycopg.connect(dsn) as holder:  # a transaction holding every lane's lock
        holder.execute("SELECT key FROM dpbudget_lanes FOR UPDATE")
        start = time.monotonic()
        with pytest.raises(LedgerError, match="lock timeout"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
        assert time.monotonic() - start < 10
        holder.rollback()
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # and goes on once the lock is free
    assert acc.spent().epsilon == pytest.approx(0.2)
    acc.close()


def _child_release(acc: Accountant, n: int, out: Any) -> None:
    try:
        for _ in range(n):
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
        out.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_forked_children_never_use_their_parents_session(dsn: str) -> None:
    acc = Accountant(Budget(10.0), ledger=dsn, rng=None)
    acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [ctx.Process(target=_child_release, args=(acc, 50, out)) for _ in range(4)]
    for c in children:
        c.start()
    for _ in range(50):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)  # the parent keeps using its own session meanwhile
    for c in children:
        c.join(60)
        assert c.exitcode == 0
    assert sorted(out.get(timeout=5) for _ in children) == ["ok"] * 4
    assert acc.spent().epsilon == pytest.approx(0.01 * 251, rel=1e-6)
    report = audit(acc.ledger)
    assert report.ok, [p.message for p in report.problems]
    acc.close()


@pytest.mark.postgres
def test_a_plan_made_stale_by_ddl_fails_one_debit_and_the_next_prepares_anew(
        postgres_database: str) -> None:
    """A column's type changed under a prepared read ("cached plan must not change result
    type"): the object refused every later debit until reopened, since only the statements of the
    failed round trip were forgotten (review of the one-package ledger). Now that debit fails,
    debiting nothing, and the next one prepares everything anew."""
    dsn = _fresh_schema(postgres_database)
    ledger = PostgresLedger(dsn)
    acc = Accountant(Budget(10.0), ledger=ledger, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="d")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE dpbudget_lanes ALTER COLUMN hash TYPE varchar(64)")
    outcomes = []
    for _ in range(3):
        try:
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="d")
            outcomes.append("answered")
        except LedgerError:
            outcomes.append("refused")
    assert outcomes[1:] == ["answered", "answered"]
    assert acc.spent("d").epsilon == pytest.approx(0.1 * (1 + outcomes.count("answered")))
    acc.close()
