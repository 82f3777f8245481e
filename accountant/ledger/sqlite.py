"""The SQLite ledger: the embedded, durable default.

Durability is part of the privacy guarantee: a debit that could vanish in a crash after its answer
was released would let the same budget be spent twice. So every commit is on disk before
``release`` draws noise, and every check-and-debit is one ``BEGIN IMMEDIATE`` transaction, which
takes SQLite's write lock before reading the state: two processes can never both read the same
remaining budget and both spend it. Records are append-only (triggers refuse UPDATE and DELETE on
them).

Group commit: the database runs in WAL mode with ``synchronous=NORMAL`` — SQLite then syncs only
at checkpoints — and the ledger syncs the WAL file itself after each commit (``_sync``), once
SQLite's write lock and the ledger's own lock are released. What ``synchronous=FULL`` would do
inside the lock (sync the WAL up to the commit) is done just outside it, before anything is drawn:
other processes and threads commit meanwhile, and one sync covers every commit before it. A commit
whose frames a checkpoint has already copied into the database file is on disk too: SQLite syncs
the WAL before a checkpoint and the database after it, and reuses the WAL only after a complete
one (https://www.sqlite.org/pragma.html#pragma_synchronous).

Processes: each opens the file itself. A file a ledger had open when a process forked is refused
in the child, carried or opened anew (``SqliteLedger._in_this_process``): SQLite keeps its locks per
process, and a child's connection would hold none of those that keep the parent's close from
deleting the WAL file the child writes, or another process from writing at once.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time
import weakref
from collections.abc import Sequence
from typing import Any
from pathlib import Path

from dpbudget.accountant.errors import LedgerError, LedgerUnconfirmedError
from dpbudget.accountant.ledger import sqlite_fork
from dpbudget.accountant.ledger.sql import SqlLedger

__all__ = ["SqliteLedger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY, hash TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
    key TEXT PRIMARY KEY, rule TEXT NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL,
    seq INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS entries_append_only_u BEFORE UPDATE ON entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
CREATE TRIGGER IF NOT EXISTS entries_append_only_d BEFORE DELETE ON entries
    BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END;
"""


# Ledger files (by path) whose WAL sync failed in this process: no object of this process debits
# them again (``SqliteLedger._sync``).
_FAILED_SYNCS: dict[str, str] = {}
_AFTER_FAILURE = ("After a failed disk write this process refuses every further debit on this "
                  "ledger: check the disk, restart, and audit the ledger")


