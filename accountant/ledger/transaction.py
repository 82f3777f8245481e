"""``Ledger.transaction()``: the one way to change a ledger (``dpbudget.accountant.ledger.base``), as a
context manager or explicit ``begin``/``commit``/``abandon``, and the view inside it.

Interrupts: a KeyboardInterrupt (or any BaseException) may land between any two bytecodes — right
after BEGIN has run on the backend, or between the end of a ``with`` block and the call of
``__exit__``, which Python then never makes. The gate therefore uses the explicit form: one ``try``
around ``begin`` and ``commit`` whose ``except BaseException`` calls ``abandon`` and re-raises.
Every exit then rolls back and releases the lock, so an interrupted debit leaves no open
transaction behind (which would wedge the ledger and hold the write lock against every other
process). A backend's ``_begin`` also rolls back whatever a second interrupt, landing inside
``abandon`` itself, may have left open.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from dpbudget.accountant.values.errors import LedgerError, LedgerUnconfirmedError
from dpbudget.accountant.ledger import lanes as _lanes
from dpbudget.accountant.ledger.entry import Account, Entry
from dpbudget.accountant.ledger.record import FORMAT_VERSION, assemble, record_hash, utc_time
from dpbudget.accountant.ledger.writer import Writer, writer_for

# The ledger (``dpbudget.accountant.ledger.base.Ledger``) is typed ``Any`` here: base imports this module.
__all__ = ["Transaction"]

_VERSION = str(FORMAT_VERSION)
_LANES_VERSION = str(_lanes.FORMAT)


class Transaction:
    """``Ledger.transaction()``: a context manager yielding itself, or explicit ``begin`` (which
    returns it), ``commit`` and ``abandon``; between them, the view of the ledger.

    Its time (``time``, ``micros``) is the ledger's, never the caller's: fixed once read, it is
    the ``time`` of every record the transaction appends, so that the windows and blocks a debit
    computed from it can be checked against its record by the audit. Each backend says where it
    comes from (``Ledger._tx_micros``): the server's clock (PostgreSQL), this process's wall
    clock but never earlier than the head record's (SQLite), the clock it was given (in memory).
    """

    __slots__ = ("_ledger", "appended", "_read", "_micros")

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger
        self.appended: list[Entry] = []
        self._read: dict[str, Account | None] = {}
        self._micros: int | None = None

    @property
    def micros(self) -> int:
        """This transaction's time, in whole microseconds since the epoch (read once)."""
        micros = self._micros
        if micros is None:
            micros = self._micros = self._ledger._tx_micros(None)
        return micros

    @property
    def time(self) -> float:
        """This transaction's time, in seconds since the epoch: what a debit's renewal windows,
        blocks and unlock shares are computed from."""
        return self.micros / 1e6

    def account(self, key: str) -> Account | None:
        current: Account | None = self._ledger._read_account(key)
        self._read[key] = current
        return current

    @property
    def next_seq(self) -> int:
        """The sequence number the next ``append`` in this transaction will get (fixed: the
        transaction holds the locks it writes under)."""
        seq: int = self._ledger._next_seq() if self._ledger.lanes else self._ledger._head()[0] + 1
        return seq

    @property
    def empty(self) -> bool:
        """Whether the ledger held no record when this transaction began."""
        return bool(self._ledger._head()[0] == 0)

    def append(self, fields: dict[str, str], accounts: list[Account],
               lanes: Sequence[str] = ()) -> Entry:
        """Append a record and write the accounts' new states, as one unit.

        Args:
            fields: the record's members as canonical JSON texts (see ``record.assemble``); the
                version, sequence number, time and previous hash (or links) are added to it here,
                in place (each caller builds it for this one record: no copy on the hot path).
            accounts: the new state of every account the record charges.
            lanes: lanes the record is on besides its accounts' (a ledger of lanes only,
                ``dpbudget.accountant.ledger.lanes``; a session's close is on its accounts' lanes).
        """
        ledger = self._ledger
        if len(accounts) > 1 and len({a.key for a in accounts}) != len(accounts):
            raise LedgerError("refusing to write one account twice in one record; nothing was "
                              "written")
        for account in accounts:
            self._check_state(account)
        if ledger.lanes:
            keys = sorted({a.key for a in accounts}.union(lanes))
            if not keys:
                raise LedgerError("a record of a ledger of lanes must be on at least one lane "
                                  "(an account it charges, or one named); nothing was written")
            seq = ledger._next_seq() - 1
            extra = {"v": _LANES_VERSION,
                     "links": _lanes.links_member((k, ledger._lane(k)) for k in keys)}
            reads = [k for k in ledger._tx_shared if k not in keys]
            if reads:  # what the record was checked against (the policy in force)
                extra["reads"] = _lanes.links_member((k, ledger._lane(k)) for k in reads)
        else:
            seq, prev = ledger._head()
            if self._micros is None:  # (from the head just read: no second read of it)
                self._micros = ledger._tx_micros((seq, prev))
            extra = {"v": _VERSION, "prev": f'"{prev}"'}
        writer = ledger._w
        assert writer is not None  # set by the transaction's begin
        n = writer.written + len(self.appended) + 1
        micros = self._micros if self._micros is not None else self.micros
        fields.update(extra)  # (completed in place: the caller's dict is built for this record)
        fields.update(seq=str(seq + 1), time=utc_time(micros), auth=ledger._auth,
                      writer=writer.member(n))
        text = assemble(fields)
        entry = Entry(seq + 1, text, record_hash(text, ledger._key))
        ledger._write_entry(entry)
        written = [Account(a.key, a.rule, a.config, a.state, seq + 1) for a in accounts]
        ledger._write_accounts(written)
        read = self._read
        for a in written:
            read[a.key] = a
        if ledger.lanes:
            ledger._advance(keys, entry)
        else:
            ledger._last_time = (entry.seq, entry.hash, micros)  # (the next one's floor)
        self.appended.append(entry)
        return entry

    def _check_state(self, new: Account) -> None:
        """Refuse a running state that is not finite and >= 0 in every component, or that is
        below the stored one anywhere: every rule's state only grows (running sums and counts),
        so a decrease is a refund of budget, whoever asks for it."""
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

    def begin(self, prefetch: Sequence[str] = (), shared: Sequence[str] = ()) -> Transaction:
        """Take the write lock and begin; ``prefetch``: the accounts this transaction will read
        (an optimisation only: any account can still be read). In a ledger of lanes
        (``dpbudget.accountant.ledger.lanes``) the lanes of ``prefetch`` are locked for writing, except
        those also in ``shared``, locked for reading: writing a lane not locked here may end in
        a ``LedgerError`` (another writer moved it; nothing is written)."""
        ledger = self._ledger
        ledger._mine()  # (a forked child: refused before the lock, which may be held for good)
        backlog = ledger._w
        if backlog is not None and backlog.unlogged:  # (no lock held: writer.py)
            _log(backlog, "nothing was written", LedgerError)
        ledger._lock.acquire()
        writer = ledger._w
        if writer is None:
            writer = ledger._w = writer_for(ledger._writer_key())
        ledger._begin(prefetch, shared)
        writer.begin(ledger._landed)
        return self

    def commit(self) -> None:
        """Commit and release the lock. On a failure (or an interrupt) the caller's ``abandon``
        rolls back and releases; after a commit a rollback is harmless (nothing is open)."""
        ledger = self._ledger
        writer = ledger._w
        assert writer is not None  # set by begin
        box = writer.committing(tuple(self.appended))
        ledger._commit()  # durable when it returns (each backend syncs its own commit)
        writer.committed(box)  # the next transaction counts these without a read
        lock = ledger._lock
        while lock._is_owned():  # (every level: one an interrupt left would hold other threads)
            lock.release()
        # Logged only now, with no ledger lock held: a handler that blocks, or whose own lock an
        # interrupt left held, must not hold every other thread's debit (writer.py).
        _log(writer, "the debit is committed and its budget spent; nothing was drawn on it",
             LedgerUnconfirmedError)
        if writer.pid != os.getpid():  # (a log handler, say, forked during the debit)
            raise LedgerError("this process was forked during a debit: the process that began "
                              "it paid for one answer, and draws it; this one draws nothing")

    def abandon(self) -> None:
        """Roll back the open transaction (if any) and release the ledger's lock, as many times
        as this thread holds it. Decided by the lock's own state, not by a flag an interrupt
        could leave stale: this thread rolls back only what it owns, never another thread's
        transaction. Idempotent; an interrupt landing in it is raised once the lock is free."""
        lock, interrupted = self._ledger._lock, None
        while lock._is_owned():  # (a second Ctrl-C in here: finish the clean-up, then raise it)
            try:
                try:
                    self._ledger._rollback()
                except Exception:  # noqa: S110 - a broken connection: nothing uncommitted survives
                    pass
                while lock._is_owned():
                    lock.release()
            except BaseException as exc:
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

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
                self.abandon()
                raise
        else:
            self.abandon()


def _log(writer: Writer, outcome: str, error: type[LedgerError]) -> None:
    """``writer.log()``, a failure raised as ``error``: the record the log could not take stays
    queued, and every later transaction of the process is refused until it takes it."""
    try:
        writer.log()
    except Exception as exc:  # (its text may name a file: the type only)
        raise error(f"this process's log of ledger records cannot take them "
                    f"({type(exc).__name__}); {outcome}. Free the log's disk (or fix its "
                    "handler): the next debit writes the kept records first") from None
