"""The SQLite ledger: the embedded, durable default.

Durability is part of the privacy guarantee: a debit that could vanish in a crash after its answer
was released would let the same budget be spent twice. So every commit is on disk before
``release`` draws noise — SQLite syncs it itself (WAL mode with ``synchronous=FULL``: the WAL file
is synced inside every commit) — and every check-and-debit is one ``BEGIN IMMEDIATE``
transaction, which takes SQLite's write lock before reading the state: two processes can never
both read the same remaining budget and both spend it. Records are append-only (triggers refuse
UPDATE and DELETE on them).

The files: that write lock, and the index through which each process finds the others' commits,
live in the ``-shm`` file; the commits themselves in the ``-wal`` file. A ``-shm`` deleted while a
ledger is open (a clean-up job, a careless backup) makes the next process build a new one: both
then hold "the" write lock and write over each other's frames (answers beyond the limit, and
answers whose debit is gone). So a ledger is not opened on a ``-wal`` without its ``-shm``, and
under the write lock each debit checks that the database file and its ``-wal`` and ``-shm`` files
are the ones this ledger opened (two ``stat`` calls more than one); one deleted or replaced is
refused, nothing written.

A damaged ``-wal`` (one flipped byte) would make SQLite's recovery drop every commit after the
damage, silently: a ledger is not opened on such a ``-wal`` (``dpbudget.accountant.ledger.wal``),
before SQLite touches the files, so nothing is read, written or checkpointed.

Processes (one rule): a ledger belongs to the process that opened it, and a process forked from
one that ever opened an SQLite ledger is refused every SQLite ledger, carried or opened anew.
SQLite keeps its locks, and its bookkeeping of them, per process, and ``fork`` copies that
bookkeeping (https://www.sqlite.org/howtocorrupt.html, section 2.6): a child's connection, even a
new one, would hold none of the locks that keep the parent's close from deleting the WAL file the
child writes, or another process from writing at once. Refused rather than tracked: open SQLite
ledgers after forking, or start workers with ``multiprocessing``'s spawn or forkserver method.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dpbudget.accountant.values.errors import (
    LedgerCorruptedError, LedgerError, LedgerUnconfirmedError)
from dpbudget.accountant.ledger.base import Account, Entry
from dpbudget.accountant.ledger.record import FORMAT_VERSION, canonical, float_object
from dpbudget.accountant.ledger.sql import SqlLedger
from dpbudget.accountant.ledger.wal import dropped_commits

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

# The files a ledger's debits depend on, checked under the write lock (module docstring).
_FILES = ("", "-wal", "-shm")

# The process that first opened an SQLite ledger in this memory: a fork copies it, so a child (of
# any fork: os.fork, a C extension's, a grandchild's) sees another process's id and refuses SQLite.
_opener_pid: int | None = None


def _forked() -> bool:
    """Whether this process descends by fork from one that had opened an SQLite ledger."""
    return _opener_pid is not None and _opener_pid != os.getpid()


def _refusal(path: Path) -> LedgerError:
    return LedgerError(
        f"SQLite ledger {str(path)!r}: this process was forked from one that had opened an "
        "SQLite ledger, and SQLite cannot be used in such a child (its locks are kept per "
        "process: https://www.sqlite.org/howtocorrupt.html, section 2.6); nothing was read or "
        "written. Open SQLite ledgers only after forking, or start workers with "
        "multiprocessing's spawn or forkserver method (a PostgreSQL ledger can be opened in "
        "forked children)")


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
        LedgerError: the file cannot be opened or is not a dpbudget ledger of a known version,
            or this process was forked from one that had opened an SQLite ledger.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0,
                 create: bool = True, hmac_key: bytes | str | None = None) -> None:
        global _opener_pid
        # Absolute: the identity check must find the same files after the caller's chdir.
        self.path = Path(path).absolute()
        if _forked():
            raise _refusal(self.path)
        super().__init__(hmac_key=hmac_key)
        self.url = f"sqlite:///{self.path}"
        if not create and not self.path.is_file():
            raise LedgerError(f"no SQLite ledger at {str(self.path)!r} (nothing was created)")
        _opener_pid = os.getpid()  # (before SQLite opens the file: a fork from now on refuses it)
        if self._shm_deleted():
            raise LedgerError(
                f"SQLite ledger {str(self.path)!r}: its -wal file is there without its -shm "
                "file, which was deleted while the ledger was open; a new -shm would let this "
                "process and one still using the deleted one write at once. Nothing was read or "
                "written. Stop every process using the ledger, then open it once with the "
                "sqlite3 shell (which rebuilds the -shm from the -wal), and audit it")
        dropped = dropped_commits(f"{self.path}-wal")
        if dropped:
            raise LedgerCorruptedError(
                f"SQLite ledger {str(self.path)!r}: its -wal file is damaged, and SQLite would "
                f"drop committed transactions written after the damage (at least {dropped} (records "
                "whose answers may have been released)). Nothing was read or written. Copy the "
                "ledger's files aside as evidence; to accept the loss, run the sqlite3 shell's "
                "'PRAGMA wal_checkpoint(TRUNCATE)' on it, then audit it with --expect-head "
                "(docs/threat-model.md)")
        self._target: Path | str = self.path  # what SQLite opens: the file, or a read-only URI
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                         check_same_thread=False)
            self._open(create, timeout)
            self._identity = self._files()  # (now: the -wal and -shm this connection uses)
        except BaseException as exc:
            if hasattr(self, "_conn"):
                self._conn.close()
            if isinstance(exc, (sqlite3.Error, OSError)) and not create and self._read_only():
                return
            if isinstance(exc, (sqlite3.Error, OSError)):
                why = exc.strerror if isinstance(exc, OSError) else exc
                raise LedgerError(f"cannot open SQLite ledger {str(self.path)!r}: {why}") from None
            raise

    def _read_only(self) -> bool:
        """Open, for reading only, a ledger on read-only media (a read-only mount, file or
        folder) that SQLite could not open for writing: how readers (``create=False``: audit,
        status, export) reach it. ``mode=ro`` reads the -wal too, where SQLite can use the
        -shm; else, only when there is no -wal (a ledger closed cleanly leaves none: every
        commit is in the file), ``immutable=1``. A -wal it cannot read is refused: its commits
        would go unseen. Writes on such a ledger are refused (``_begin``)."""
        wal = Path(f"{self.path}-wal")
        if os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK):
            return False  # not read-only media: the error stands
        uri = f"file:{quote(str(self.path))}?mode=ro"
        for target in (uri, uri + "&immutable=1") if not wal.exists() else (uri,):
            try:
                self._conn = sqlite3.connect(target, uri=True, isolation_level=None,
                                             check_same_thread=False)
                self._target = target
                self._open(False, 0.0)
                return True
            except sqlite3.Error:
                self._conn.close()
        return False

    def _shm_deleted(self) -> bool:
        """Whether the -wal file is there without its -shm: the -shm was deleted while a process
        had the ledger open (which may still be using it). SQLite deletes both, the -shm first,
        only when the last connection closes: a moment without the -shm is one closing."""
        wal, shm = f"{self.path}-wal", f"{self.path}-shm"
        for _ in range(20):
            if not os.path.exists(wal) or os.path.exists(shm):
                return False
            time.sleep(0.005)
        return True

    def _open(self, create: bool, timeout: float) -> None:
        if not create and self._conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('meta', 'entries', "
                "'accounts')").fetchone()[0] != 3:
            raise LedgerError(f"{str(self.path)!r} is an SQLite file but not a dpbudget "
                              "ledger (nothing was changed)")
        if not isinstance(self._target, str):  # (a URI: read-only media, ``_read_only``)
            self._set_wal(timeout)
            self._conn.execute("PRAGMA synchronous=FULL")  # the WAL synced inside each commit
            self._conn.executescript(_SCHEMA)
        query = "SELECT value FROM meta WHERE key = 'format'"
        if not self._fetch(query):  # a new ledger: insert-if-absent (two creators both succeed)
            self._execute("INSERT INTO meta VALUES ('format', ?) ON CONFLICT (key) DO NOTHING",
                          (str(FORMAT_VERSION),))
        self._refuse_format(self._fetch(query)[0][0], FORMAT_VERSION)

    def _in_this_process(self) -> None:
        """Refuse SQLite in a child forked from a process that had opened it (module docstring)."""
        if _forked():
            raise _refusal(self.path)

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

    def _begin(self, prefetch: Sequence[str] = (), shared: Sequence[str] = ()) -> None:
        self._in_this_process()
        if isinstance(self._target, str):
            raise LedgerError(f"SQLite ledger {str(self.path)!r} is on read-only media, opened "
                              "for reading only; nothing was written")
        self._rollback()  # a transaction an interrupt left open: it never committed
        self._execute("BEGIN IMMEDIATE")
        # Under the write lock: the files must still be the ones opened. A ledger deleted while
        # in use would take debits into an unlinked file (lost to every later reader), one
        # replaced by a restored backup would forget spend, and a replaced -wal or -shm lets
        # another process write at once (module docstring); all are refused, nothing written.
        try:
            same = self._files() == self._identity
        except OSError:
            same = False
        if not same:
            self._rollback()
            raise LedgerError(f"SQLite ledger {str(self.path)!r}: the database file or its "
                              "-wal or -shm file was deleted or replaced while in use; nothing "
                              "was written (close every ledger object on it, then reopen it "
                              "and audit it)")

    def _commit(self) -> None:
        self._in_this_process()
        try:
            self._conn.execute("COMMIT")  # synced before it returns (synchronous=FULL)
        except sqlite3.Error as exc:  # (the write lock is held: a failed write or sync)
            raise LedgerUnconfirmedError(
                f"SQLite ledger {str(self.path)!r}: the commit failed ({exc}) after its frames "
                "may have reached the WAL file; nothing was drawn, and its budget may stay "
                "spent. Check the disk, then audit the ledger") from exc

    def _files(self) -> tuple[tuple[int, int], ...]:
        """The (device, inode) of the database file and of its -wal and -shm files."""
        stats = [os.stat(f"{self.path}{suffix}") for suffix in _FILES]
        return tuple((st.st_dev, st.st_ino) for st in stats)

    def created_since(self, mark: Any = None) -> tuple[Any, list[str]]:
        """By rowid (new rows get the largest plus one; accounts are never deleted). The mark is
        the last (rowid, key) read: a VACUUM after a row was deleted by hand may renumber rows,
        and then the key at that rowid differs and every key is read again."""
        self._mine()
        with self._lock:
            if mark is not None and self._execute("SELECT key FROM accounts WHERE rowid = ?",
                                                  (mark[0],)).fetchone() != (mark[1],):
                mark = None
            rows = self._execute("SELECT rowid, key FROM accounts WHERE rowid >= ? ORDER BY "
                                 "rowid", (-(2 ** 63) if mark is None else mark[0] + 1,)).fetchall()
        return (tuple(rows[-1]) if rows else mark), [r[1] for r in rows]

    def _rollback(self) -> None:
        if _forked():
            return  # a forked child: the transaction, and the connection, are the parent's
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        self._in_this_process()
        try:
            return self._conn.execute(sql, args)
        except sqlite3.Error as exc:
            raise LedgerError(f"SQLite ledger {str(self.path)!r}: {exc}") from exc

    def _fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return self._execute(sql, args).fetchall()

    def _disconnect(self) -> None:
        self._conn.close()

    def _write_entry(self, entry: Entry) -> None:
        self._execute("INSERT INTO entries (seq, hash, record) VALUES (?, ?, ?)",
                      (entry.seq, entry.hash, entry.text))

    def _write_accounts(self, accounts: list[Account]) -> None:
        # Written on every debit: updated in place (the common case), inserted when new.
        update = "UPDATE accounts SET rule = ?, config = ?, state = ?, seq = ? WHERE key = ?"
        for a in accounts:
            row = (a.rule, canonical(a.config), float_object(a.state), a.seq, a.key)
            if self._execute(update, row).rowcount == 0:
                self._execute("INSERT INTO accounts (rule, config, state, seq, key) "
                              "VALUES (?, ?, ?, ?, ?)", row)

