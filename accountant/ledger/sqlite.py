"""The SQLite ledger: the embedded, durable default.

Durability is part of the privacy guarantee: a debit that could vanish in a crash after its answer
was released would let the same budget be spent twice. So the database runs in WAL mode with
``synchronous=FULL`` (every commit is on disk before ``release`` draws noise), and every
check-and-debit is one ``BEGIN IMMEDIATE`` transaction, which takes SQLite's write lock before
reading the state: two processes can never both read the same remaining budget and both spend it.
Records are append-only (triggers refuse UPDATE and DELETE on them).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from accountant.errors import LedgerError
from accountant.ledger.base import EMPTY_HEAD, Account, Entry, Ledger
from accountant.ledger.record import FORMAT_VERSION

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


class SqliteLedger(Ledger):
    """A ledger in an SQLite file. ``SqliteLedger("budget.db")`` or ``"sqlite:///budget.db"``.

    Args:
        path: the database file; created with its schema if missing.
        timeout: seconds to wait for another process's transaction before failing.
        hmac_key: chain new records with HMAC-SHA256 under this key (default: the environment
            variable ``DPBUDGET_LEDGER_KEY``, if set); see ``accountant.ledger.record``.

    Raises:
        LedgerError: the file cannot be opened or is not a dpbudget ledger of a known version.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0,
                 hmac_key: bytes | str | None = None) -> None:
        super().__init__(hmac_key=hmac_key)
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                         check_same_thread=False)
            self._set_wal(timeout)
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
            self._check_version()
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open SQLite ledger {str(self.path)!r}: {exc}") from exc

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

    def _check_version(self) -> None:
        row = self._conn.execute("SELECT value FROM meta WHERE key='format'").fetchone()
        if row is None:
            self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)",
                               (str(FORMAT_VERSION),))
        elif row[0] != str(FORMAT_VERSION):
            raise LedgerError(f"ledger {str(self.path)!r} has record format {row[0]}; this version "
                              f"of dpbudget reads format {FORMAT_VERSION}")

    def _begin(self) -> None:
        self._execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        self._execute("COMMIT")

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _execute(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, args)
        except sqlite3.Error as exc:
            raise LedgerError(f"SQLite ledger {str(self.path)!r}: {exc}") from exc

    def _head(self) -> tuple[int, str]:
        row = self._execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        return EMPTY_HEAD if row is None else (row[0], row[1])

    def _read_account(self, key: str) -> Account | None:
        row = self._execute("SELECT key, rule, config, state, seq FROM accounts WHERE key = ?",
                            (key,)).fetchone()
        return None if row is None else _account(row)

    def _write_entry(self, entry: Entry) -> None:
        self._execute("INSERT INTO entries (seq, hash, record) VALUES (?, ?, ?)",
                      (entry.seq, entry.hash, entry.text))

    def _write_accounts(self, accounts: list[Account]) -> None:
        for a in accounts:
            self._execute("INSERT OR REPLACE INTO accounts VALUES (?, ?, ?, ?, ?)",
                          (a.key, a.rule, json.dumps(a.config, sort_keys=True),
                           json.dumps(a.state, sort_keys=True), a.seq))

    def accounts(self) -> list[Account]:
        with self._lock:
            rows = self._execute(
                "SELECT key, rule, config, state, seq FROM accounts ORDER BY key").fetchall()
        return [_account(r) for r in rows]

    def entries(self, start: int = 1) -> Iterator[Entry]:
        # Pages by primary key on a connection of its own, so that a long read neither holds the
        # lock nor loads the whole ledger into memory.
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            seq = start - 1
            while True:
                rows = conn.execute("SELECT seq, record, hash FROM entries WHERE seq > ? "
                                    "ORDER BY seq LIMIT 4096", (seq,)).fetchall()
                if not rows:
                    return
                for seq, text, digest in rows:
                    yield Entry(seq, text, digest)
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _account(row: tuple) -> Account:
    key, rule, config, state, seq = row
    return Account(key, rule, json.loads(config), json.loads(state), seq)
