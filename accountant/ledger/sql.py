"""The statements of the SQL ledgers: the reads both share (the head, a record, the accounts,
records paged in ``seq`` order), parameterised on the tables' prefix and the backend's one
row-fetch primitive ``_fetch``, and the format check (each backend writes its own way).

Tables: ``meta`` (the record format version), ``entries`` (seq, hash, canonical record text;
append-only), ``accounts`` (each limit's rule, configuration, running state and last seq); on
PostgreSQL each is named with the prefix ``dpbudget_``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from dpbudget.accountant.values.errors import LedgerCorruptedError, LedgerError
from dpbudget.accountant.ledger.base import EMPTY_HEAD, Account, Entry, Ledger
from dpbudget.accountant.ledger.entry import account_row

__all__ = ["SqlLedger"]

_PAGE = 4096


class SqlLedger(Ledger):
    """The reads of ``SqliteLedger`` and ``PostgresLedger``, which implement ``_fetch``."""

    _tables = ""  # the prefix of the tables' names
    _marker = "?"  # the driver's parameter marker

    @abstractmethod
    def _fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """The rows of one statement (called with the lock held), ``LedgerError`` on failure."""

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        # Refuses a forked child before the lock (``_mine``): a thread of the parent may have
        # held it at the fork, and then it is held for good in the child.
        self._mine()
        with self._lock:
            return self._fetch(sql, args)

    def _refuse_format(self, found: Any, expected: int) -> None:
        """Raise ``LedgerError`` unless the ledger's stored format is ``expected``."""
        if found != str(expected):
            raise LedgerError(
                f"the ledger at {self.url} has record format {found}; this version of dpbudget "
                f"reads format {expected} there and does not upgrade a ledger in place: "
                "`dpbudget export` it, then `dpbudget import` the export into a new ledger "
                "(docs/postgres-deployment.md); nothing was written")

    def _head(self) -> tuple[int, str]:
        rows = self._fetch(f"SELECT seq, hash FROM {self._tables}entries ORDER BY seq DESC LIMIT 1")
        return EMPTY_HEAD if not rows else (rows[0][0], rows[0][1])

    def _read_account(self, key: str) -> Account | None:
        rows = self._fetch(f"SELECT key, rule, config, state, seq FROM {self._tables}accounts "
                           f"WHERE key = {self._marker}", (key,))
        return account_row(rows[0]) if rows else None

    def entry(self, seq: int) -> Entry | None:
        rows = self._read(f"SELECT seq, record, hash FROM {self._tables}entries WHERE seq = "
                          f"{self._marker}", (seq,))
        return _entry(rows[0], seq - 1) if rows else None

    def accounts(self) -> list[Account]:
        return self._accounts(self._read)

    def _accounts(self, fetch: Callable[[str, tuple[Any, ...]], list[Any]]) -> list[Account]:
        return [account_row(r) for r in fetch(
            f"SELECT key, rule, config, state, seq FROM {self._tables}accounts ORDER BY key", ())]

    def entries(self, start: int = 1) -> Iterator[Entry]:
        # The lock held for one page at a time: streams without holding it between pages
        # (``_pages``).
        return self._pages(self._read, start)

    def _pages(self, fetch: Callable[[str, tuple[Any, ...]], list[Any]],
               start: int) -> Iterator[Entry]:
        """Records from ``start``, paged by primary key through ``fetch``: never the whole
        ledger in memory (one chain commits in ``seq`` order, so pages read at different moments
        still read a prefix of it; ``PostgresLedger`` reads every page in one snapshot)."""
        query = (f"SELECT seq, record, hash FROM {self._tables}entries WHERE seq > "
                 f"{self._marker} ORDER BY seq LIMIT {_PAGE}")
        seq = start - 1
        while True:
            rows = fetch(query, (seq,))
            if not rows:
                return
            for row in rows:  # (checked: a damaged table can repeat rows, paging forever)
                entry = _entry(row, seq)
                seq = entry.seq
                yield entry


def _entry(row: Any, after: int) -> Entry:
    """A row of the entries table, read after record ``after``: ``LedgerCorruptedError`` for a
    row a damaged file gives (out of order, a NULL or a value of another type)."""
    seq, text, digest = row
    if type(seq) is not int or seq <= after or type(text) is not str or type(digest) is not str:
        raise LedgerCorruptedError(f"the entries table is damaged after record {after}: a row "
                                   "out of order, or holding a NULL or a value of another type; "
                                   "run `dpbudget audit` on it (nothing was written)")
    return Entry(seq, text, digest)
