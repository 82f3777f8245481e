"""Who wrote a record — one writer per process and ledger, with its own count of records — and
the logging of each committed record to ``dpbudget.ledger`` (``Writer.log``).

Each record's ``writer`` member names the writer (a random id) and its count ``n`` (1, 2, ...),
so that one process's log can be audited alone as a subsequence of the chain
(``dpbudget.accountant.audit.chain``): a gap in a writer's count is a deleted line, a gap in ``seq`` that no
writer's count explains is other writers' records. The writer is per process *and ledger* — every
ledger object a process opens on the same durable ledger shares it (a service that opens an
accountant per request is still one writer with one count) — and a forked child is a new writer.
An in-memory ledger is its own ledger, so each object is its own writer.

Interrupts and threads: the count moves only with commits, and only ever inside a transaction,
which the ledger's write lock serialises across threads, objects and processes (so the count needs
no lock of its own, which an interrupt could leave held). A commit's records are noted as pending
before the commit; once the commit has returned, the committer queues them for the log and marks
them confirmed (one atomic store); the next transaction of any object of the same writer counts
them — without a read when confirmed, else by looking for them in the ledger (an interrupt landed
in between), queueing those it finds — so that the process's log still holds every record it
committed (late, which the audit's reading window absorbs; twice at worst, which it reads once).

Logging (``Writer.log``) happens after the ledger's lock is released, never under it: a handler
that blocks, or one whose own lock an interrupt left held (``logging.Handler.handle`` takes it
before its ``try``), then stops only the threads that log, never every debit (the Ctrl-C wedge).
The queue keeps the records in commit order, and one thread at a time empties it (a thread that
finds another one logging waits for it, which logs its records too), so a process's log stays in
``seq`` order and holds a release's record before that release returns.

A record is never dropped from the log: a line that fails (a full disk) stays first in the queue
and ``log`` raises, so the release that committed it is withheld (``LedgerUnconfirmedError``), and
each later transaction tries the queue first and is refused, before any write, while it still
fails (``dpbudget.accountant.ledger.transaction``).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Writer", "writer_for"]

_LOG = logging.getLogger("dpbudget.ledger")  # dpbudget.accountant.audit.logs documents this logger
_WAIT = 30.0  # seconds to wait for another thread's logging (a lock an interrupt left held)


class Writer:
    """One writer's id and count: ``state`` is (records committed and counted, the pending
    commit as ``[entries, confirmed]`` or None) — one attribute, replaced whole; ``unlogged``:
    committed records not logged yet, in commit order."""

    __slots__ = ("id", "pid", "state", "unlogged", "_logging")

    def __init__(self) -> None:
        self.id = secrets.token_hex(8)
        self.pid = os.getpid()
        self.state: tuple[int, list[Any] | None] = (0, None)
        self.unlogged: deque[Any] = deque()
        # Held by the one thread emptying ``unlogged``; re-entrant, to know its owner (``log``).
        self._logging: Any = threading.RLock()

    @property
    def written(self) -> int:
        return self.state[0]

    def member(self, n: int) -> str:
        """The record's ``writer`` member (canonical JSON) for its ``n``-th record."""
        return f'{{"id":"{self.id}","n":{n}}}'

    def begin(self, landed: Callable[[Any], bool]) -> None:
        """Count the pending commit, if any (inside a transaction): all of it when its committer
        confirmed it (and queued it for the log), else each record that ``landed(entry)`` finds
        in the ledger, queued here."""
        written, pending = self.state
        if pending is not None:
            entries, confirmed = pending
            if not confirmed:  # a commit lands all of its records or none
                entries = tuple(entry for entry in entries if landed(entry))
                self.unlogged.extend(entries)
            self.state = (written + len(entries), None)

    def committing(self, entries: tuple[Any, ...]) -> list[Any]:
        """Note ``entries`` as pending (inside the transaction, before its commit): the box in
        which the committer marks them confirmed (``committed``)."""
        box: list[Any] = [entries, False]
        self.state = (self.state[0], box)
        return box

    def committed(self, box: list[Any]) -> None:
        """The commit of ``box`` returned (still under the ledger's lock): queue its records
        for the log, then confirm them (an interrupt in between queues them twice at worst)."""
        self.unlogged.extend(box[0])
        box[1] = True

    def log(self) -> None:
        """Log the queued records in order, on ``dpbudget.ledger``; called with no ledger lock
        held. When it returns, every record queued before the call is logged: if another thread
        is logging, it waits for it (that thread empties the queue before it lets go). An
        interrupt is raised once the logging lock is free.

        Raises:
            Exception: a handler's or filter's, for the first record whose line failed; it
                stays first in the queue (module docstring).
            TimeoutError: another thread held the logging lock for ``_WAIT`` seconds.
        """
        queue, lock = self.unlogged, self._logging
        if not _LOG.isEnabledFor(logging.INFO):
            queue.clear()  # (no one listens: nothing to keep)
            return
        while lock._is_owned():  # (left held in this thread by an interrupt in an earlier call)
            lock.release()
        if not queue:
            return
        mine = False
        try:
            mine = lock.acquire(timeout=_WAIT)
            if not mine:
                raise TimeoutError("another thread held the log for too long")
            while queue:
                entry = queue[0]
                _LOG.info("ledger record %d", entry.seq, extra={"dpbudget_entry": entry})
                queue.popleft()
        finally:
            if mine:
                lock.release()


_WRITERS: dict[str, Writer] = {}
_LOCK = threading.Lock()


def writer_for(ledger_key: str | None) -> Writer:
    """The writer of this process for the ledger ``ledger_key`` (None: a writer of its own)."""
    if ledger_key is None:
        return Writer()
    with _LOCK:
        writer = _WRITERS.get(ledger_key)
        if writer is None or writer.pid != os.getpid():
            writer = _WRITERS[ledger_key] = Writer()
        return writer