class SqliteLedger(SqlLedger):
    """A ledger in an SQLite file. ``SqliteLedger("budget.db")`` or ``"sqlite:///budget.db"``.

    Args:
        path: the database file; created with its schema if missing.
        timeout: seconds to wait for another process's transaction before failing.
        create: create the file and its schema when missing (the default). Readers (audit,
            status, export) pass False: a mistyped path is an error, never a new empty ledger.
        hmac_key: chain new records with HMAC-SHA256 under this key (default: the environment
            variable ``DPBUDGET_LEDGER_KEY``, if set); see ``dpbudget.accountant.ledger.record``.

    Raises:
        LedgerError: the file cannot be opened or is not a dpbudget ledger of a known version.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0,
                 create: bool = True, hmac_key: bytes | str | None = None) -> None:
        super().__init__(hmac_key=hmac_key)
        self._commits = 0  # commits by this object; ``_synced``: how many are known on disk
        self._synced = 0
        self._wal: int | None = None  # a descriptor of the WAL file, for ``_sync``
        self._wal_closer: Any = None  # closes it once: on ``close``, or when this is collected
        self._changes = 0  # the connection's total_changes when the transaction began
        self._closed = False
        self._pid = os.getpid()  # the process whose connection ``_conn`` is
        # Absolute: the identity check must find the same file after the caller's chdir.
        self.path = Path(path).absolute()
        self.url = f"sqlite:///{self.path}"
        if not create and not self.path.is_file():
            raise LedgerError(f"no SQLite ledger at {str(self.path)!r} (nothing was created)")
        try:  # (created empty first: its identity is registered before SQLite opens it)
            if create and not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o644))  # (SQLite's)
            self._identity = self._file_identity()
        except OSError as exc:
            raise LedgerError(f"cannot open SQLite ledger {str(self.path)!r}: "
                              f"{exc.strerror}") from None
        if sqlite_fork.forked(self._identity):
            raise LedgerError(sqlite_fork.refusal(self.path))
        self._token = sqlite_fork.opening(self._identity, self)
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                         check_same_thread=False)
            self._open(create, timeout)
        except BaseException as exc:
            if hasattr(self, "_conn"):
                self._conn.close()
            sqlite_fork.closed(self._token)
            if isinstance(exc, sqlite3.Error):
                raise LedgerError(f"cannot open SQLite ledger {str(self.path)!r}: {exc}") from exc
            raise

    def _open(self, create: bool, timeout: float) -> None:
        if not create and self._conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('meta', 'entries', "
                "'accounts')").fetchone()[0] != 3:
            raise LedgerError(f"{str(self.path)!r} is an SQLite file but not a dpbudget "
                              "ledger (nothing was changed)")
        self._set_wal(timeout)
        self._conn.execute("PRAGMA synchronous=NORMAL")  # + ``_sync`` (module docstring)
        self._conn.executescript(_SCHEMA)
        self._check_format()
        try:  # (now: the WAL this connection writes, which ``_sync`` must find again)
            if create:  # (a reader never syncs)
                self._wal_descriptor()
        except OSError:
            pass  # (opened at the first sync)

    def _in_this_process(self) -> None:
        """Refuse a ledger carried into a forked child (``dpbudget.accountant.ledger.sqlite_fork``)."""
        if self._pid != os.getpid():
            raise LedgerError(sqlite_fork.refusal(self.path))

    def _set_wal(self, timeout: float) -> None:
        # Switching to WAL needs a moment without other writers and, unlike ordinary statements,
        # does not honour the busy timeout: a second process creating the same new ledger would
        # fail at once. Retry until the timeout, as every other statement waits.
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    def _begin(self, prefetch: Sequence[str] = (), shared: Sequence[str] = (),
               cached: bool = False) -> None:
        self._in_this_process()
        self._rollback()  # a transaction an interrupt left open: it never committed
        failed = _FAILED_SYNCS.get(str(self.path))
        if failed is not None:
            raise LedgerError(f"SQLite ledger {str(self.path)!r}: a sync of its WAL failed "
                              f"earlier in this process ({failed}); nothing was written. "
                              + _AFTER_FAILURE)
        self._execute("BEGIN IMMEDIATE")
        self._changes = self._conn.total_changes
        # Under the write lock: the file must still be the one opened. A ledger deleted while in
        # use would take debits into an unlinked file (lost to every later reader), and one
        # replaced by a restored backup would forget spend; both are refused, nothing written.
        try:
            same = self._file_identity() == self._identity
        except OSError:
            same = False
        if not same:
            self._rollback()
            raise LedgerError(f"SQLite ledger {str(self.path)!r} was deleted or replaced while "
                              "in use; nothing was written (reopen it, and audit it)")

    def _commit(self) -> int:
        """Commit; the number of this commit for ``_sync`` (0 when it wrote nothing). In a
        child forked inside the transaction ``_execute`` refuses the COMMIT: it is the parent's."""
        wrote = self._conn.total_changes != self._changes
        self._execute("COMMIT")
        if not wrote:
            return 0
        self._commits += 1
        return self._commits

    def _sync(self, token: int) -> None:
        """Sync the WAL file, unless a sync that began after commit ``token`` already did.

        No lock: one that an interrupt left held would stop every later release. Threads that
        sync at once each sync (the kernel serves them together); ``_synced`` may lag behind,
        which costs a sync, never skips one: it is raised only to a count of commits read before
        a sync that then completed.

        A failed sync fails the ledger for good in this process: Linux reports a write error once
        and marks the pages clean, so a later sync that succeeds proves nothing about the frames
        the failed one held — and a crash would then lose them and every commit after them.
        (PostgreSQL stops the server on a failed sync, for the same reason.)"""
        if self._synced >= token:
            return  # a sync that began after this commit has completed
        failed = _FAILED_SYNCS.get(str(self.path))
        if failed is not None or self._closed:
            raise self._unconfirmed(failed or "the ledger was closed")
        target = self._commits  # every commit counted so far is in the WAL or the database
        try:
            os.fsync(self._wal_descriptor())
        except OSError as exc:
            _FAILED_SYNCS[str(self.path)] = str(exc.strerror)
            raise self._unconfirmed(str(exc.strerror)) from None
        if target > self._synced:
            self._synced = target

    def _unconfirmed(self, why: str) -> LedgerUnconfirmedError:
        return LedgerUnconfirmedError(
            f"SQLite ledger {str(self.path)!r}: the debit was committed but could not be "
            f"confirmed on disk ({why}); nothing was drawn on it, and its budget stays spent. "
            + _AFTER_FAILURE)

    def _wal_descriptor(self) -> int:
        """A descriptor of the WAL file this ledger's connection writes, opened once.

        While a connection is open SQLite never replaces its WAL file, so one with another
        identity means that the files were replaced under it (or deleted by another process's
        SQLite that did not see this connection: one sharing it across ``fork``, which
        ``dpbudget.accountant.ledger.sqlite_fork`` prevents), and this connection's commits may be in the
        old, unlinked one. A sync of the new one would confirm nothing of ours: an error
        (``OSError``), never a switch."""
        wal = f"{self.path}-wal"
        fd = self._wal
        if fd is not None:
            if os.fstat(fd).st_ino != os.stat(wal).st_ino:
                raise OSError(errno.ESTALE, "the WAL file was replaced while this ledger had it "
                              "open")
            return fd
        fd = os.open(wal, os.O_RDONLY if os.name == "posix" else os.O_RDWR)
        if os.name == "posix":  # the file's name must be on disk as well as its content
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        self._wal = fd
        self._wal_closer = weakref.finalize(self, os.close, fd)
        return fd

    def _file_identity(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return (st.st_dev, st.st_ino)

    def _rollback(self) -> None:
        if self._pid != os.getpid():
            return  # a forked child: the transaction, and the connection, are the parent's
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        self._in_this_process()
        try:
            return self._conn.execute(sql, args)
        except sqlite3.Error as exc:
            raise LedgerError(f"SQLite ledger {str(self.path)!r}: {exc}") from exc

    def _reader(self) -> sqlite_fork.Reader:
        self._in_this_process()
        return sqlite_fork.Reader(self.path, self._identity)

    def close(self) -> None:
        with self._lock:
            mine = self._pid == os.getpid()  # (a child never syncs or closes its parent's)
            if not self._closed and self._synced < self._commits and mine:
                try:  # a commit whose own sync has not run yet (another thread's)
                    self._sync(self._commits)
                except LedgerError:
                    pass  # that thread's sync reports it
            self._closed = True
            if mine:
                self._conn.close()
                sqlite_fork.closed(self._token)  # (only now: a fork during the close refuses)
            if self._wal_closer is not None:
                self._wal_closer()
            self._wal = None

