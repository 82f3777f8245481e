"""Group commit between the threads of one ``PostgresLedger``: a commit made while other threads
wait for the object leaves its flush until the object is released, and runs it on a session of
its own, where one flush covers every commit before it began. (The SQLite ledger's ``_sync`` does
the same with ``fsync``: ``accountant.ledger.sqlite``.)

Why: one ``PostgresLedger`` has one session, so its threads take turns on it. A lone thread's
debit flushes in its own round trip (``PostgresLedger._commit``); with that flush inside the turn,
threads sharing an accountant would wait for the disk one after the other and never share a disk
write.

Why a deferred commit is still on disk before anything is drawn on it. The debit's COMMIT is
asynchronous: when it returns, its commit record is in the server's write-ahead log, though maybe
not yet on disk. The flush is a write committed with ``synchronous_commit`` on, which returns only
once the log is on disk up to its own commit record. A flush that began after our COMMIT returned
has its commit record after ours in the server's one log, whichever session it runs on, and the
log reaches the disk in order, up to a position: so ours is on disk too (PostgreSQL documentation,
"Reliability and the Write-Ahead Log", sections "Asynchronous Commit" and "WAL Internals").
``Scope.commit`` calls ``_sync`` before it returns,
so the gate draws nothing on a debit before that. A crash in between loses the debit and every
record after it in the log, none of which was drawn on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from accountant.errors import LedgerError

__all__ = ["FLUSH", "PgSync", "WaitedLock"]

# Makes an asynchronous commit before it durable: a write, so its transaction waits for the
# disk — an upsert, which writes a row even if someone deleted them all (an UPDATE matching no row
# would write nothing and wait for nothing); a row per backend slot, so that writers do not queue
# on one row.
FLUSH = ("INSERT INTO dpbudget_flush AS f VALUES (mod(pg_backend_pid(), 64), 1) "
         "ON CONFLICT (slot) DO UPDATE SET n = f.n + 1 RETURNING 0")


class WaitedLock:
    """A re-entrant lock that knows whether another thread is waiting for it (``contended``).

    The answer is a hint, never a guarantee: a thread that an interrupt stops while waiting may
    stay counted until it takes the lock again, and then commits defer their flush meanwhile —
    which costs a round trip, never durability."""

    __slots__ = ("_inner", "_waiting")

    def __init__(self) -> None:
        self._inner = threading.RLock()
        self._waiting: set[int] = set()  # (set.add and discard are atomic between threads)

    def acquire(self, blocking: bool = True, timeout: float = -1.0) -> bool:
        if self._inner.acquire(False):
            return True
        if not blocking:
            return False
        me = threading.get_ident()
        self._waiting.add(me)
        try:
            return self._inner.acquire(True, timeout)
        finally:
            self._waiting.discard(me)

    def release(self) -> None:
        self._inner.release()

    def _is_owned(self) -> bool:
        owned: bool = self._inner._is_owned()  # type: ignore[attr-defined]
        return owned

    @property
    def contended(self) -> bool:
        return bool(self._waiting)

    def forget_waiters(self) -> None:
        """After ``fork()``: the parent's waiting threads do not exist here."""
        self._waiting = set()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class PgSync:
    """The deferred flush of ``PostgresLedger`` (a mixin). ``_deferred()`` counts a commit whose
    COMMIT has returned without its flush and gives its token; ``_sync(token)`` returns once that
    commit is on disk."""

    _psycopg: Any
    _lock: Any
    timeout: float
    _open_session: Callable[[], Any]  # (PgSession's)

    def _init_sync(self) -> None:
        self._flusher: Any = None  # the flushing session, opened on first use
        self._flusher_pid = os.getpid()
        self._flush_lock = threading.RLock()
        self._commits = 0  # deferred commits, counted once their COMMIT has returned
        self._synced = 0  # every deferred commit up to this count is on disk
        self.flushes = 0  # flushes run here (each covers the deferred commits before it)

    def _deferred(self) -> int:
        """Count a commit whose COMMIT has returned; its token for ``_sync``."""
        self._commits += 1
        return self._commits

    def _sync_forked(self, inherited: list[Any]) -> None:
        """In a forked child, before its first transaction: the parent's flushing session, lock
        (maybe held by a thread that is not here) and counts are the parent's."""
        if self._flusher is not None:
            inherited.append(self._flusher)  # (its finaliser must not end the parent's session)
        self._init_sync()

    def _sync(self, token: Any) -> None:
        """Return once the deferred commit ``token`` is on disk: at once if a flush that began
        after it has completed, else after a flush of our own (other threads wait for it, and
        find that it covered them too). None: the commit flushed in its own round trip.

        Raises:
            LedgerError: the commit cannot be confirmed on disk (the flush failed, or another
                thread's did not end within the timeout): nothing may be drawn on it, and its
                budget stays spent.
        """
        if token is None or self._synced >= token:
            return
        lock = self._flush_lock
        try:  # (acquired inside the try: an interrupt right after it still releases it below)
            if not lock.acquire(timeout=self.timeout):
                raise LedgerError(_unconfirmed("another thread's flush did not end within the "
                                               "timeout"))
            if self._synced >= token:
                return  # covered by the flush this thread waited for
            target = self._commits  # read before the flush begins: every one of them precedes it
            try:
                conn = self._flusher
                if conn is None or conn.closed or conn.broken:
                    conn = self._flusher = self._open_session()
                rows = conn.execute(FLUSH).fetchall()
            except self._psycopg.Error as exc:
                raise LedgerError(_unconfirmed(str(exc).strip() or type(exc).__name__)) from exc
            if len(rows) != 1:
                raise LedgerError(_unconfirmed("the flush wrote no row: dpbudget_flush is hidden "
                                               "or refused"))
            self.flushes += 1
            if target > self._synced:
                self._synced = target
        finally:
            while lock._is_owned():  # type: ignore[attr-defined]
                try:
                    lock.release()
                except KeyboardInterrupt:
                    continue

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        with self._lock:
            conn, self._flusher = self._flusher, None
            if conn is not None and self._flusher_pid == os.getpid():
                conn.close()  # (a thread flushing on it gets a typed error: unconfirmed)


def _unconfirmed(why: str) -> str:
    return ("PostgreSQL ledger: the debit was committed but the server did not confirm that it "
            f"reached the disk ({why}); nothing was drawn on it, and its budget stays spent")
