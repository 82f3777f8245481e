"""The SQLite ledger's three tables and every statement on them (``dpbudget.accountant.ledger.sqlite``
supplies the connection and the transaction statements).

Tables: ``meta`` (the record format version), ``entries`` (seq, hash, canonical record text;
append-only), ``accounts`` (each limit's rule, configuration, running state and last seq).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterator
from typing import Any

from dpbudget.accountant.values.errors import LedgerCorruptedError, LedgerError
from dpbudget.accountant.ledger.base import EMPTY_HEAD, Account, Entry, Ledger
from dpbudget.accountant.ledger.entry import parse_config
from dpbudget.accountant.ledger.record import FORMAT_VERSION, float_object

__all__ = ["SqlLedger"]

_PAGE = 4096


class SqlLedger(Ledger):
    """The statements of ``SqliteLedger``, which implements ``_execute`` and the transaction
    primitives."""

    @abstractmethod
    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        """Run one statement on the backend's connection, raising ``LedgerError`` on failure."""

    def _check_format(self) -> None:
        query = "SELECT value FROM meta WHERE key = 'format'"
        row = self._execute(query).fetchone()
        expected = str(FORMAT_VERSION)
        if row is None:  # a new ledger: insert-if-absent, so that two creators both succeed
            self._execute("INSERT INTO meta VALUES ('format', ?) ON CONFLICT (key) DO NOTHING",
                          (expected,))
            row = self._execute(query).fetchone()
        if row[0] != expected:
            raise LedgerError(f"the ledger at {self.url} has record format {row[0]}; this version "
                              f"of dpbudget reads format {expected} there")

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
        # An account is written on every debit: update in place (the common case) and insert
        # only when it is new; a rule's configuration is encoded once per configuration object.
        update = "UPDATE accounts SET rule = ?, config = ?, state = ?, seq = ? WHERE key = ?"
        for a in accounts:
            row = (a.rule, self._config_text(a.config), float_object(a.state), a.seq, a.key)
            if self._execute(update, row).rowcount == 0:
                self._execute("INSERT INTO accounts (rule, config, state, seq, key) "
                              "VALUES (?, ?, ?, ?, ?)", row)

    # Each read refuses a forked child before the lock (``_mine``): a thread of the parent may
    # have held it at the fork, and then it is held for good in the child.
    def entry(self, seq: int) -> Entry | None:
        self._mine()
        with self._lock:
            row = self._execute("SELECT seq, record, hash FROM entries WHERE seq = ?",
                                (seq,)).fetchone()
        return None if row is None else _entry(row[0], row[1], row[2], seq - 1)

    def accounts(self) -> list[Account]:
        self._mine()
        with self._lock:
            rows = self._execute("SELECT key, rule, config, state, seq FROM accounts "
                                 "ORDER BY key").fetchall()
        return [_account(r) for r in rows]

    def entries(self, start: int = 1) -> Iterator[Entry]:
        # Paged by primary key, the lock held for one page at a time: streams without holding it
        # between pages or loading the whole ledger into memory (one chain commits in ``seq``
        # order, so pages read at different moments still read a prefix of it).
        query = f"SELECT seq, record, hash FROM entries WHERE seq > ? ORDER BY seq LIMIT {_PAGE}"
        seq = start - 1
        while True:
            self._mine()
            with self._lock:
                rows = self._execute(query, (seq,)).fetchall()
            if not rows:
                return
            for row in rows:  # (checked: a damaged table can repeat rows, paging forever)
                entry = _entry(row[0], row[1], row[2], seq)
                seq = entry.seq
                yield entry


def _entry(seq: Any, text: Any, digest: Any, after: int) -> Entry:
    """A row of the entries table, read after record ``after``: ``LedgerCorruptedError`` for a
    row a damaged file gives (out of order, a NULL or a value of another type)."""
    if type(seq) is not int or seq <= after or type(text) is not str or type(digest) is not str:
        raise LedgerCorruptedError(f"the entries table is damaged after record {after}: a row "
                                   "out of order, or holding a NULL or a value of another type; "
                                   "run `dpbudget audit` on it (nothing was written)")
    return Entry(seq, text, digest)


def _account(row: tuple[Any, ...]) -> Account:
    key, rule, config, state, seq = row
    try:
        if type(key) is not str or type(rule) is not str or type(seq) is not int:
            raise TypeError("a column of another type")
        return Account(key, rule, parse_config(config), json.loads(state), seq)
    except (TypeError, ValueError, RecursionError):
        raise LedgerCorruptedError("the accounts table is damaged: a row holds a NULL, a value "
                                   "of another type or unreadable JSON; run `dpbudget audit` on "
                                   "it (nothing was written)") from None

