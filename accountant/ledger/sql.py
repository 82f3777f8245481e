"""What the SQL ledgers (SQLite, PostgreSQL) share: the three tables and every statement on them.

Tables (names prefixed per backend): ``meta`` (the record format version), ``entries`` (seq,
hash, canonical record text; append-only), ``accounts`` (each limit's rule, configuration, running
state and last seq). A backend supplies the connection, the transaction statements, its parameter marker
and table prefix, and a separate connection for streaming reads.
"""

from __future__ import annotations

import functools
import json
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from dpbudget.accountant.values.errors import LedgerCorruptedError, LedgerError
from dpbudget.accountant.ledger.base import EMPTY_HEAD, Account, Entry, Ledger
from dpbudget.accountant.ledger.record import FORMAT_VERSION, canonical, float_object

__all__ = ["SqlLedger"]

_PAGE = 4096


class SqlLedger(Ledger):
    """Base of the SQL backends. Subclasses set ``_P`` (the parameter marker), ``_T`` (table prefix) and
    implement ``_execute``, ``_reader``, and the transaction primitives."""

    _P = "?"
    _T = ""
    _format = FORMAT_VERSION  # what the ledger's meta table says its records are
    _configs: dict[int, tuple[dict[str, Any], str]]

    def __init__(self, *, hmac_key: bytes | str | None = None) -> None:
        super().__init__(hmac_key=hmac_key)
        self._configs = {}

    @abstractmethod
    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        """Run one statement on the backend's connection, raising ``LedgerError`` on failure."""

    @abstractmethod
    def _reader(self) -> AbstractContextManager[Any]:
        """A separate connection for long reads, so that they hold no lock."""

    def _sql(self, text: str) -> str:
        return text.replace("{T}", self._T).replace("?", self._P)

    def _check_format(self) -> None:
        query = self._sql("SELECT value FROM {T}meta WHERE key = 'format'")
        row = self._execute(query).fetchone()
        expected = str(self._format)
        if row is None:  # a new ledger: insert-if-absent, so that two creators both succeed
            self._execute(self._sql("INSERT INTO {T}meta VALUES ('format', ?) ON CONFLICT (key) "
                                    "DO NOTHING"), (expected,))
            row = self._execute(query).fetchone()
        if row[0] != expected:
            raise LedgerError(f"the ledger at {self.url} has record format {row[0]}; this version "
                              f"of dpbudget reads format {expected} there")

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
        # An account is written on every debit: update in place (the common case) and insert
        # only when it is new; a rule's configuration is encoded once per configuration object.
        update = self._sql("UPDATE {T}accounts SET rule = ?, config = ?, state = ?, seq = ? "
                           "WHERE key = ?")
        for a in accounts:
            row = (a.rule, self._config_text(a.config), float_object(a.state), a.seq, a.key)
            if self._execute(update, row).rowcount == 0:
                self._execute(self._sql("INSERT INTO {T}accounts (rule, config, state, seq, key) "
                                        "VALUES (?, ?, ?, ?, ?)"), row)

    def _config_text(self, config: dict[str, Any]) -> str:
        cached = self._configs.get(id(config))
        if cached is None or cached[0] is not config:
            if len(self._configs) > 1024:
                self._configs.clear()
            cached = self._configs[id(config)] = (config, canonical(config))
        return cached[1]

    def entry(self, seq: int) -> Entry | None:
        with self._lock:
            row = self._execute(self._sql("SELECT seq, record, hash FROM {T}entries WHERE "
                                          "seq = ?"), (seq,)).fetchone()
        return None if row is None else _entry(row[0], row[1], row[2], seq - 1)

    def accounts(self) -> list[Account]:
        with self._lock:
            rows = self._execute(self._sql("SELECT key, rule, config, state, seq FROM "
                                           "{T}accounts ORDER BY key")).fetchall()
        return [_account(r) for r in rows]

    def created_since(self, mark: Any = None) -> tuple[Any, list[str]]:
        # Every key (no state parsed): the tables have no order of creation to start from.
        with self._lock:
            rows = self._execute(self._sql("SELECT key FROM {T}accounts")).fetchall()
        return None, [r[0] for r in rows]

    def _reading(self, conn: Any, start: int) -> None:
        """Called on the reading connection before ``entries()`` pages through it. Nothing for
        a ledger of one chain: it commits in ``seq`` order, so pages read at different moments
        still read a prefix of it."""

    def entries(self, start: int = 1) -> Iterator[Entry]:
        # Paged by primary key on a connection of its own: streams without holding the lock or
        # loading the whole ledger into memory.
        query = self._sql(f"SELECT seq, record, hash FROM {{T}}entries WHERE seq > ? "
                          f"ORDER BY seq LIMIT {_PAGE}")
        with self._reader() as conn:
            self._reading(conn, start)
            seq = start - 1
            while True:
                rows = conn.execute(query, (seq,)).fetchall()
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
        return Account(key, rule, _parse_config(config), json.loads(state), seq)
    except (TypeError, ValueError, RecursionError):
        raise LedgerCorruptedError("the accounts table is damaged: a row holds a NULL, a value "
                                   "of another type or unreadable JSON; run `dpbudget audit` on "
                                   "it (nothing was written)") from None


@functools.lru_cache(maxsize=256)
def _parse_config(text: str) -> dict[str, Any]:
    # A rule's configuration text repeats on every read of its account; parse it once. Callers
    # treat Account.config as read-only.
    config: dict[str, Any] = json.loads(text)
    return config
