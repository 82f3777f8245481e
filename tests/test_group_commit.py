"""Group commit keeps "on disk before the draw": the ledgers release their write locks before the
disk write (so that other writers go on meanwhile), and every release still waits until its own
commit is durable before any noise is drawn.

SQLite runs ``synchronous=NORMAL`` and syncs the WAL itself after the lock; PostgreSQL commits
asynchronously and then waits for the log to reach the disk through a synchronous write. Each
check has a negative control: with the sync switched off, the same test sees the missing syncs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, LedgerError
from dpbudget.accountant.audit import audit
from dpbudget.accountant.ledger import SqliteLedger
from dpbudget.accountant.ledger import postgres as pg_module
from dpbudget.accountant.ledger import sqlite as sqlite_module
from dpbudget.mechanisms import Laplace
from tests.conftest import _fresh_schema

RELEASES = 40


class _Watched:
    """The accountant's sampler, noting in ``events`` each time noise is drawn."""

    def __init__(self, sampler: Any, events: list[str]) -> None:
        self._sampler, self._events = sampler, events

    def __getattr__(self, name: str) -> Any:
        if name not in ("source", "is_cryptographic"):  # (read to describe the noise)
            self._events.append("draw")
        return getattr(self._sampler, name)


def _watch_fsyncs(monkeypatch: pytest.MonkeyPatch, wal: Path, events: list[str]) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        if os.fstat(fd).st_ino == os.stat(wal).st_ino:
            events.append("sync")

    monkeypatch.setattr(os, "fsync", fsync)


