"""Group commit keeps "on disk before the draw": the PostgreSQL ledger releases its locks before
the disk write (so that other writers go on meanwhile), and every release still waits until its own
commit is durable before any noise is drawn.

PostgreSQL commits asynchronously and then waits for the log to reach the disk through a
synchronous write. Each check has a negative control: with the sync switched off, the same test
sees the missing syncs. (SQLite syncs inside each commit itself, ``synchronous=FULL``:
tests/ledger/test_backends.py.)
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, LedgerError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger.postgres.session import Session
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


# -- PostgreSQL ------------------------------------------------------------------------------


def _wal_syncs(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")  # (the statistics are flushed at the end of a statement)
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.postgres
@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "negative-control"])
def test_postgres_waits_for_the_disk_before_each_draw(postgres_database: str, synchronous: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each release forces a write-ahead-log sync (``pg_stat_wal.wal_sync``): its session commits
    with ``synchronous_commit = on``. The control sets it off for the session (as a role's or
    database's setting would, which the ledger overrides): the syncs are left to the WAL writer."""
    dsn = _fresh_schema(postgres_database)
    if not synchronous:
        connect = Session.connect

        def asynchronous(self: Session) -> None:
            connect(self)
            self.conn.execute("SET synchronous_commit = off")

        monkeypatch.setattr(Session, "connect", asynchronous)
    acc = Accountant(Budget(10.0), ledger=dsn, rng=0, simulation=True)
    before = _wal_syncs(postgres_database)
    for _ in range(RELEASES):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.close()  # (a session reports its statistics when it ends)
    time.sleep(0.2)
    synced = _wal_syncs(postgres_database) - before
    if synchronous:
        assert synced >= RELEASES
    else:
        assert synced < RELEASES // 2


@pytest.mark.postgres
def test_postgres_a_failed_commit_is_not_reported_as_committed(postgres_database: str) -> None:
    """A COMMIT that fails (a deferred constraint trigger) on a live session committed nothing:
    a plain LedgerError, never one that says the debit may stand."""
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$")
        conn.execute("CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON dpbudget_entries "
                     "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()")
        with pytest.raises(LedgerError, match="refused at commit") as caught:
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
        assert "committed" not in str(caught.value)
        conn.execute("DROP TRIGGER refuse ON dpbudget_entries")
    assert acc.spent().epsilon == 0.0
    acc.close()
