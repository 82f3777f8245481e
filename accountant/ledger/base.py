"""The ledger interface: an append-only, hash-chained log of debits plus each limit's running state.

Invariant: the only way to change a ledger is ``Ledger.transaction()``
(``dpbudget.accountant.ledger.transaction``), which holds an exclusive lock on what it writes (across
threads and, for durable backends, across processes: the whole ledger, or in a ledger of lanes
each account it writes) from the moment it reads the state to the moment the new record and state
are committed together. Either both land or neither does, so a check made inside the transaction
is still true when its debit commits. The running state of every
limit (an "account") is kept beside the records, so resuming or debiting costs O(1), never a rescan.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from dpbudget.accountant.values.errors import LedgerCorruptedError, LedgerError
from dpbudget.accountant.ledger.entry import Account, Entry
from dpbudget.accountant.ledger.record import (GENESIS, auth_name, key_from_env, record_hash,
                                                time_micros)
from dpbudget.accountant.ledger.transaction import Transaction
from dpbudget.accountant.ledger.writer import Writer

__all__ = ["Account", "Entry", "Ledger", "Transaction"]


class Ledger(ABC):
    """Base class of ledger backends. Subclasses implement the storage primitives; the transaction
    protocol and the hash chain live here, once."""

    url: str
    # Whether other processes (or a later run) can open the same ledger: only then does it store
    # the policy its limits come from (``dpbudget.accountant.gate.policy_record``).
    durable = True
    # Linked per account (format 2, ``dpbudget.accountant.ledger.lanes``), not one chain: such a
    # backend also has ``_lane``, ``_next_seq`` and ``_advance``, which only its transactions call.
    lanes = False
    # Whether the store itself refuses to edit a record or lower a state, for any role that is
    # not its owner (the PostgreSQL triggers): a record the key does not authenticate is then a forged append, which
    # takes no budget back, and ``check_accounts`` warns of it instead of refusing to open.
    appends_only = False
    _tx_shared: Sequence[str] = ()  # in a ledger of lanes: what the transaction only reads
    # (seq, hash, time in microseconds) of the last record this object wrote or read the time
    # of: the head's time without re-reading it while no other writer moved on.
    _last_time: tuple[int, str, int] = (0, GENESIS, 0)

    def __init__(self, *, hmac_key: bytes | str | None = None) -> None:
        self._lock: Any = threading.RLock()
        self._pid = os.getpid()  # the process it belongs to (``_mine``)
        key = hmac_key.encode("utf-8") if isinstance(hmac_key, str) else hmac_key
        self._key = key if key is not None else key_from_env()
        self._auth = f'"{auth_name(self._key)}"'
        self._w: Writer | None = None  # this process's writer of this ledger, on first use

    def _landed(self, entry: Entry) -> bool:
        """Whether ``entry`` is in the ledger as written (after a commit an interrupt cut off)."""
        stored = self.entry(entry.seq)
        return stored is not None and stored.hash == entry.hash

    def _writer_key(self) -> str | None:
        """What identifies this ledger to its process's writer (``dpbudget.accountant.ledger.writer``):
        its URL when durable (every object on it shares one writer), else None (its own)."""
        return self.url if self.durable else None

    @property
    def authenticated(self) -> bool:
        """True when new records are chained with HMAC-SHA256 under a secret key."""
        return self._key is not None

    @property
    def authenticated_analyst(self) -> str | None:
        """The analyst the ledger's storage itself authenticated, read once when it opened: every
        release through this ledger is charged to it, whatever name the caller passes
        (``dpbudget.accountant.gate.planner``). None where the storage authenticates no one (SQLite, memory):
        there the ``analyst=`` a caller passes stands (docs/threat-model.md)."""
        return None

    @property
    def simulation(self) -> bool:
        """Whether this ledger was created for simulation: its first record, authentic, says so
        (``"simulation": true``, ``dpbudget.accountant.ledger.record``). Only such a ledger takes seeded
        noise among durable ones (``Accountant(..., simulation=True)``). Being the first
        record's, it is fixed when the ledger is created: no later record makes a ledger one,
        none makes it stop being one. One read of the first record (not on any release's path).
        """
        first = self.entry(1)  # (one row: ``entries()`` would fetch a page, 4,096 on SQL)
        if first is None or not self._authentic(first):
            return False
        try:
            return json.loads(first.text).get("simulation") is True
        except (ValueError, AttributeError):
            return False

    def transaction(self) -> Transaction:
        """An exclusive read-check-append unit (a context manager yielding itself); committed
        when the block ends, rolled back if it raises."""
        return Transaction(self)

    def account(self, key: str) -> Account | None:
        """A limit's state as last committed (a read; takes no write lock)."""
        self._mine()
        with self._lock:
            return self._read_account(key)

    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last record; ``(0, GENESIS)`` for an empty ledger. Keep the head
        hash somewhere else to detect a truncated tail later."""
        self._mine()
        with self._lock:
            return self._head()

    def now(self) -> float:
        """What this ledger's next transaction will most likely record as its time (seconds since
        the epoch): an estimate, for reads (what is left in the window in force) and for the keys
        a debit locks before its transaction's own time is known (``Transaction.time``)."""
        return max(time.time(), self._last_time[2] / 1e6)

    def _tx_micros(self, head: tuple[int, str] | None) -> int:
        """The time of the transaction this thread has begun, in microseconds since the epoch
        (called once per transaction, under its write lock): this process's wall clock, never
        earlier than the head record's time (``head``: the head, if just read). A clock set back
        cannot reopen a window or a block's locked share: one chain's times never run backwards.

        Raises:
            LedgerCorruptedError: the head record's time is unreadable.
        """
        floor = self._head_micros(self._head() if head is None else head)
        return max(time.time_ns() // 1000, floor)

    def _head_micros(self, head: tuple[int, str]) -> int:
        """The time of record ``head`` (``(seq, hash)``; 0 for an empty ledger)."""
        seq, digest = head
        known = self._last_time
        if seq == 0 or (known[0] == seq and known[1] == digest):
            return known[2] if seq else 0
        entry = self.entry(seq)
        try:
            micros = time_micros(json.loads(entry.text)["time"]) if entry is not None else 0
        except (KeyError, TypeError, ValueError):
            raise LedgerCorruptedError(f"record {seq}: its time is unreadable; the ledger was "
                                       "edited outside dpbudget. Nothing was written; run "
                                       "`dpbudget audit` on it") from None
        self._last_time = (seq, digest, micros)
        return micros

    @abstractmethod
    def accounts(self) -> list[Account]:
        """Every account, sorted by key."""

    def created_since(self, mark: Any = None) -> tuple[Any, list[str]]:
        """The keys of the accounts created since ``mark`` (None: every account, oldest first),
        and the mark of now, to pass next time: what a check that must see every account
        (``Gate._no_twin``) reads instead of listing them all each time. A backend that cannot
        tell returns every key and the mark None (correct, O(accounts))."""
        return None, [a.key for a in self.accounts()]

    def entry(self, seq: int) -> Entry | None:
        """The committed record number ``seq``, or None."""
        for entry in self.entries(seq):
            return entry if entry.seq == seq else None
        return None

    def check_accounts(self) -> None:
        """Check that every account's stored running state is the one its last record wrote.

        The running states are what the gate checks new debits against; a state table edited by
        hand (set back to zero, say) would hand out budget again. Run when an accountant opens
        the ledger. O(number of accounts).

        Each record a row names must be authentic (its hash; an HMAC on a keyed ledger). A row
        rewound to an earlier record, deleted or added is the audit's to see (``dpbudget audit``
        replays every record): whoever can write those rows can as well put back an older copy
        of the whole ledger, which no check made here could tell from the ledger itself.

        Where the store ``appends_only``, a record the key does not authenticate only warns
        (``RuntimeWarning``): a forged append, which lowered no state, must not lock the owner out.

        Raises:
            LedgerCorruptedError: naming the first account that disagrees.
        """
        forged: set[int] = set()
        for account in self.accounts():
            entry = self.entry(account.seq)
            recorded = None  # the record a row names is authentic (a refund edits both), and
            authentic = entry is not None and self._authentic(entry)  # stored under its own
            if entry is not None and (authentic or self.appends_only):  # number (an older one
                with contextlib.suppress(KeyError, TypeError, ValueError):  # moved up)
                    record = json.loads(entry.text)
                    if record.get("seq") == account.seq:
                        recorded = record["accounts"][account.key]["state"]
            if recorded != account.state:
                raise LedgerCorruptedError(
                    f"{account.key}: its stored running state is not the one its last record "
                    f"(seq {account.seq}) wrote; the ledger's state was edited outside dpbudget. "
                    "Nothing was written; run `dpbudget audit` on it")
            if not authentic:
                forged.add(account.seq)
        if forged:  # (one forged record must not make the ledger unopenable: issue 32)
            warnings.warn(f"records {sorted(forged)[:10]} do not verify under the ledger's key: "
                          "appended without it by a role that can write the ledger; the server "
                          "keeps them from lowering any state, so the ledger opens. Run "
                          "`dpbudget audit` with the key: it reports each one", RuntimeWarning,
                          stacklevel=2)

    @abstractmethod
    def entries(self, start: int = 1) -> Iterator[Entry]:
        """Records in order from ``seq == start``, streamed."""

    def audited_accounts(self) -> list[Account]:
        """The accounts as of the last full read of ``entries()``, where the backend can read
        both at one moment (a ledger written while it is audited), else as they stand."""
        return self.accounts()

    def close(self) -> None:
        """Release the backend's resources (idempotent)."""
        if self._pid == os.getpid():  # (a forked child's copy: the parent's, and maybe its lock)
            with self._lock:
                self._disconnect()

    def _disconnect(self) -> None:
        """Close the backend's connection (``close``, with the lock held)."""

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _authentic(self, entry: Entry) -> bool:
        """Whether a stored record matches its stored hash — under the ledger's key when it has
        one (a keyed ledger accepts no unkeyed record, whatever the record says of itself)."""
        try:
            says_keyed = json.loads(entry.text).get("auth") == "hmac-sha256"
        except (ValueError, AttributeError):
            return False
        return not (self._key is not None and not says_keyed) and bool(
            record_hash(entry.text, self._key if says_keyed else None) == entry.hash)

    def _mine(self) -> None:
        """Refuse a process other than the one that opened this object (a forked child holds a
        copy: of an in-memory budget, of a connection or a lock that are its parent's), before
        any lock is taken: a lock another thread of the parent held at the fork is held for good
        in the child. One rule for every backend; a child opens a ledger of its own.

        Raises:
            LedgerError: this process is not the one that opened the ledger; nothing was read
                or written.
        """
        if self._pid != os.getpid():
            raise LedgerError(
                f"this {type(self).__name__} belongs to the process that opened it; this process "
                "was forked from it: nothing was read or written. Open a ledger (an Accountant) "
                "of its own in each process (docs/getting-started.md, \"Several processes\")")

    # Storage primitives, called with self._lock held.
    @abstractmethod
    def _begin(self, prefetch: Sequence[str] = (), shared: Sequence[str] = ()) -> None:
        """Begin and take the write lock; ``prefetch`` names accounts the transaction will read
        (a backend whose every read is a round trip reads them with the lock, in one). In a
        ledger of lanes, it locks the lanes of ``prefetch`` to write them, and those of
        ``shared`` (also in ``prefetch``) only to read them."""

    @abstractmethod
    def _commit(self) -> None:
        """Commit; durable (on disk, or a server's) when it returns: the caller draws next."""

    @abstractmethod
    def _rollback(self) -> None: ...

    @abstractmethod
    def _head(self) -> tuple[int, str]: ...

    @abstractmethod
    def _read_account(self, key: str) -> Account | None: ...

    @abstractmethod
    def _write_entry(self, entry: Entry) -> None: ...

    @abstractmethod
    def _write_accounts(self, accounts: list[Account]) -> None: ...


EMPTY_HEAD = (0, GENESIS)

