"""An interrupt at every bytecode of the deferred flush's steps (accountant.ledger.postgres_sync):
opening the flushing session, the deferral check, the flush, and ``close``. Stand-in connections,
no server. After each interrupt: the flush lock is free for another thread, a commit whose flushing
session then breaks is confirmed only if a flush on that session really ran after it, the ledger
still defers and confirms new commits, and a second ``close`` finishes what the first began.

Tracing every opcode is stricter than a real signal (CPython runs handlers only at some bytecodes),
so every position a signal can reach is covered. Found by review; the broken variant of ``close``
(one ``finally``, as before the review) is the negative control."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest

from dpbudget.accountant import LedgerError
from dpbudget.accountant.ledger import postgres_sync
from dpbudget.accountant.ledger.postgres_sync import WaitedLock
from dpbudget.accountant.ledger.transaction import Scope, release_fully
from tests.test_postgres_sync_races import _Conn
from tests.test_postgres_sync_races import _Ledger as RacesLedger

_FILES = ("accountant/ledger/postgres_sync.py", "accountant/ledger/transaction.py")


class _Closing:
    def close(self) -> None:
        self._conn.close()  # type: ignore[attr-defined]


class _Ledger(RacesLedger, _Closing):
    """The races' stand-in ledger, closable (``PgSync.close`` calls ``super().close``), whose
    every flushing session opens on server S."""

    def _open_session(self) -> tuple[Any, str]:
        return _Conn("flusher"), "S"


@pytest.fixture(autouse=True)
def _contended_and_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WaitedLock, "contended", property(lambda self: True))
    monkeypatch.setattr(postgres_sync, "readable", lambda conn: False)


class _At:
    """A tracer raising KeyboardInterrupt at the ``n``-th opcode run in ``files``."""

    def __init__(self, n: int, files: tuple[str, ...]) -> None:
        self.n, self.files, self.count, self.where = n, files, 0, ""

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if not any(f in frame.f_code.co_filename.replace("\\", "/") for f in self.files):
            return None
        frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode" and not self.where:
            self.count += 1
            if self.count == self.n:
                self.where = f"{frame.f_code.co_name}:{frame.f_lineno}@{frame.f_lasti}"
                raise KeyboardInterrupt
        return self._local


def _interrupted(fn: Any, n: int, files: tuple[str, ...] = _FILES) -> str:
    """Run ``fn`` with an interrupt at its ``n``-th opcode; where it landed ('' if it ran out)."""
    at = _At(n, files)
    sys.settrace(at)
    try:
        fn()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return at.where


def _lock_free(ledger: _Ledger) -> bool:
    got: list[bool] = []

    def other() -> None:
        ok = ledger._flush_lock.acquire(blocking=False)
        got.append(ok)
        if ok:
            ledger._flush_lock.release()
    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    return got == [True]


def _check_after(ledger: _Ledger, first: _Conn, token: tuple[int, int], before: int,
                 where: str) -> list[str]:
    if not _lock_free(ledger):
        return [f"flush lock held after an interrupt at {where}"]
    problems = []
    really_durable = first.flushes > before  # a flush on its session ran after the commit
    first.broken = True  # the server restarts: an unflushed commit is lost
    ledger._want_flusher = True
    ledger._sync(None)  # a new flushing session, after the restart
    try:
        ledger._sync(token)
        if not really_durable:
            problems.append(f"a lost commit confirmed after an interrupt at {where}")
    except LedgerError:
        pass
    session = ledger._defer_to()
    if session is None:
        return problems + [f"no deferral after an interrupt at {where}"]
    try:
        ledger._sync(ledger._deferred(session))
    except LedgerError as exc:
        problems.append(f"unusable after an interrupt at {where}: {exc}")
    return problems


def _check_closed(ledger: _Ledger, first: _Conn, token: tuple[int, int], before: int,
                  where: str) -> list[str]:
    problems = []
    if not _lock_free(ledger):
        problems.append(f"flush lock held after an interrupt at {where}")
    ledger.close()
    if ledger._fl is not None or not first.closed:
        problems.append(f"a second close did not finish after an interrupt at {where}")
    try:
        ledger._sync(token)
        if first.flushes == before:
            problems.append(f"confirmed with no flush after an interrupt at {where}")
    except LedgerError:
        pass
    return problems


def _sweep(action: str, files: tuple[str, ...] = _FILES) -> tuple[int, list[str]]:
    problems: list[str] = []
    for n in range(1, 1000):
        ledger = _Ledger()
        ledger._want_flusher = True
        ledger._sync(None)
        assert ledger._fl is not None
        first = ledger._fl.conn
        token = ledger._deferred(ledger._defer_to() or 0)
        before = first.flushes
        if action == "open":
            first.broken = True  # a restart, then the reopening is interrupted
            ledger._want_flusher = True
            where = _interrupted(lambda: ledger._sync(None), n)
        elif action == "sync":
            where = _interrupted(lambda: ledger._sync(token), n)
        elif action == "defer":
            where = _interrupted(ledger._defer_to, n)
        else:
            where = _interrupted(ledger.close, n, files)
        if not where:
            return n - 1, problems
        if action == "close":  # (outside any transaction: nothing else frees its locks)
            problems += _check_closed(ledger, first, token, before, where)
        else:
            Scope(ledger).abandon()  # what the gate does with any exception from a debit
            problems += _check_after(ledger, first, token, before, where)
    raise AssertionError("the sweep did not end")


@pytest.mark.parametrize("action", ["open", "sync", "defer", "close"])
def test_an_interrupt_at_any_bytecode_leaves_the_flush_sound_and_usable(action: str) -> None:
    positions, problems = _sweep(action)
    assert positions > 20
    assert problems == []


def test_negative_control_a_close_with_one_finally(monkeypatch: pytest.MonkeyPatch) -> None:
    """``close`` as before the review: one ``finally``, the session forgotten before it is
    closed. An interrupt on the ``finally``'s line leaves the flush lock held for good (no
    ``abandon`` runs after a close), and one between forgetting and closing leaves the session
    open with nothing to close it."""
    def broken_variant(self: Any) -> None:
        lock = self._flush_lock
        try:
            lock.acquire(timeout=self.timeout)
            fl, self._fl = self._fl, None
            if fl is not None and fl.pid == os.getpid():
                fl.conn.close()
        finally:
            release_fully(lock)

    monkeypatch.setattr(_Ledger, "close", broken_variant)
    positions, problems = _sweep("close", _FILES + ("tests/test_postgres_sync_sweep.py",))
    assert positions > 10
    assert any("flush lock held" in p for p in problems)
    assert any("a second close did not finish" in p for p in problems)
