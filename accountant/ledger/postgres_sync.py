"""Group commit between the threads of one ``PostgresLedger``: a commit made while other threads
wait for the object leaves its flush until the object is released, and runs it on a session of
its own, where one flush covers every commit before it began. (The SQLite ledger's ``_sync`` does
the same with ``fsync``: ``dpbudget.accountant.ledger.sqlite``.)

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
from typing import Any, NamedTuple

from dpbudget.accountant.errors import LedgerError, LedgerUnconfirmedError
from dpbudget.accountant.ledger.postgres_session import BACKEND, SERVER, readable
from dpbudget.accountant.ledger.transaction import release_fully

__all__ = ["FLUSH", "Flusher", "PgSync", "WaitedLock"]

# Makes an asynchronous commit before it durable: a write, so its transaction waits for the
# disk — an upsert, which writes a row even if someone deleted them all (an UPDATE matching no row
# would write nothing and wait for nothing); a row per backend slot, so that writers do not queue
# on one row.
FLUSH = ("INSERT INTO dpbudget_flush AS f VALUES (mod(pg_backend_pid(), 64), 1) "
         "ON CONFLICT (slot) DO UPDATE SET n = f.n + 1 RETURNING 0")
# The flushing session's: it also says which server and backend ran it. The client's connection
# surviving is not enough: a pooler in front of the server keeps it across a restart (or a recovery
# from a crashed backend), and a flush there would confirm a commit the restart lost.
_REACHED = f"concat_ws(' ', {SERVER}, {BACKEND})"
_FLUSH_ON = FLUSH.replace("RETURNING 0", "RETURNING " + _REACHED)


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
    """The deferred flush of ``PostgresLedger`` (a mixin). ``_defer_to()`` says whether a commit
    about to be sent may leave its flush to the flushing session (and which one); after its
    COMMIT has returned, ``_deferred(session)`` counts it and gives its token; ``_sync(token)``
    returns once that commit is on disk.

    A flush confirms only commits sent while its session was already open, only if that session
    never broke in between, and only if the flush reports the server the session opened on (a
    pooler can keep a connection across a restart): a session opened later could be on a server
    restarted since (a crash discards an asynchronous commit not yet on disk), or on another host,
    where its flush would confirm nothing. A commit whose flushing session broke is reported
    unconfirmed (a typed error; nothing drawn, the budget stays spent)."""

    _psycopg: Any
    _lock: Any
    _conn: Any
    _server: str  # the main session's server (PgSession: address, port, start time)
    timeout: float
    _open_session: Callable[[], tuple[Any, str]]  # (PgSession's)

    def _init_sync(self) -> None:
        # The flushing session (opened when threads first contend), published whole: every check
        # reads one record once, so that no check can mix two sessions' fields (one opened
        # meanwhile by another thread, or left half-published by an interrupt).
        self._fl: Flusher | None = None
        self._numbered = 0  # flushing sessions numbered so far (each record's number is unique)
        self._want_flusher = False
        self._flush_lock = threading.RLock()
        self._commits = 0  # deferred commits, counted once their COMMIT has returned
        self._synced = (0, 0)  # (session, count): that session's flushes cover commits <= count
        self.flushes = 0  # flushes run on the flushing session

    def _locks(self) -> tuple[Any, ...]:
        return (self._lock, self._flush_lock)

    def _after_fork(self) -> None:
        """In a child just forked (``Ledger._after_fork``): new locks, and the transaction a
        thread of the parent may have had open forgotten (``_rollback`` leaves the parent's
        session alone in a child)."""
        self._lock = WaitedLock()
        self._flush_lock = threading.RLock()
        self._rollback()  # type: ignore[attr-defined]

    def _defer_to(self) -> int | None:
        """Under the object's lock, before the COMMIT is sent: the number of the flushing session
        that may make it durable, or None (flush in the round trip: no other thread waits, or no
        healthy flushing session on the main session's server is open yet — then one is opened
        after this commit)."""
        if not self._lock.contended:
            return None
        fl = self._fl
        if (fl is None or fl.pid != os.getpid() or fl.server != self._server or fl.conn.closed
                or fl.conn.broken or readable(fl.conn)):
            self._want_flusher = True
            return None
        return fl.number

    def _deferred(self, session: int) -> tuple[int, int]:
        """Count a commit (sent deferred to ``session``) whose COMMIT has returned; its token."""
        self._commits += 1
        return (session, self._commits)

    def _sync_forked(self, inherited: list[Any]) -> None:
        """In a forked child, before its first transaction: the parent's flushing session, lock
        (maybe held by a thread that is not here) and counts are the parent's."""
        if self._fl is not None:
            inherited.append(self._fl.conn)  # (its finaliser must not end the parent's session)
        self._init_sync()

    def _sync(self, token: Any) -> None:
        """Return once the deferred commit ``token`` is on disk: at once if a flush that began
        after it has completed on its session, else after a flush of our own (other threads
        wait for it, and find that it covered them too). None: the commit flushed in its own
        round trip (and a flushing session is opened if one was wanted).

        Raises:
            LedgerUnconfirmedError: the commit cannot be confirmed on disk (the flush failed, its session
                ended after the commit, or another thread's flush did not end within the
                timeout): nothing may be drawn on it, and its budget stays spent.
        """
        if token is None:
            if self._want_flusher:
                self._open_flusher()
            return
        session, count = token
        if self._covered(session, count):
            return
        lock = self._flush_lock
        try:  # (outer: frees the lock if an interrupt lands on the inner ``finally``'s line)
            self._flush(lock, session, count)
        finally:
            release_fully(lock)

    def _flush(self, lock: Any, session: int, count: int) -> None:
        try:  # (acquired inside the try: an interrupt right after it still releases it below)
            if not lock.acquire(timeout=self.timeout):
                raise _unconfirmed("another thread's flush did not end within the timeout")
            if self._covered(session, count):
                return  # by the flush this thread waited for
            fl = self._fl
            if (fl is None or fl.number != session or fl.pid != os.getpid() or fl.conn.closed
                    or fl.conn.broken):
                raise _unconfirmed("the session that was to flush it ended")
            target = self._commits  # read before the flush begins: every one of them precedes it
            try:
                rows = fl.conn.execute(_FLUSH_ON).fetchall()
            except self._psycopg.Error as exc:
                raise _unconfirmed(str(exc).strip() or type(exc).__name__) from exc
            if len(rows) != 1:
                raise _unconfirmed("the flush wrote no row: dpbudget_flush is hidden or refused")
            if rows[0][0] != fl.reached:
                raise _unconfirmed(
                    "the flush ran on another server or backend than the session opened on (a "
                    "restart, or a connection pooler in between: see docs/postgres-deployment.md)")
            self.flushes += 1
            if self._synced[0] != session or target > self._synced[1]:
                self._synced = (session, target)
        finally:
            release_fully(lock)

    def _covered(self, session: int, count: int) -> bool:
        synced = self._synced  # (one tuple, replaced whole)
        return synced[0] == session and synced[1] >= count

    def _open_flusher(self) -> None:
        """Open the flushing session, unless one is healthy or busy (best effort: a failure
        only leaves commits flushing in their own round trips)."""
        lock = self._flush_lock
        try:  # (outer: as in ``_sync``)
            self._reopen(lock)
        finally:
            release_fully(lock)

    def _reopen(self, lock: Any) -> None:
        try:
            if not lock.acquire(blocking=False):
                return  # in use: alive
            self._want_flusher = False
            old = self._fl
            if old is not None and old.pid == os.getpid() and old.server == self._server and not (
                    old.conn.closed or old.conn.broken or readable(old.conn)):
                return
            if self._conn.closed:
                return  # the ledger was closed
            self._fl = None
            if old is not None and old.pid == os.getpid():  # (never a parent's session)
                old.conn.close()
            try:
                conn, server = self._open_session()
            except (self._psycopg.Error, LedgerError):
                return
            try:
                reached = str(conn.execute("SELECT " + _REACHED).fetchone()[0])
            except BaseException as exc:
                conn.close()
                if isinstance(exc, self._psycopg.Error):
                    return
                raise
            if self._conn.closed:  # closed meanwhile (``close`` gave up waiting for this lock)
                conn.close()
                return
            self._numbered += 1  # (before publishing: an interrupt here only skips a number)
            self._fl = Flusher(conn, server, os.getpid(), self._numbered, reached)
        finally:
            release_fully(lock)

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        lock = self._flush_lock
        try:  # (outer: no transaction's ``abandon`` runs after a close an interrupt cut short)
            self._close_flusher(lock)
        finally:
            release_fully(lock)

    def _close_flusher(self, lock: Any) -> None:
        try:
            # Not during a flush, if it ends in time; past the timeout the session is closed under
            # it, and that flush ends in a typed error (unconfirmed), never in a confirmation.
            lock.acquire(timeout=self.timeout)
            fl = self._fl
            if fl is not None and fl.pid == os.getpid():  # (never a parent's session)
                fl.conn.close()  # (before it is forgotten: a close cut short, closed again, ends it)
            self._fl = None
        finally:
            release_fully(lock)


class Flusher(NamedTuple):
    """A flushing session: its connection, the server it reached (address, port, start time),
    the process that opened it, its number (tokens name it; a session opened later, maybe
    after a restart that lost a commit, has another), and the server and backend it reached
    (what each of its flushes must report again)."""

    conn: Any
    server: str
    pid: int
    number: int
    reached: str


def _unconfirmed(why: str) -> LedgerUnconfirmedError:
    return LedgerUnconfirmedError(
        "PostgreSQL ledger: the debit was committed but the server did not confirm that it "
        f"reached the disk ({why}); nothing was drawn on it, and its budget stays spent")
