"""The chain's commitment to the accounts table: every record carries ``table``, a running sum
over all accounts of SHA-512(key, seq of the account's last record), modulo 2^512.

Why: the gate trusts the stored running states (that is what makes a debit O(1)), and opening a
ledger checks that each state row equals what the record it names wrote. That alone does not show
the row names its account's *last* record: someone who can write the file could rewind a row (or
the policy pointer) to an earlier record, and a deleted row starts the account afresh. The head
record's ``table`` pins the whole table: the sum over the rows, recomputed when a ledger opens,
must equal it, and the head record's own hash (an HMAC with ``DPBUDGET_LEDGER_KEY``) is checked.

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
from dpbudget.accountant.ledger.record import record_hash

__all__ = ["MODULUS", "advance", "at_head", "authentic", "check", "member", "read", "term", "total"]

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
    cached = ledger._table  # (seq, hash, sum) of the last record this object wrote
    table = cached[2] if cached is not None and cached[:2] == (seq, head) else \
        at_head(ledger, seq)
    terms = ledger._terms
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
    and carry the member, unless no record of the ledger does (one from before it existed).

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
    if claimed is None and any(read(e.text) is not None for e in ledger.entries()):
        claimed = -1  # stripped from the head while earlier records carry it: forged
    if claimed is None:  # no record carries it: a ledger from before the member existed
        return list(rows)
    if not authentic(ledger, head) or claimed != total((a.key, a.seq) for a in rows):
        raise LedgerCorruptedError(
            "the ledger's accounts table is not the one its last record commits to (a row "
            "rewound to an earlier record, deleted or added outside dpbudget, or the last "
            "record edited or forged); nothing was written; run `dpbudget audit` on it")
    return list(rows)


def authentic(ledger: Any, entry: Any) -> bool:
    """Whether a stored record matches its stored hash — under the ledger's key when it has one
    (a keyed ledger accepts no unkeyed record, whatever the record says of itself)."""
    key = ledger._key
    try:
        says_keyed = json.loads(entry.text).get("auth") == "hmac-sha256"
    except (ValueError, AttributeError):
        return False
    if key is not None and not says_keyed:
        return False
    return bool(record_hash(entry.text, key if says_keyed else None) == entry.hash)
