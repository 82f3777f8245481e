"""An in-memory ledger: the same records and chain as the durable ones, gone with the process.

For simulations and tests. Concurrent threads are serialised by the base class's lock; changes made
inside a transaction are staged and applied only on commit.

Only the process that made it may use it (``Ledger._mine``): a forked child holds a copy, and
debits there would spend a copy of the budget that the parent never sees, each child as much
again. Processes share a budget through a durable ledger.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dpbudget.accountant.ledger.base import EMPTY_HEAD, Account, Entry, Ledger

__all__ = ["MemoryLedger"]


class MemoryLedger(Ledger):
    """A ledger held in memory. ``MemoryLedger()`` or the URL ``"memory://"``.

    Args:
        hmac_key: as for the durable ledgers.
        clock: seconds since the epoch (default ``time.time``): the time of each transaction,
            hence the renewal windows, blocks and unlock shares of its debits. Simulations and
            tests inject one (``Accountant(..., clock=...)`` sets it); only an in-memory ledger
            takes one — a durable ledger keeps its own time (``Ledger._tx_micros``).

    >>> ledger = MemoryLedger()
    >>> ledger.head()[0]
    0
    """

    url = "memory://"
    durable = False

    def __init__(self, *, hmac_key: bytes | str | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(hmac_key=hmac_key)
        self.clock = clock
        self._entries: list[Entry] = []
        self._accounts: dict[str, Account] = {}
        self._staged_entries: list[Entry] = []
        self._staged_accounts: dict[str, Account] = {}

    def _begin(self, prefetch: Sequence[str] = (), shared: Sequence[str] = ()) -> None:
        if self._staged_entries or self._staged_accounts:  # (only what an interrupt left)
            self._rollback()

    def now(self) -> float:
        return (self.clock or time.time)()

    def _tx_micros(self, head: tuple[int, str] | None) -> int:
        """The clock's time, as given: a simulation's clock may be set back (the audit then
        reports the records' times running backwards)."""
        clock = self.clock
        return time.time_ns() // 1000 if clock is None else round(clock() * 1_000_000)

    def _commit(self) -> None:
        # Accounts first: an interrupt between the two calls then leaves the debit counted
        # without its record (spend over-stated, which the audit reports), never a record
        # whose spend the next check would not see.
        self._accounts.update(self._staged_accounts)
        self._entries.extend(self._staged_entries)
        self._rollback()

    def _rollback(self) -> None:
        self._staged_entries = []
        self._staged_accounts = {}

    def _head(self) -> tuple[int, str]:
        entries = self._staged_entries or self._entries
        return EMPTY_HEAD if not entries else (entries[-1].seq, entries[-1].hash)

    def _read_account(self, key: str) -> Account | None:
        return self._staged_accounts.get(key) or self._accounts.get(key)

    def _write_entry(self, entry: Entry) -> None:
        self._staged_entries.append(entry)

    def _write_accounts(self, accounts: list[Account]) -> None:
        staged = self._staged_accounts
        for a in accounts:  # (a loop, not update() of a generator: on every debit's path)
            staged[a.key] = a

    def created_since(self, mark: Any = None) -> tuple[int, list[str]]:
        # Accounts are never removed and a dict keeps insertion order: those created since
        # ``mark`` (a count of accounts) are the last ones, read from the end in O(their number).
        self._mine()
        with self._lock:
            count = len(self._accounts)
            new = list(itertools.islice(reversed(self._accounts), count - (mark or 0)))
        return count, new[::-1]

    def accounts(self) -> list[Account]:
        self._mine()
        with self._lock:
            return [self._accounts[k] for k in sorted(self._accounts)]

    def entries(self, start: int = 1) -> Iterator[Entry]:
        self._mine()
        with self._lock:
            snapshot = self._entries[max(0, start - 1):]
        yield from snapshot
