"""The PostgreSQL ledger's lanes (``dpbudget.accountant.ledger.lanes``): the locks a debit takes on them,
and the check of the account rows against them when a ledger opens."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

from dpbudget.accountant.errors import LedgerCorruptedError
from dpbudget.accountant.ledger import table_sum

__all__ = ["check_rows", "locks", "reads"]

# The server's clock in whole microseconds since the epoch, as text (``reads``).
_SERVER_TIME = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text"


def locks(salt: str, written: Sequence[str], shared: Sequence[str]) -> str:
    """The statement that takes a debit's lane locks: transaction-level advisory locks, which
    write nothing (row locks would write each locked row, and shared ones on the one policy row
    a multixact per debit) — shared for the lanes it only reads (the policy's: debits do not wait
    for each other, and a policy change, which writes that lane, waits for every debit in flight),
    exclusive for the lanes it writes, all in the order of their ids, so that no two writers can
    wait for each other in a cycle. Every record dpbudget appends was locked so; the server's
    link check refuses one that raced it without."""
    ids = {lock_id(salt, k): "_shared" for k in shared}
    ids.update((lock_id(salt, k), "") for k in written)
    return "SELECT " + (", ".join(f"pg_advisory_xact_lock{mode}({i})"
                                  for i, mode in sorted(ids.items())) or "1")


@functools.lru_cache(maxsize=4096)
def reads(every: str, spare: str) -> str:
    """The statement a debit's begin sends once its locks are held: rows ``('l', lane, seq,
    hash, time of the lane's last record, NULL)`` for each locked lane of ``every`` (an SQL
    array), one ``('s', NULL, the record's number, the server's clock in microseconds, NULL,
    NULL)`` — ``spare`` (an SQL number or NULL) while above every locked lane's last, else a new
    one — and ``('a', key, seq, rule, config, state)`` for each account of ``every``
    (``dpbudget.accountant.ledger.postgres_time`` says why the times)."""
    return ("SELECT 'l', l.key, l.seq, l.hash, (SELECT e.record::jsonb ->> 'time' FROM "
            f"dpbudget_entries e WHERE e.seq = l.seq), NULL FROM dpbudget_lanes l WHERE l.key = "
            f"ANY({every}) UNION ALL SELECT 's', NULL, CASE WHEN {spare} > coalesce((SELECT "
            f"max(seq) FROM dpbudget_lanes WHERE key = ANY({every})), 0) THEN {spare} ELSE "
            f"nextval('dpbudget_seq') END, {_SERVER_TIME}, NULL, NULL UNION ALL SELECT 'a', key, "
            f"seq, rule, config, state FROM dpbudget_accounts WHERE key = ANY({every})")


def lock_id(salt: str, key: str) -> int:
    """A lane's advisory lock: 64 bits of BLAKE2b of its key, keyed by the ledger's salt (ledgers
    in one database do not share locks; a collision only makes two lanes wait for each other)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8,
                             key=salt.encode("utf-8")[:64]).digest()
    return int.from_bytes(digest, "big", signed=True)



def check_rows(ledger: Any) -> None:
    """On opening a ledger of lanes: each account row must name the last record on its lane that
    charges it — its lane's last record, or one the lane reaches back to, from its last, through
    records that do not charge it (sessions' closes), each authentic and linked to the one before.

    This sees an account row rewound by hand (with the server's triggers disabled: only the
    tables' owner can) while its lane was left alone. One that rewinds the lane too is a
    truncated lane, which only the audit sees (it replays every record); and a row deleted by hand
    (its lane is left without one). Two queries, plus one lookup per record walked back (none for
    a lane whose last record charges its account).

    Raises:
        LedgerCorruptedError: naming the first account that disagrees.
    """
    rows = ledger._execute(
        "SELECT a.key, a.seq, l.seq, l.hash, e.hash FROM dpbudget_accounts a LEFT JOIN "
        "dpbudget_lanes l ON l.key = a.key LEFT JOIN dpbudget_entries e ON e.seq = l.seq "
        "ORDER BY a.key").fetchall()
    for key, seq, at, digest, stored in rows:
        fine, walked = at is not None and digest == stored, False
        while fine and at != seq:
            head = ledger.entry(at) if at > seq else None
            record: dict[str, Any] = {} if head is None else head.record
            link = (record.get("links") or {}).get(key)
            fine = (head is not None and head.hash == digest and table_sum.authentic(ledger, head)
                    and key not in (record.get("accounts") or {})
                    and isinstance(link, list) and len(link) == 2)
            if fine and isinstance(link, list):
                try:
                    at, digest, walked = int(link[0]), str(link[1]), True
                except (TypeError, ValueError):
                    fine = False
        if fine and walked:
            named = ledger.entry(seq)
            fine = named is not None and named.hash == digest
        if not fine:
            raise LedgerCorruptedError(
                f"{key}: its stored running state is not from the last record of its lane that "
                f"charges it (the row names record {seq}); the ledger was edited outside "
                "dpbudget. Nothing was written; run `dpbudget audit` on it")
    # Every lane a record moved belongs to an account some record charged (a session's close is
    # on its session's accounts' lanes): a lane without its row is a row deleted by hand, which
    # would start that limit again from zero.
    orphan = ledger._execute(
        "SELECT l.key FROM dpbudget_lanes l LEFT JOIN dpbudget_accounts a ON a.key = l.key "
        "WHERE a.key IS NULL AND l.seq > 0 ORDER BY l.key LIMIT 1").fetchone()
    if orphan is not None:
        raise LedgerCorruptedError(
            f"{orphan[0]}: records charge it but the ledger stores no running state for it (its "
            "row was deleted outside dpbudget). Nothing was written; run `dpbudget audit` on it")
