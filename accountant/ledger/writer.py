"""Who wrote a record — one writer per process and ledger, with its own count of records — and
the logging of each committed record to ``dpbudget.ledger`` (``log_records``).

Each record's ``writer`` member names the writer (a random id) and its count ``n`` (1, 2, ...),
so that one process's log can be audited alone as a subsequence of the chain
(``dpbudget.accountant.audit_chain``): a gap in a writer's count is a deleted line, a gap in ``seq`` that no
writer's count explains is other writers' records. The writer is per process *and ledger* — every
ledger object a process opens on the same durable ledger shares it (a service that opens an
accountant per request is still one writer with one count) — and a forked child is a new writer.
An in-memory ledger is its own ledger, so each object is its own writer.

Interrupts and threads: the count moves only with commits, and only ever inside a transaction,
which the ledger's write lock serialises across threads, objects and processes (so the writer
needs no lock of its own, which an interrupt could leave held). A commit's records are noted as
pending before the commit; once the commit has returned, the committer marks them confirmed (one
atomic store), then logged; the next transaction of any object of the same writer counts them —
without a read when confirmed, else by looking for them in the ledger (an interrupt landed in
between) — and logs those an interrupt kept from the log, so that the process's log still holds
every record it committed (late, which the audit's reading window absorbs; twice at worst, which
it reads once).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Writer", "log_records", "writer_for"]

_LOG = logging.getLogger("dpbudget.ledger")  # accountant.logs documents this logger


class Writer:
    """One writer's id and count: ``state`` is (records committed and counted, the pending
    commit as ``[entries, confirmed]`` or None) — one attribute, replaced whole."""

    __slots__ = ("id", "pid", "state")

    def __init__(self) -> None:
        self.id = secrets.token_hex(8)
        self.pid = os.getpid()
        self.state: tuple[int, list[Any] | None] = (0, None)

    @property
    def written(self) -> int:
        return self.state[0]

    def member(self, n: int) -> str:
        """The record's ``writer`` member (canonical JSON) for its ``n``-th record."""
        return f'{{"id":"{self.id}","n":{n}}}'

    def begin(self, landed: Callable[[Any], bool]) -> None:
        """Count the pending commit, if any (inside a transaction): all of it when its committer
        confirmed it, else each record that ``landed(entry)`` finds in the ledger; and log those
        that landed but were not logged."""
        written, pending = self.state
        if pending is not None:
            entries, confirmed, logged = pending
            if not confirmed:  # a commit lands all of its records or none
                entries = tuple(entry for entry in entries if landed(entry))
            if logged < len(entries):
                log_records(entries[logged:])
            self.state = (written + len(entries), None)

    def committing(self, entries: tuple[Any, ...]) -> list[Any]:
        """Note ``entries`` as pending (inside the transaction, before its commit): the box in
        which the committer marks them confirmed (index 1) and counts those logged (index 2)."""
        box: list[Any] = [entries, False, 0]
        self.state = (self.state[0], box)
        return box


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


def log_records(entries: tuple[Any, ...], box: list[Any] | None = None) -> None:
    """Committed: now the logs may see them. An interrupt is held back until every record is
    logged; ``box[2]`` counts the records logged so far, so that if anything else cuts this short
    the writer's next transaction logs the rest. A record missing from its process's log would
    read as deleted there; a line written twice is read once."""
    done = 0 if box is None else box[2]
    if not _LOG.isEnabledFor(logging.INFO):
        done = len(entries)
    interrupt: BaseException | None = None
    while done < len(entries):
        try:
            entry = entries[done]
            _LOG.info("ledger record %d", entry.seq, extra={"dpbudget_entry": entry})
            done += 1
            if box is not None:
                box[2] = done
        except KeyboardInterrupt as exc:
            interrupt = exc
        except Exception:  # a failing handler or filter must not fail a debit that committed
            break  # (the writer's next transaction tries the rest again)
    if box is not None:
        box[2] = done
    if interrupt is not None:
        raise interrupt
