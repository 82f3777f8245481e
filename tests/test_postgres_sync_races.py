"""Races and interrupts in the deferred flush (accountant.ledger.postgres_sync), stepped
deterministically with stand-in connections (no server): a commit deferred to one flushing session
must never be confirmed by a flush on another — one opened after a restart that lost the commit, or
one on another server. Found by review; each test has a broken variant as its negative control."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from dpbudget.accountant import LedgerError
from dpbudget.accountant.ledger import postgres_sync
from dpbudget.accountant.ledger.postgres_sync import Flusher, PgSync, WaitedLock


class _Error(Exception):
    pass


class _Psycopg:
    Error = _Error


class _Conn:
    """A stand-in connection; ``server``: what a flush on it reports (the server it reaches)."""

    def __init__(self, name: str, server: str = "S") -> None:
        self.name, self.server = name, server
        self.closed, self.broken, self.flushes = False, False, 0

    def execute(self, sql: str) -> "_Conn":
        if self.closed or self.broken:
            raise _Error("the session ended")
        if "dpbudget_flush" in sql:
            self.flushes += 1
        return self

    def fetchall(self) -> list[tuple[str]]:
        return [(self.server,)]

    def fetchone(self) -> tuple[str]:
        return (self.server,)

    def close(self) -> None:
        self.closed = True


class _Ledger(PgSync):
    def __init__(self) -> None:
        self._psycopg = _Psycopg
        self._lock = WaitedLock()
        self._conn = _Conn("main")
        self._server = "S"
        self.timeout = 1.0
        self.opens: list[tuple[_Conn, str]] = []
        self._init_sync()

    def _open_session(self) -> tuple[Any, str]:
        return self.opens.pop(0)


@pytest.fixture(autouse=True)
def _contended_and_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WaitedLock, "contended", property(lambda self: True))
    monkeypatch.setattr(postgres_sync, "readable", lambda conn: False)


def _at_line(functions: tuple[str, ...], n: int, action: Any) -> Any:
    """A tracer that runs ``action`` at the ``n``-th line executed in ``functions`` (or in the
    negative controls' broken variant of them)."""
    seen = [0]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_name not in functions + ("broken_variant",):
            return None

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line":
                seen[0] += 1
                if seen[0] == n:
                    action()
            return local
        return local
    return tracer


def _raise() -> None:
    raise KeyboardInterrupt


def _lost_commit_confirmed(n: int) -> bool:
    """A commit deferred to flushing session 1; the server restarts (session 1 breaks, the commit
    is lost); a new flushing session is opened and interrupted at its ``n``-th line. Whether the
    old commit's token is then confirmed."""
    ledger = _Ledger()
    first = _Conn("before the restart")
    ledger.opens = [(first, "S")]
    ledger._want_flusher = True
    ledger._sync(None)
    token = ledger._deferred(ledger._defer_to() or 0)
    first.broken = True
    after = _Conn("after the restart")
    ledger.opens = [(after, "S")]
    ledger._want_flusher = True
    sys.settrace(_at_line(("_open_flusher", "_reopen"), n, _raise))
    try:
        ledger._sync(None)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    try:
        ledger._sync(token)
    except LedgerError:
        return False
    return True


def test_an_interrupt_anywhere_in_opening_a_flusher_never_confirms_a_lost_commit() -> None:
    assert not any(_lost_commit_confirmed(n) for n in range(1, 40))


def test_negative_control_a_flusher_published_before_its_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The order the review found: the new connection published under the old number, then
    numbered. An interrupt in between lets the new session confirm the lost commit."""
    def broken_variant(self: Any) -> None:
        old = self._fl
        self._fl = None
        if old is not None:
            old.conn.close()
        conn, server = self._open_session()
        self._fl = Flusher(conn, server, os.getpid(), self._numbered, conn.server)
        self._fl = self._fl._replace(number=self._numbered + 1)
        self._numbered += 1

    monkeypatch.setattr(_Ledger, "_open_flusher", broken_variant)
    assert any(_lost_commit_confirmed(n) for n in range(1, 12))


def _flushed_on_another_server(n: int) -> bool:
    """Another thread replaces a healthy flushing session on server S by one on server X at the
    ``n``-th line of ``_defer_to``; whether a commit sent to S is then flushed on X."""
    ledger = _Ledger()
    first = _Conn("on S")
    ledger.opens = [(first, "S")]
    ledger._want_flusher = True
    ledger._sync(None)
    elsewhere = _Conn("on X", "X")

    def other_thread() -> None:
        first.broken = True
        ledger.opens = [(elsewhere, "X")]
        ledger._want_flusher = True
        ledger._open_flusher()

    sys.settrace(_at_line(("_defer_to",), n, other_thread))
    try:
        session = ledger._defer_to()
    finally:
        sys.settrace(None)
    if session is None:
        return False
    try:
        ledger._sync(ledger._deferred(session))
    except LedgerError:
        return False
    return elsewhere.flushes > 0


def test_a_flusher_replaced_during_the_deferral_check_never_flushes_another_servers_commit(
        ) -> None:
    assert not any(_flushed_on_another_server(n) for n in range(1, 20))


def test_negative_control_a_deferral_that_reads_the_number_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks on one record, the number read afresh (as before the review): the race confirms a
    commit on S by a flush on X."""
    def broken_variant(self: Any) -> int | None:
        fl = self._fl
        if fl is None or fl.server != self._server or fl.conn.closed or fl.conn.broken:
            return None
        return self._fl.number  # type: ignore[no-any-return]

    monkeypatch.setattr(_Ledger, "_defer_to", broken_variant)
    assert any(_flushed_on_another_server(n) for n in range(1, 20))


def test_a_flusher_on_another_server_is_replaced() -> None:
    """A flushing session on another server than the main session's is not deferred to, and is
    replaced after the next commit (before the review it stayed, and deferral stayed off)."""
    ledger = _Ledger()
    ledger.opens = [(_Conn("on X", "X"), "X")]
    ledger._want_flusher = True
    ledger._sync(None)
    assert ledger._defer_to() is None and ledger._want_flusher
    ledger.opens = [(_Conn("on S"), "S")]
    ledger._sync(None)
    assert ledger._fl is not None and ledger._fl.server == "S" and ledger._defer_to() == 2


def test_a_child_never_flushes_or_closes_its_parents_session() -> None:
    ledger = _Ledger()
    parents = _Conn("the parent's")
    ledger._fl = Flusher(parents, "S", os.getpid() + 1, 1, "S")  # (as if opened by another process)
    assert ledger._defer_to() is None
    with pytest.raises(LedgerError, match="unconfirmed|did not confirm"):
        ledger._sync((1, 0 + ledger._commits + 1))
    ledger.opens = [(_Conn("the child's"), "S")]
    ledger._sync(None)
    assert parents.flushes == 0 and not parents.closed


def _deferred_through_a_pooler() -> tuple[_Ledger, _Conn, tuple[int, int]]:
    """A commit deferred to a flushing session opened on server S (started at t0)."""
    ledger = _Ledger()
    ledger._server = "S started at t0"
    flusher = _Conn("through a pooler", "S started at t0, backend 1")
    ledger.opens = [(flusher, "S started at t0")]
    ledger._want_flusher = True
    ledger._sync(None)
    return ledger, flusher, ledger._deferred(ledger._defer_to() or 0)


@pytest.mark.parametrize("after", ["S started at t1", "S started at t0, backend 2"])
def test_a_flush_on_a_restarted_server_behind_a_pooler_confirms_nothing(after: str) -> None:
    """Behind a pooler the client's connection outlives a server restart, or a recovery from a
    crashed backend (which keeps the server's start time), never broken: only the server and
    backend the flush itself reports can tell that it ran after the restart, which may have lost
    the commit (found by review)."""
    ledger, flusher, token = _deferred_through_a_pooler()
    flusher.server = after  # the pooler reconnected underneath
    with pytest.raises(LedgerError, match="another server or backend"):
        ledger._sync(token)
    assert ledger.flushes == 0 and not ledger._covered(*token)


def test_control_the_same_flush_with_no_restart_confirms() -> None:
    ledger, _, token = _deferred_through_a_pooler()
    ledger._sync(token)
    assert ledger.flushes == 1 and ledger._covered(*token)
