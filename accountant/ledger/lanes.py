"""Lanes: a ledger linked per account (record format 2), so that debits on different accounts
append in parallel — the PostgreSQL ledger's layout (``dpbudget.accountant.ledger.postgres``).

A ledger of one chain (format 1: ``prev``, the hash of the record before) makes every debit wait
for the one before it, whatever it charges. In a ledger of lanes every account has its own chain,
its *lane*: a format 2 record carries, instead of ``prev``, a member ``links`` mapping each lane
it is on to ``[seq, hash]`` of that lane's last record (``[0, GENESIS]`` for a lane's first).
A record is on the lane of every account it lists in ``accounts``, and on any other lane it names
(a session's closing record is on its session's accounts' lanes, though it debits nothing, so that
it cannot be deleted unseen either). A debit also names, in ``reads``, the last record of each lane
it read without writing — the policy's, so the policy record it was checked against: deleting the
latest policy record is then seen at the first debit after it, although nothing else follows it
on its lane. ``seq`` still numbers records uniquely and increases along
every lane, but records of different lanes are numbered in no particular order and numbers may be
skipped (a debit refused after it drew one): a gap is not a deletion. A record's number is taken
after its locks, or is one taken earlier that is above the last record of every lane it locks —
the ones it reads too — so that a record always comes after what it links to and what it read,
and a policy record after every debit checked against the policy before it.

Writers: a debit locks the lanes it writes (exclusive, in one order: no deadlock) and the policy's
lane (shared: debits do not wait for each other, and a policy change, which locks it exclusively,
waits for the debits in flight and they for it), reads the accounts, takes a number, and appends
one record linked to what it read. Debits on different datasets under a policy without a global
limit share no lane, so they never wait for each other; a global limit is one account, so every
debit writes its lane and they are serialised there, which its exact enforcement requires.

Tamper evidence. The lane heads are in the record, and the record in its hash (an HMAC under the
ledger's key): whoever edits a record without the key is seen by its hash (as in one chain). For
deletion, insertion and reordering, let ``r`` be a record on lane ``L`` and ``s`` the next
record on ``L``; ``s`` names ``r``'s seq and hash.

- *Deleting* ``r``: ``s`` then links to a record that is not the last one before it on ``L``
  (the audit tracks every lane's last record as it reads in ``seq`` order): seen, unless ``r`` has
  no successor on any of its lanes — the same tail case as truncating one chain, which only the
  head kept elsewhere shows (``dpbudget audit --expect-head``), or a later record on one of its
  lanes does.
- *Inserting* a record into ``L`` between ``r`` and ``s``: ``s`` links to ``r``, not to it; and a
  second record linking to ``r`` is a fork, seen the same way. Appending at a lane's end needs an
  authentic record (the key).
- *Reordering*: the audit reads in ``seq`` order and each lane's links must follow it; moving a
  record (changing its ``seq``) changes its hash.
- *The policy*: nothing follows a policy record on its lane until the next change, but every debit
  after it names it in ``reads``, which must be the lane's last record: deleting it is seen there.
- *The account rows*: each names its account's last record (``seq``), checked on open against
  what that record wrote (``Ledger.check_accounts``); on PostgreSQL the server's triggers keep
  them equal to it, growing, and undeleted, for every role but the owner. A row the tables'
  owner (who can disable the triggers) rewound or deleted, with its lane or without, is the
  audit's to see: it compares every row with its replay, and a rewound lane is a truncated one
  when a later record links or reads past it.

Ledgers of one chain are not rewritten: a PostgreSQL ledger made by an older version keeps its
format 1 records, and each account's lane starts at the last record that lists it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dpbudget.accountant.ledger.record import GENESIS, canonical

__all__ = ["FORMAT", "START", "links_member", "read_links"]

FORMAT = 2
START = (0, GENESIS)  # a lane's head before its first record


def links_member(heads: Iterable[tuple[str, tuple[int, str]]]) -> str:
    """The canonical JSON text of ``links`` from ``(lane, (seq, hash))`` pairs (keys sorted)."""
    return canonical({key: [int(seq), digest] for key, (seq, digest) in heads})


def read_links(record: Mapping[str, object],
               member: str = "links") -> dict[str, tuple[int, str]] | None:
    """A format 2 record's ``links`` (or ``reads``) as ``{lane: (seq, hash)}``; None if absent.

    Raises:
        ValueError: a member that is not a non-empty object of ``[seq, hash]`` pairs.
    """
    links = record.get(member)
    if links is None:
        return None
    if not isinstance(links, dict) or not links:
        raise ValueError(f"{member} is not a non-empty object")
    out = {}
    for key, link in links.items():
        if not (isinstance(link, list) and len(link) == 2 and type(link[0]) is int
                and link[0] >= 0 and isinstance(link[1], str)):
            raise ValueError(f"the link for {key} is not [seq, hash]")
        out[key] = (link[0], link[1])
    return out