def test_sqlite_syncs_each_commit_before_its_draw(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    acc = Accountant(Budget(10.0), ledger=f"sqlite:///{tmp_path / 'l.db'}", rng=0, simulation=True)
    events: list[str] = []
    acc._gate.sampler = _Watched(acc._gate.sampler, events)  # type: ignore[assignment]
    _watch_fsyncs(monkeypatch, tmp_path / "l.db-wal", events)
    for _ in range(RELEASES):
        acc.release(Laplace(0.1), 1.0)
    # One thread, one release at a time: each commit's sync comes before that release's draw.
    draws = [i for i, e in enumerate(events) if e == "draw"]
    assert len(draws) >= RELEASES
    assert events[0] == "sync"
    for i in draws:
        assert "sync" in events[:i]
    firsts = [i for i in draws if i == 0 or events[i - 1] != "draw"]
    assert all(events[i - 1] == "sync" for i in firsts), events[:12]
    assert events.count("sync") == RELEASES
    acc.close()


def test_sqlite_negative_control_without_the_sync(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the test above fails when the ledger does not sync."""
    acc = Accountant(Budget(10.0), ledger=f"sqlite:///{tmp_path / 'l.db'}", rng=0, simulation=True)
    events: list[str] = []
    _watch_fsyncs(monkeypatch, tmp_path / "l.db-wal", events)
    monkeypatch.setattr(SqliteLedger, "_sync", lambda self, token: None)
    for _ in range(RELEASES):
        acc.release(Laplace(0.1), 1.0)
    assert events.count("sync") < RELEASES // 4  # only checkpoints sync (synchronous=NORMAL)
    acc.close()


def test_sqlite_one_sync_covers_every_commit_before_it(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    events: list[str] = []
    for _ in range(3):
        with ledger.transaction() as tx:
            tx.append({"kind": '"test"'}, [])
    _watch_fsyncs(monkeypatch, tmp_path / "l.db-wal", events)
    # The three commits above each synced already; two more commits, then their syncs in reverse.
    tokens = []
    for _ in range(2):
        scope = ledger.transaction()
        scope.begin().append({"kind": '"test"'}, [])
        with ledger._lock:
            ledger._w.committing(())  # type: ignore[union-attr]
            tokens.append(ledger._commit())
            ledger._lock.release()  # (begin took it; commit without the public path's sync)
    ledger._sync(tokens[1])
    ledger._sync(tokens[0])  # covered by the sync for the later commit: no second sync
    assert events == ["sync"]
    ledger.close()


def test_sqlite_a_failed_sync_draws_nothing_and_keeps_the_debit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acc = Accountant(Budget(1.0), ledger=f"sqlite:///{tmp_path / 'l.db'}", rng=0, simulation=True)
    events: list[str] = []
    acc._gate.sampler = _Watched(acc._gate.sampler, events)  # type: ignore[assignment]

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(LedgerError, match="committed but could not be confirmed on disk"):
        acc.release(Laplace(0.25), 1.0)
    assert events == []  # nothing drawn
    monkeypatch.undo()
    assert acc.spent().epsilon == 0.25  # the debit stands: refusing to draw never refunds
    # A later sync that succeeds proves nothing about the frames the failed one held (Linux
    # reports a write error once): every further debit on this ledger is refused in this process,
    # by this object and by a new one.
    with pytest.raises(LedgerError, match="sync of its WAL failed earlier"):
        acc.release(Laplace(0.25), 1.0)
    reopened = Accountant.open(f"sqlite:///{tmp_path / 'l.db'}", rng=0,
                               simulation=True)  # (opening only reads)
    with pytest.raises(LedgerError, match="sync of its WAL failed earlier"):
        reopened.release(Laplace(0.25), 1.0)
    reopened.close()
    assert events == []
    assert audit(acc.ledger).ok  # reading still works
    acc.close()


@pytest.fixture(autouse=True)
def _forget_failed_syncs() -> Any:
    yield
    sqlite_module._FAILED_SYNCS.clear()  # (each test's files are its own)


def test_sqlite_a_commit_without_a_release_is_synced_too(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An import (records written without ``Transaction.append``) is on disk when it returns."""
    ledger = SqliteLedger(tmp_path / "l.db")
    events: list[str] = []
    _watch_fsyncs(monkeypatch, tmp_path / "l.db-wal", events)
    scope = ledger.transaction()
    scope.begin()
    ledger._write_accounts([])
    ledger._execute("INSERT INTO meta VALUES ('note', 'x')")
    scope.commit()
    assert events == ["sync"]
    scope = ledger.transaction()
    scope.begin()  # a transaction that writes nothing needs no sync
    scope.commit()
    assert events == ["sync"]
    ledger.close()


# -- PostgreSQL ------------------------------------------------------------------------------


def _wal_syncs(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")  # (the statistics are flushed at the end of a statement)
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.postgres
@pytest.mark.parametrize("flush", [True, False], ids=["flush", "negative-control"])
def test_postgres_waits_for_the_disk_before_each_draw(postgres_database: str, flush: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each release forces a write-ahead-log sync (``pg_stat_wal.wal_sync``); without the
    flushing statement, asynchronous commits leave the syncs to the server's WAL writer."""
    dsn = _fresh_schema(postgres_database)
    if not flush:  # a one-row write that is not WAL-logged (a temporary table): no disk wait
        # (returning, like the flush, a number for the next record)
        monkeypatch.setattr(pg_module, "_FLUSH", "CREATE TEMP TABLE IF NOT EXISTS no_wal (x int); "
                            "INSERT INTO no_wal VALUES (1) RETURNING nextval('dpbudget_seq')")
    acc = Accountant(Budget(10.0), ledger=dsn, rng=0, simulation=True)
    before = _wal_syncs(postgres_database)
    for _ in range(RELEASES):
        acc.release(Laplace(0.1), 1.0)
    acc.close()  # (a session reports its statistics when it ends)
    time.sleep(0.2)
    synced = _wal_syncs(postgres_database) - before
    if flush:
        assert synced >= RELEASES
    else:
        assert synced < RELEASES // 2


@pytest.mark.postgres
def test_postgres_flush_rows_deleted_still_wait_for_the_disk(postgres_database: str) -> None:
    """An UPDATE of a deleted row would write nothing and wait for nothing (fail-open): the
    flush is an upsert, so deleting the rows changes nothing."""
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(10.0), ledger=dsn, rng=0, simulation=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM dpbudget_flush")
    before = _wal_syncs(postgres_database)
    for _ in range(RELEASES):
        acc.release(Laplace(0.1), 1.0)
    acc.close()
    time.sleep(0.2)
    assert _wal_syncs(postgres_database) - before >= RELEASES


@pytest.mark.postgres
def test_postgres_a_failed_commit_is_not_reported_as_committed(postgres_database: str) -> None:
    """A COMMIT that fails (a deferred constraint trigger) leaves the session idle, like a flush
    that fails after it: the ledger tells them apart by looking for its record."""
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$")
        conn.execute("CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON dpbudget_entries "
                     "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()")
        with pytest.raises(LedgerError, match="refused at commit") as caught:
            acc.release(Laplace(0.25), 1.0)
        assert "committed" not in str(caught.value)
        conn.execute("DROP TRIGGER refuse ON dpbudget_entries")
    assert acc.spent().epsilon == 0.0
    acc.close()


@pytest.mark.postgres
@pytest.mark.parametrize("body, message", [
    ("RETURN NULL", "flush wrote no row"),  # a BEFORE trigger that drops the write
    ("RAISE EXCEPTION 'disk gone'", "debit was committed but the server did not"),
], ids=["no-row-written", "flush-fails"])
def test_postgres_an_unconfirmed_commit_draws_nothing(postgres_database: str, body: str,
                                                      message: str) -> None:
    """A flush that writes no row (an UPDATE of deleted rows would be one) or fails is not
    trusted: the release fails after its commit, nothing is drawn, and the debit stands."""
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    events: list[str] = []
    acc._gate.sampler = _Watched(acc._gate.sampler, events)  # type: ignore[assignment]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION flush_trap() RETURNS trigger LANGUAGE plpgsql AS "
                     f"$$ BEGIN {body}; END $$")
        conn.execute("CREATE TRIGGER flush_trap BEFORE INSERT OR UPDATE ON dpbudget_flush FOR "
                     "EACH ROW EXECUTE FUNCTION flush_trap()")
        with pytest.raises(LedgerError, match=message):
            acc.release(Laplace(0.25), 1.0)
        assert events == []
        conn.execute("DROP TRIGGER flush_trap ON dpbudget_flush")
    assert acc.spent().epsilon == 0.25  # the debit stands
    acc.release(Laplace(0.25), 1.0)
    assert audit(acc.ledger).ok
    acc.close()
