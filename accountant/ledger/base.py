"""The ledger interface: an append-only, hash-chained log of debits plus each limit's running state.

Invariant: the only way to change a ledger is ``Ledger.transaction()``, which holds an exclusive lock
(across threads and, for durable backends, across processes) from the moment it reads the state to
the moment the new record and state are committed together. Either both land or neither does, so a
check made inside the transaction is still true when its debit commits. The running state of every
limit (an "account") is kept beside the records, so resuming or debiting costs O(1), never a rescan.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

from accountant.errors import LedgerCorruptedError, LedgerError
from accountant.ledger import table_sum
from accountant.ledger.writer import Writer, log_records, writer_for
from accountant.ledger.record import (
    FORMAT_VERSION,
    GENESIS,
    assemble,
    auth_name,
    key_from_env,
    record_hash,
)

__all__ = ["Account", "Entry", "Ledger", "Transaction"]

_VERSION = str(FORMAT_VERSION)


class Account(NamedTuple):
    """One limit's running state: ``key`` (e.g. ``"dataset:adult"``), the ``rule`` it is composed
    under, the rule's configuration when last written, the ``state``, and the last record's ``seq``."""

    key: str
    rule: str
    config: dict[str, Any]
    state: dict[str, float]
    seq: int


class Entry(NamedTuple):
    """One committed record: its ``seq``, canonical ``text`` and ``hash``."""

    seq: int
    text: str
    hash: str

    @property
    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(self.text)
        return record


class Transaction:
    """The view of a ledger inside ``Ledger.transaction()``."""

    def __init__(self, ledger: "Ledger") -> None:
        self._ledger = ledger
        self.appended: list[Entry] = []
        self._read: dict[str, Account | None] = {}

    def account(self, key: str) -> Account | None:
        current = self._read[key] = self._ledger._read_account(key)
        return current

    @property
    def next_seq(self) -> int:
        """The sequence number the next ``append`` in this transaction will get (fixed: the
        transaction holds the ledger's write lock)."""
        return self._ledger._head()[0] + 1

    def append(self, fields: dict[str, str], accounts: list[Account]) -> Entry:
        """Append a record and write the accounts' new states, as one unit.

        Args:
            fields: the record's members as canonical JSON texts (see ``record.assemble``); the
                version, sequence number, time and previous hash are added here.
            accounts: the new state of every account the record charges.
        """
        ledger = self._ledger
        if len(accounts) > 1 and len({a.key for a in accounts}) != len(accounts):
            raise LedgerError("refusing to write one account twice in one record; nothing was "
                              "written")
        seq, prev = ledger._head()
        table = None
        if ledger.durable:  # only a stored table can be edited behind the chain's back
            table = table_sum.advance(ledger, accounts, seq, prev, self._check_state)
            extra = {"table": table_sum.member(table)}
        else:
            extra = {}
            for account in accounts:
                self._check_state(account)
        writer = ledger._w
        assert writer is not None  # set by the transaction's begin
        n = writer.written + len(self.appended) + 1
        text = assemble({
            **fields, **extra, "v": _VERSION, "seq": str(seq + 1), "prev": f'"{prev}"',
            "time": _utc_now(), "auth": ledger._auth,
            "writer": writer.member(n),
        })
        entry = Entry(seq + 1, text, record_hash(text, ledger._key))
        # The record first: a PostgreSQL server checks each account row against the record it
        # points at (accountant.ledger.postgres_schema).
        ledger._write_entry(entry)
        written = [Account(a.key, a.rule, a.config, a.state, seq + 1) for a in accounts]
        ledger._write_accounts(written)
        self._read.update((a.key, a) for a in written)
        if table is not None:
            ledger._table = (seq + 1, entry.hash, table)
        self.appended.append(entry)
        return entry

    def _check_state(self, new: Account) -> Account | None:
        """Refuse a running state that is not finite and >= 0 in every component, or that is
        below the stored one anywhere: every rule's state only grows (running sums and counts),
        so a decrease is a refund of budget, whoever asks for it. Returns the stored account."""
        key = new.key
        old = self._read[key] if key in self._read else self._ledger._read_account(key)
        for name, value in new.state.items():
            if not 0.0 <= value < math.inf:
                raise LedgerError(f"refusing to write {key}: its state {name} would be {value}, "
                                  "not a finite number >= 0; nothing was written")
        if old is not None:
            for name, value in old.state.items():
                if not new.state.get(name, -1.0) >= value:
                    raise LedgerError(f"refusing to write {key}: its state {name} would go from "
                                      f"{value} to {new.state.get(name)} (a running state never "
                                      "decreases: that would refund budget); nothing was written")
        return old


class Ledger(ABC):
    """Base class of ledger backends. Subclasses implement the storage primitives; the transaction
    protocol and the hash chain live here, once."""

    url: str
    # Whether other processes (or a later run) can open the same ledger: only then does it store
    # the policy its limits come from (``accountant.policy_record``).
    durable = True
    optimistic = False  # the transaction begun last read a cache (may end in LedgerStaleError)

    def __init__(self, *, hmac_key: bytes | str | None = None) -> None:
        self._lock = threading.RLock()
        key = hmac_key.encode("utf-8") if isinstance(hmac_key, str) else hmac_key
        self._key = key if key is not None else key_from_env()
        self._auth = f'"{auth_name(self._key)}"'
        self._w: Writer | None = None  # this process's writer of this ledger, on first use
        # (seq, hash, table sum) of the last record this object wrote: the next append's
        # starting sum without re-reading the head record (re-read when another writer moved on).
        self._table: tuple[int, str, int] | None = None
        self._terms: dict[str, tuple[int, int]] = {}  # key -> (seq, its term), as last added

    def _landed(self, entry: Entry) -> bool:
        """Whether ``entry`` is in the ledger as written (after a commit an interrupt cut off)."""
        stored = self.entry(entry.seq)
        return stored is not None and stored.hash == entry.hash

    def _writer_key(self) -> str | None:
        """What identifies this ledger to its process's writer (``accountant.ledger.writer``):
        its URL when durable (every object on it shares one writer), else None (its own)."""
        return self.url if self.durable else None

    @property
    def authenticated(self) -> bool:
        """True when new records are chained with HMAC-SHA256 under a secret key."""
        return self._key is not None

    def transaction(self) -> "_Scope":
        """An exclusive read-check-append unit (a context manager yielding a ``Transaction``);
        committed when the block ends, rolled back if it raises."""
        return _Scope(self)

    def account(self, key: str) -> Account | None:
        """A limit's state as last committed (a read; takes no write lock)."""
        with self._lock:
            return self._read_account(key)

    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last record; ``(0, GENESIS)`` for an empty ledger. Keep the head
        hash somewhere else to detect a truncated tail later."""
        with self._lock:
            return self._head()

    @abstractmethod
    def accounts(self) -> list[Account]:
        """Every account, sorted by key."""

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

        The rows must also be the whole table the chain commits to: their sum must equal the
        head record's ``table`` (``accountant.ledger.table_sum``), which shows a row rewound to
        an earlier record, deleted or added by hand; and each record a row names must be
        authentic (its hash; an HMAC on a keyed ledger).

        Raises:
            LedgerCorruptedError: naming the first account that disagrees.
        """
        rows = table_sum.check(self)
        for account in rows:
            entry = self.entry(account.seq)
            recorded = None
            # The record a row names must itself be authentic (under the ledger's key, when it
            # has one): a state edited in the record and the row together would refund budget.
            if entry is not None and table_sum.authentic(self, entry):
                try:
                    recorded = json.loads(entry.text)["accounts"][account.key]["state"]
                except (KeyError, TypeError, ValueError):
                    recorded = None
            if recorded != account.state:
                raise LedgerCorruptedError(
                    f"{account.key}: its stored running state is not the one its last record "
                    f"(seq {account.seq}) wrote; the ledger's state was edited outside dpbudget. "
                    "Nothing was written; run `dpbudget audit` on it")

    @abstractmethod
    def entries(self, start: int = 1) -> Iterator[Entry]:
        """Records in order from ``seq == start``, streamed."""

    def close(self) -> None:
        """Release the backend's resources (idempotent)."""

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Storage primitives, called with self._lock held.
    @abstractmethod
    def _begin(self, prefetch: Sequence[str] = ()) -> None:
        """Begin and take the write lock; ``prefetch`` names accounts the transaction will read
        (a backend whose every read is a round trip reads them with the lock, in one)."""

    @abstractmethod
    def _commit(self) -> Any:
        """Commit; returns what ``_sync`` needs to make this commit durable, if anything."""

    def _sync(self, token: Any) -> None:
        """Make the commit that returned ``token`` durable, if ``_commit`` did not (called
        without the lock). Raises ``LedgerError`` when it cannot be confirmed."""

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


_clock: list[Any] = [None, ""]  # [whole second, its ISO prefix], reused within the same second


def _utc_now() -> str:
    """Now, as a JSON string in ISO 8601 UTC with microseconds (formatting the date part once per
    second: it is on the hot path)."""
    now = time.time_ns() // 1000
    second, micros = divmod(now, 1_000_000)
    if _clock[0] != second:
        stamp = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        _clock[0], _clock[1] = second, stamp
    return f'"{_clock[1]}.{micros:06d}+00:00"'


def _release_all(ledger: Ledger) -> None:
    """Release the ledger's lock as many times as this thread holds it, even if an interrupt
    lands in between (each pass re-checks ownership, so the lock is never left held)."""
    lock = ledger._lock
    while lock._is_owned():  # type: ignore[attr-defined]
        try:
            lock.release()
        except KeyboardInterrupt:
            continue


class _Scope:
    """``Ledger.transaction()``: a context manager, or explicit ``begin``/``commit``/``abandon``.

    Interrupts: a KeyboardInterrupt (or any BaseException) may land between any two bytecodes —
    right after BEGIN has run on the backend, or between the end of a ``with`` block and the call
    of ``__exit__``, which Python then never makes. The gate therefore uses the explicit form, with
    ``begin`` and ``commit`` inside one ``try`` whose handler calls ``abandon``: every exit rolls
    back and releases the lock, so an interrupted debit leaves no open transaction behind (which
    would wedge the ledger — "cannot start a transaction within a transaction" — and hold the
    write lock against every other process). A backend's ``_begin`` also rolls back whatever an
    interrupt outside these handlers may still have left open, before it begins.
    """

    __slots__ = ("_ledger", "_tx")

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._tx: Transaction | None = None

    def begin(self, prefetch: Sequence[str] = ()) -> Transaction:
        """Take the write lock and begin; ``prefetch``: the accounts this transaction will read
        (an optimisation only: any account can still be read)."""
        ledger = self._ledger
        ledger._lock.acquire()
        writer = ledger._w
        if writer is None or writer.pid != os.getpid():  # a forked child is another writer
            writer = ledger._w = writer_for(ledger._writer_key())
        ledger._begin(prefetch)
        writer.begin(ledger._landed)
        self._tx = Transaction(ledger)
        return self._tx

    def commit(self) -> None:
        """Commit and release the lock; on any failure (or interrupt) roll back, then raise."""
        ledger = self._ledger
        appended = () if self._tx is None else tuple(self._tx.appended)
        writer = ledger._w
        assert writer is not None  # set by begin
        committed = False
        try:
            box = writer.committing(appended)
            token = ledger._commit()
            committed = True
            box[1] = True  # committed: the next transaction counts these without a read
            log_records(appended, box)
        except BaseException:
            if not committed:  # (a rollback after the commit is harmless: nothing is open)
                self.abandon()
            raise
        finally:
            _release_all(ledger)
        # On disk before the caller may act on it (draw noise): after the lock, so that other
        # threads' transactions go on meanwhile and one sync covers them all.
        ledger._sync(token)

    def abandon(self) -> None:
        """Roll back the open transaction (if any) and release the lock (if held), even if
        interrupted again while doing so: the interrupt that brought us here is already on its
        way to the caller. Idempotent."""
        ledger = self._ledger
        # Decided by the lock's own state, not by a flag an interrupt could leave stale: this
        # thread rolls back only what it owns (never another thread's transaction), and releases
        # every level it holds (the gate never nests transactions).
        if not ledger._lock._is_owned():  # type: ignore[attr-defined]
            return
        try:
            while True:
                try:
                    ledger._rollback()
                    break
                except KeyboardInterrupt:
                    continue  # finish the clean-up first; the first interrupt still propagates
                except Exception:
                    break  # the connection is broken: nothing uncommitted survives it
        finally:
            _release_all(ledger)

    def __enter__(self) -> Transaction:
        try:
            return self.begin()
        except BaseException:
            self.abandon()
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abandon()  # whatever an interrupt left held (idempotent)
                raise
        else:
            self.abandon()
