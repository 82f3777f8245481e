"""A keyed ledger's commitment to its accounts table: each record of a keyed SQLite ledger (one
chain, an HMAC key) carries ``table``, a running sum over all accounts of SHA-512(key, seq of the
account's last record), modulo 2^512.

Why only there: the gate trusts the stored running states (that is what makes a debit O(1)), and
opening a ledger checks that each state row equals what the record it names wrote. That does not
show the row names its account's *last* record: someone who can write the file could rewind a row
(or the policy pointer) to an earlier record, or delete one, and get budget back. Without a key
that holder can rewrite the whole chain as well, so a commitment adds nothing the audit does not
(``dpbudget audit`` replays every row). With a key the records cannot be forged, and the head
record's ``table`` pins the whole table: the sum over the rows, recomputed when the ledger opens,
must equal it (the head record's HMAC checked). PostgreSQL's server triggers refuse such edits.

Rewinding, deleting or adding any set of rows changes the sum unless the changes cancel modulo
2^512; with each term a SHA-512 output, finding such a set among a ledger's own records is a
k-sum problem that Wagner's algorithm (CRYPTO 2002) solves in about 2^(512/(1+log₂k)) work per
list — beyond reach for any ledger (2^32 records per account even with 2^15 accounts). The sum is
updated in O(1) per debit: minus each charged account's old term, plus its new one.

Records written before this member existed have none; the first record with one is summed from
the table as it then stands.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from dpbudget.accountant.values.errors import LedgerCorruptedError

__all__ = ["MODULUS", "advance", "at_head", "check", "checked_rows", "committed", "member", "read",
           "remember", "term", "total"]

MODULUS = 1 << 512
_MARK = '"table":"'


def term(key: str, seq: int) -> int:
    """One account's term: SHA-512 of its key and the seq of its last record."""
    digest = hashlib.sha512(f"{key}\0{seq}".encode("utf-8")).digest()
    return int.from_bytes(digest, "big")


def total(rows: Iterable[tuple[str, int]]) -> int:
    """The sum over ``(key, seq)`` rows, from scratch."""
    return sum(term(key, seq) for key, seq in rows) % MODULUS


def member(value: int) -> str:
    """The record member's canonical JSON text (128 hex digits)."""
    return f'"{value:0128x}"'


def read(text: str) -> int | None:
    """The ``table`` member of a record's canonical text, or None if it has none."""
    at = text.find(_MARK)
    if at < 0:
        return None
    # The member is top-level; confirm on the parsed record, which also rejects a look-alike
    # string inside another member. A member that is there but malformed is a ValueError.
    value = json.loads(text).get("table")
    if value is None:
        return None
    if not (isinstance(value, str) and len(value) == 128):
        raise ValueError("a malformed table member")
    return int(value, 16)


def advance(ledger: Any, accounts: list[Any], seq: int, head: str,
            check_state: Callable[[Any], Any]) -> int:
    """The sum after a record (number ``seq + 1``, following the head ``seq`` whose hash is
    ``head``) that charges ``accounts``: the head's sum, minus each account's old term, plus its
    new one. ``check_state(account)`` checks a new state and returns the stored account."""
    cached = getattr(ledger, "_table", None)  # (seq, hash, sum) of its last record (``remember``)
    table = cached[2] if cached is not None and cached[:2] == (seq, head) else \
        at_head(ledger, seq)
    terms = ledger.__dict__.setdefault("_terms", {})  # key -> (seq, its term), as last added
    for account in accounts:
        old = check_state(account)
        if old is not None:
            known = terms.get(account.key)  # the term this object added last time, if any
            table -= known[1] if known is not None and known[0] == old.seq else \
                term(account.key, old.seq)
        new = term(account.key, seq + 1)
        table += new
        if len(terms) > 4096:
            terms.clear()
        terms[account.key] = (seq + 1, new)
    return table % MODULUS


def at_head(ledger: Any, seq: int) -> int:
    """The sum as of record ``seq`` (the head): its ``table`` member, or for a head without one
    (an empty ledger, or one from before the member existed) the sum of the table as it stands."""
    entry = ledger.entry(seq) if seq else None
    value = None if entry is None else read(entry.text)
    if value is None:
        value = total((a.key, a.seq) for a in ledger.accounts())
    return value


def check(ledger: Any) -> list[Any]:
    """Refuse a ledger whose account rows are not the table its head record commits to, and
    return the rows.

    The rows and the head are read until the head did not move while the rows were read (another
    process may be committing: a row set and a head from two moments would not match). The head
    record must be authentic — HMAC-keyed when the ledger has a key, whatever it says of itself —
    and stored under its own number; a head without the member (written by a version that kept
    none) is left to the audit.

    Raises:
        LedgerCorruptedError: a row rewound, deleted or added by hand, or the head record
            edited, forged or stripped of its commitment.
    """
    for _ in range(50):
        seq = ledger.head()[0]
        rows = ledger.accounts()
        if ledger.head()[0] == seq:
            break
    else:  # pragma: no cover - a ledger appended to without pause for 50 reads
        raise LedgerCorruptedError("the ledger kept moving while its accounts were read; "
                                   "try again")
    head = ledger.entry(seq) if seq else None
    if head is None:
        return list(rows)
    try:
        claimed = read(head.text)
    except (ValueError, AttributeError):
        claimed = -1
    if claimed is None:  # a head written without it (a version that kept none): the audit's
        return list(rows)
    try:  # the head stored under its own number: an older record inserted as a new head is not
        placed = json.loads(head.text).get("seq") == seq
    except (ValueError, AttributeError):
        placed = False
    if not (placed and ledger._authentic(head)) or claimed != total((a.key, a.seq) for a in rows):
        raise LedgerCorruptedError(
            "the ledger's accounts table is not the one its last record commits to (a row "
            "rewound to an earlier record, deleted or added outside dpbudget, or the last "
            "record edited or forged); nothing was written; run `dpbudget audit` on it")
    return list(rows)


def committed(ledger: Any) -> bool:
    """Whether ``ledger`` keeps the commitment: a durable ledger of one chain with an HMAC key."""
    return ledger.durable and not ledger.lanes and ledger._key is not None


def remember(ledger: Any, seq: int, entry_hash: str, table: int) -> None:
    """The sum as of the record this object just wrote: the next ``advance`` starts from it."""
    ledger._table = (seq, entry_hash, table)


def checked_rows(ledger: Any) -> list[Any]:
    """The account rows, checked against the head record's commitment where the ledger keeps
    one (``check``)."""
    return check(ledger) if committed(ledger) else list(ledger.accounts())
