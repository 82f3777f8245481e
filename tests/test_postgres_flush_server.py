"""The deferred flush checks which server ran it (accountant.ledger.postgres_sync), on a real
server: behind a connection pooler the client's connection survives a server restart, so a flush
through it could run on the restarted server and confirm a commit that the restart lost. The
flush reports its server (address, port, start time) and must match the one its session opened
on; the control shows that the server it reports is the one the session recorded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from accountant import Accountant, Budget, LedgerError
from accountant.ledger.postgres import PostgresLedger
from accountant.ledger.postgres_sync import Flusher, WaitedLock
from mechanisms import Laplace
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


def _flushing_on(ledger: Any, recorded: str | None) -> None:
    """A new flushing session, recorded as opened on ``recorded`` (None: where it really is)."""
    if ledger._fl is not None:
        ledger._fl.conn.close()
    conn, server = ledger._open_session()
    if recorded is not None:
        ledger._server = server = recorded  # (the main session too, or nothing defers to it)
    ledger._numbered += 1
    ledger._fl = Flusher(conn, server, os.getpid(), ledger._numbered)


def test_a_flush_that_reaches_a_restarted_server_confirms_nothing(contended: Accountant) -> None:
    ledger = contended.ledger
    acc = contended
    start = ledger._server.rsplit(" ", 1)[1]
    # What the session recorded: the same address and port, an earlier start time.
    _flushing_on(ledger, ledger._server.replace(start, str(float(start) - 3600)))
    answers = []
    with pytest.raises(LedgerError, match="another server, or one restarted"):
        answers.append(acc.release(Laplace(0.1), 1.0))
    assert answers == [] and ledger.flushes == 0
    assert acc.spent().epsilon == pytest.approx(0.1)  # the debit stands: no refund


def test_control_a_flush_reports_the_server_its_session_recorded(contended: Accountant) -> None:
    ledger = contended.ledger
    _flushing_on(ledger, None)
    for _ in range(3):
        contended.release(Laplace(0.1), 1.0)
    assert ledger.flushes == 3
    assert contended.spent().epsilon == pytest.approx(0.3)
