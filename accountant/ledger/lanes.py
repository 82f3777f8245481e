"""Lanes: a ledger linked per account (record format 2), so that debits on different accounts
append in parallel: the PostgreSQL ledger's layout (``dpbudget.accountant.ledger.postgres``).

Invariant: a format 2 record carries, instead of ``prev``, ``links``: for every lane it is on (each
account it lists, and any other lane it names) the ``[seq, hash]`` of that lane's last record
(``[0, GENESIS]`` for a lane's first), and in ``reads`` the same for each lane it read without
writing (the policy's); its ``seq`` is above every one of them. The locking, the server's checks
and the proof of tamper evidence: docs/theory.md §4e.
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
