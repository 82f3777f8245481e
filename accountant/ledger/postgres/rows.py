"""The PostgreSQL ledger's rows as values: what a debit's begin reads (``READS``, parsed into the
open transaction, ``Tx``), its account rows parsed by ``entry.account_row``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpbudget.accountant.values.errors import LedgerError
from dpbudget.accountant.ledger.entry import Account, account_row
from dpbudget.accountant.ledger.lanes import START
from dpbudget.accountant.ledger.record import time_micros

__all__ = ["BEGIN", "READS", "Tx"]

# A debit's transaction is read committed whatever the role, database or DSN sets: each statement
# reads what was committed before it began, so the reads after the locks see the last holder's
# commit. A repeatable-read snapshot, taken as the lock statement starts (before it waits), would
# miss it: a twin name's budget, or a policy lowered meanwhile, unseen.
BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE"

# A debit's reads, once its locks are held (a statement of its own: its snapshot is taken after
# them), of the keys in $1 (a JSON array), as text (``session.send``): ('l', lane, seq, hash, its
# last record's time, NULL) for each locked lane, ('s', NULL,
# the record's number, the server's clock in µs, NULL, NULL), ('a', key, seq, rule, config, state)
# for each account. The number is taken after the locks, so it is above the last record of every
# lane they cover, read ones included (``dpbudget.accountant.ledger.lanes``).
READS = (
    "WITH k AS (SELECT jsonb_array_elements_text($1::jsonb) AS key) SELECT 'l', l.key, l.seq, "
    "l.hash, (SELECT e.record::jsonb ->> 'time' FROM dpbudget_entries e WHERE e.seq = l.seq), "
    "NULL FROM dpbudget_lanes l JOIN k ON l.key = k.key UNION ALL SELECT 's', NULL, "
    "nextval('dpbudget_seq'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text, "
    "NULL, NULL UNION ALL SELECT 'a', a.key, a.seq, a.rule, a.config, a.state FROM "
    "dpbudget_accounts a JOIN k ON a.key = k.key")


class Tx:
    """An open transaction: the accounts and lanes it read, the number of its next record, its
    time and the server's clock at its begin (µs), and its writes (sent with the COMMIT).

    Its time is the server's clock read with its locks held, never earlier than the last record
    on any lane it locked: each lane's times never run backwards (the audit checks them per
    lane). Nothing of the caller's decides it.

    Raises:
        LedgerError: a locked lane's last record has an unreadable time (edited outside
            dpbudget); nothing was written.
    """

    __slots__ = ("lanes", "micros", "read", "seq", "server", "writes")

    def __init__(self, prefetch: Sequence[str], locked: Sequence[str], rows: list[Any]) -> None:
        self.read: dict[str, Account | None] = dict.fromkeys(prefetch)
        self.lanes: dict[str, tuple[int, str]] = dict.fromkeys(locked, START)
        self.seq: int | None = None
        self.writes: list[tuple[str, tuple[Any, ...]]] = []
        self.server = floor = 0
        for kind, key, seq, a, b, c in rows:
            if kind == "l":
                self.lanes[key] = (int(seq), a)
                try:
                    floor = max(floor, 0 if b is None else time_micros(b))
                except ValueError:
                    raise LedgerError(
                        f"PostgreSQL ledger: the last record on lane {key!r} has an unreadable "
                        "time (edited outside dpbudget); nothing was written. Run `dpbudget "
                        "audit` on it") from None
            elif kind == "a":
                self.read[key] = account_row((key, a, b, c, int(seq)))
            else:
                self.seq, self.server = int(seq), int(a)
        self.micros = max(self.server, floor)
