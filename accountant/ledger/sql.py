"""What the SQL ledgers (SQLite, PostgreSQL) share: the three tables and every statement on them.

Tables (names prefixed per backend): ``meta`` (the record format version), ``entries`` (seq,
hash, canonical record text; append-only), ``accounts`` (each limit's rule, configuration, running
state and last seq). A backend supplies the connection, the transaction statements, its placeholder
and table prefix, and a separate connection for streaming reads.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from accountant.errors import LedgerError
from accountant.ledger.base import EMPTY_HEAD, Account, Entry, Ledger
from accountant.ledger.record import FORMAT_VERSION

__all__ = ["SqlLedger"]

_PAGE = 4096


class SqlLedger(Ledger):
    """Base of the SQL backends. Subclasses set ``_P`` (placeholder), ``_T`` (table prefix) and
    implement ``_execute``, ``_reader``, and the transaction primitives."""

    _P = "?"
    _T = ""

    @abstractmethod
    def _execute(self, sql: str, args: tuple = ()) -> Any:
        """Run one statement on the backend's connection, raising ``LedgerError`` on failure."""

    @abstractmethod
    def _reader(self) -> AbstractContextManager[Any]:
        """A separate connection for long reads, so that they hold no lock."""

    def _sql(self, text: str) -> str:
        return text.replace("{T}", self._T).replace("?", self._P)

    def _check_format(self) -> None:
        row = self._execute(self._sql("SELECT value FROM {T}meta WHERE key = 'format'")).fetchone()
        if row is None:
            self._execute(self._sql("INSERT INTO {T}meta VALUES ('format', ?)"),
                          (str(FORMAT_VERSION),))
        elif row[0] != str(FORMAT_VERSION):
            raise LedgerError(f"the ledger at {self.url} has record format {row[0]}; this version "
                              f"of dpbudget reads format {FORMAT_VERSION}")

    def _commit(self) -> None:
        self._execute("COMMIT")

    def _head(self) -> tuple[int, str]:
        row = self._execute(self._sql(
            "SELECT seq, hash FROM {T}entries ORDER BY seq DESC LIMIT 1")).fetchone()
        return EMPTY_HEAD if row is None else (row[0], row[1])

    def _read_account(self, key: str) -> Account | None:
        row = self._execute(self._sql("SELECT key, rule, config, state, seq FROM {T}accounts "
                                      "WHERE key = ?"), (key,)).fetchone()
        return None if row is None else _account(row)

    def _write_entry(self, entry: Entry) -> None:
        self._execute(self._sql("INSERT INTO {T}entries (seq, hash, record) VALUES (?, ?, ?)"),
                      (entry.seq, entry.hash, entry.text))

    def _write_accounts(self, accounts: list[Account]) -> None:
        for a in accounts:
            self._execute(self._sql(
                "INSERT INTO {T}accounts VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "rule = excluded.rule, config = excluded.config, state = excluded.state, "
                "seq = excluded.seq"),
                (a.key, a.rule, json.dumps(a.config, sort_keys=True),
                 json.dumps(a.state, sort_keys=True), a.seq))

    def accounts(self) -> list[Account]:
        with self._lock:
            rows = self._execute(self._sql("SELECT key, rule, config, state, seq FROM "
                                           "{T}accounts ORDER BY key")).fetchall()
        return [_account(r) for r in rows]

    def entries(self, start: int = 1) -> Iterator[Entry]:
        # Paged by primary key on a connection of its own: streams without holding the lock or
        # loading the whole ledger into memory.
        query = self._sql(f"SELECT seq, record, hash FROM {{T}}entries WHERE seq > ? "
                          f"ORDER BY seq LIMIT {_PAGE}")
        with self._reader() as conn:
            seq = start - 1
            while True:
                rows = conn.execute(query, (seq,)).fetchall()
                if not rows:
                    return
                for seq, text, digest in rows:
                    yield Entry(seq, text, digest)


def _account(row: tuple) -> Account:
    key, rule, config, state, seq = row
    return Account(key, rule, json.loads(config), json.loads(state), seq)
