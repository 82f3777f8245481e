"""The deferred flush checks which server ran it (accountant.ledger.postgres_sync), on a real
server: behind a connection pooler the client's connection survives a server restart, so a flush
through it could run on the restarted server and confirm a commit that the restart lost. The
flush reports its server (address, port, start time) and must match the one its session opened
on; the control shows that the server it reports is the one the session recorded."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, LedgerError
from dpbudget.accountant.ledger import postgres_sync
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.accountant.ledger.postgres_session import SERVER
from dpbudget.accountant.ledger.postgres_sync import Flusher, WaitedLock
from dpbudget.mechanisms import Laplace
from tests.conftest import _fresh_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
def contended(postgres_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Accountant]:
    """An accountant whose every commit defers its flush (as when other threads wait)."""
    monkeypatch.setattr(WaitedLock, "contended", property(lambda self: True))
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(_fresh_schema(postgres_database)),
                     rng=None)
    yield acc
    acc.close()


def _flushing_on(ledger: Any, earlier: bool) -> None:
    """A new flushing session; ``earlier``: recorded as opened on the same server (address and
    port) as it had started an hour earlier, i.e. before a restart."""
    if ledger._fl is not None:
        ledger._fl.conn.close()
    conn, server = ledger._open_session()
    reached = str(conn.execute("SELECT " + postgres_sync._REACHED).fetchone()[0])
    if earlier:
        start = server.rsplit(" ", 1)[1]
        before = str(float(start) - 3600)
        server, reached = server.replace(start, before), reached.replace(start, before)
        ledger._server = server  # (the main session too, or nothing defers to it)
    ledger._numbered += 1
    ledger._fl = Flusher(conn, server, os.getpid(), ledger._numbered, reached)


def test_a_flush_that_reaches_a_restarted_server_confirms_nothing(contended: Accountant) -> None:
    ledger = contended.ledger
    acc = contended
    _flushing_on(ledger, earlier=True)
    answers = []
    with pytest.raises(LedgerError, match="another server or backend"):
        answers.append(acc.release(Laplace(0.1, sensitivity=1.0), 1.0))
    assert answers == [] and ledger.flushes == 0
    assert acc.spent().epsilon == pytest.approx(0.1)  # the debit stands: no refund


def test_control_a_flush_reports_the_server_its_session_recorded(contended: Accountant) -> None:
    ledger = contended.ledger
    _flushing_on(ledger, earlier=False)
    for _ in range(3):
        contended.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert ledger.flushes == 3
    assert contended.spent().epsilon == pytest.approx(0.3)


def _identities(dsn: str) -> tuple[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT {SERVER}, {postgres_sync._REACHED}").fetchone()
        assert row is not None
        return str(row[0]), str(row[1])


@pytest.mark.slow
def test_a_recovery_from_a_crashed_backend_keeps_the_servers_start_time() -> None:
    """Why a flush also reports its backend (found by review): a backend killed by a signal makes
    the server end every session and recover from the log on disk, losing asynchronous commits
    not yet there, while its postmaster, and so its start time, lives on. The server part of the
    identity is the same after the recovery; a session opened after it (as a pooler reconnecting
    would) has another backend part."""
    from tests import _postgres

    if _postgres.available() is not None:
        pytest.skip(_postgres.available())
    with _postgres.server() as dsn:
        server_before, reached_before = _identities(dsn)
        victim = psycopg.connect(dsn, autocommit=True)
        row = victim.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        os.kill(int(row[0]), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # until the server has recovered and accepts sessions again
            try:
                server_after, reached_after = _identities(dsn)
                break
            except psycopg.Error:
                assert time.monotonic() < deadline, "the server did not recover"
                time.sleep(0.2)
        victim.close()
    assert server_after == server_before  # the postmaster's start time did not change
    assert reached_after != reached_before
