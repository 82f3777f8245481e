"""The audit's chain check: each record's hash, its link to the record before it, and the order of
the sequence numbers — for a whole chain, or for a subsequence of it.

A ledger, or a full export of one, holds every record 1..head, each linking to the one before
(``prev``); a gap there is a deletion. One process's log (``dpbudget.accountant.audit.logs``) holds only the records
that process wrote, so it is a subsequence of the chain. Each record names its writer (``writer``:
a random id of the ledger object that wrote it, new in every process, and ``n``, that writer's
count of records, ``dpbudget.accountant.ledger.record``), which lets a subsequence be checked writer by
writer:

- a record's hash is always checked (each record verifies on its own);
- ``prev`` is checked whenever the record before it is present;
- a writer's records must come with consecutive ``n``: a gap there is one of that writer's
  records deleted from the source (a ``chain`` problem);
- a gap in ``seq`` that no writer's count explains is records of writers whose log this is not:
  reported as *absent* (``AuditReport.absent``), not as tampering. Several logs merged
  (``dpbudget audit a.jsonl b.jsonl``) fill each other's gaps; once every writer's log is in,
  nothing is absent.

What a subsequence cannot show: a record deleted from the source that was its writer's last one
in the source (exactly as a truncated tail cannot be seen without the expected head). Demand a
complete chain (``complete=True``, ``dpbudget audit --complete``) to audit an export, where an
absent record is a deletion. A ledger's own rows are always held to the complete chain, and so are
records written before the ``writer`` member existed.

A ledger of lanes (record format 2, ``dpbudget.accountant.ledger.lanes``) links each record to the last
record of each of its lanes (``links``) instead of to the record before it: numbers may be skipped,
and each link is checked against the last record seen on its lane (every lane's last record is
kept, from format 1 records too: their accounts' lanes). In a complete source every link must be
exactly that; in a subsequence a link past it means records of that lane are absent, and a link
before it is a fork.

Numbers skipped in a complete source of lanes are counted (``unused``), not reported: a debit takes
its number from the server's sequence inside its transaction, and a transaction that never
commits (refused, rolled back, interrupted, or lost in a server crash before its commit: never
answered) leaves its number unused, as does the sequence itself after a crash (it logs numbers
ahead). A committed record deleted is still seen, since the next record of each of its lanes
names it, and the last record of a lane by its account's row (``chain`` problems both).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dpbudget.accountant.ledger import GENESIS, record_hash
from dpbudget.accountant.ledger.lanes import START, read_links
from dpbudget.accountant.audit.sources import Item

__all__ = ["ChainCheck"]

_MAX_RANGES = 1000  # absent ranges kept for the report; beyond this only the count grows
_MAX_WRITERS = 100_000  # writers remembered (one per process and ledger object): bounded memory

Report = Callable[[str, str, "int | None", "int | None"], None]


class ChainCheck:
    """Checks records one at a time in source order; ``problem`` is called for each finding.

    After each ``check``, ``gap`` counts the absent runs seen so far: the replay uses it to know
    that an account's stored state may include debits it has not seen.
    """

    def __init__(self, key: bytes | None, problem: Report, *, ledger: bool,
                 complete: bool) -> None:
        self.key, self.problem = key, problem
        self.strict = ledger or complete  # every record 1..head must be present
        self.ledger = ledger
        self.prev, self.next_seq, self.skip_link = GENESIS, 1, False
        self.head: tuple[int, str] = (0, GENESIS)
        self.verified = 0
        self.absent = 0
        self.unused = 0  # in a complete source of lanes: numbers no record holds
        self.absent_ranges: list[tuple[int, int]] = []
        self.gap = 0
        self.duplicates = 0
        self.writers: dict[str, int] = {}
        self.keyless_reported = False
        self.lanes: dict[str, tuple[int, str]] = {}  # each lane's last record seen
        self.in_lanes = False  # a format 2 record has been seen

    def check(self, item: Item) -> dict[str, Any] | None:
        """The parsed record if it could be read (verified or not), else None."""
        where = (f"{item.origin} " if item.origin else "") + \
            f"{'row' if self.ledger else 'line'} {item.position}"
        if item.text is None:
            self.problem("malformed", f"{where}: {item.error}", None, item.position)
            self.skip_link = True
            return None
        try:
            record: dict[str, Any] = (item.record if item.record is not None
                                      else json.loads(item.text))  # (parsed once)
            seq, auth = record["seq"], record.get("auth", "sha256")
            links = read_links(record)
            prev = record["prev"] if links is None else None
            if not isinstance(seq, int) or isinstance(seq, bool):
                raise TypeError("seq is not an integer")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            self.problem("malformed", f"{where}: not a ledger record ({exc})", None,
                         item.position)
            self.skip_link = True
            return None
        if seq == self.head[0] and item.hash == self.head[1] and seq > 0:
            # The same line twice: a log written again after an interrupt reads it once; a
            # complete chain (a ledger, an export) has no business holding it.
            self.duplicates += 1
            if self.strict:
                self.problem("chain", f"record {seq} appears twice (a duplicated line)", seq,
                             item.position)
            return None
        found = self._hash(item, record, seq, auth)
        found += self._order(item, record, seq, prev, links)
        self.skip_link = False
        self.prev, self.next_seq = item.hash or "", max(self.next_seq, seq + 1)
        self.head = (seq, item.hash or "")
        accounts = record.get("accounts")
        on = links if links is not None else accounts if isinstance(accounts, dict) else ()
        for lane in on:
            self.lanes[lane] = self.head
        if not found:
            self.verified += 1
        return record

    def _hash(self, item: Item, record: dict[str, Any], seq: int, auth: Any) -> int:
        if auth == "hmac-sha256" and self.key is None:
            if not self.keyless_reported:
                self.keyless_reported = True
                self.problem("auth", f"record {seq} is HMAC-keyed and no key was given (set "
                             "DPBUDGET_LEDGER_KEY): its chain cannot be verified", seq, None)
            return 1
        if auth == "sha256" and self.key is not None:
            self.problem("auth", f"record {seq} is not HMAC-keyed although a key is required: "
                         "written without the key, or forged", seq, item.position)
            return 1
        if auth not in ("sha256", "hmac-sha256"):
            self.problem("malformed", f"record {seq}: unknown auth {auth!r}", seq, item.position)
            return 1
        if record_hash(item.text or "", self.key if auth == "hmac-sha256" else None) != item.hash:
            if auth == "hmac-sha256":  # (what a writer without the key appends: issue 32)
                self.problem("auth", f"record {seq}: its HMAC does not verify under the key "
                             "(forged without the key, or edited)", seq, item.position)
            else:
                self.problem("chain", f"record {seq}: its content does not match its hash "
                             "(edited)", seq, item.position)
            return 1
        return 0

    def _order(self, item: Item, record: dict[str, Any], seq: int, prev: Any,
               links: dict[str, tuple[int, str]] | None) -> int:
        if self.ledger and seq != item.position:
            self.problem("chain", f"row {item.position} holds record {seq} (moved)", seq,
                         item.position)
            return 1
        if seq < self.next_seq:
            if seq != self.head[0]:
                self.problem("chain", f"record {seq} appears after record {self.next_seq - 1} "
                             "(reordered or inserted)", seq, item.position)
            else:
                self.problem("chain", f"record {seq} appears twice with different contents "
                             "(forked or forged)", seq, item.position)
            return 1
        found = self._writer(item, record, seq)
        if links is not None:
            self.in_lanes = True
            if self.strict:  # (numbers a transaction took and never committed: not a deletion)
                self.unused += seq - self.next_seq
            return found + self._links(item, record, seq, links)
        if self.in_lanes:
            self.problem("chain", f"record {seq} is linked in one chain (format 1) after records "
                         "linked per account (forged or inserted)", seq, item.position)
            return found + 1
        if seq > self.next_seq:
            first, last = self.next_seq, seq - 1
            if self.strict or not isinstance(record.get("writer"), dict):
                missing = f"record {first}" if first == last else f"records {first}-{last}"
                self.problem("chain", f"{missing} missing before record {seq} (deleted or "
                             "moved)", seq, item.position)
                return found + 1
            self.absent += last - first + 1
            self.gap += 1
            if len(self.absent_ranges) < _MAX_RANGES:
                self.absent_ranges.append((first, last))
            return found  # the record before it is absent: its link cannot be checked
        if prev != self.prev and not self.skip_link:
            self.problem("chain", f"record {seq} does not link to record {seq - 1} (record "
                         f"{seq - 1} was edited and re-hashed, or {seq} was inserted)", seq,
                         item.position)
            return found + 1
        return found

    def _links(self, item: Item, record: dict[str, Any], seq: int,
               links: dict[str, tuple[int, str]]) -> int:
        """A format 2 record's links against each lane's last record seen."""
        accounts = record.get("accounts") or {}
        unlinked = sorted(k for k in accounts if k not in links)
        if unlinked:
            self.problem("chain", f"record {seq} charges {unlinked[0]} without linking to its "
                         "lane (forged)", seq, item.position)
            return 1
        for lane, read in sorted((read_links(record, "reads") or {}).items()):
            last = self.lanes.get(lane, START)
            if read != last and (self.strict or read[0] <= last[0]):
                self.problem("chain", f"record {seq} was checked against record {read[0]} of "
                             f"lane {lane}, whose last record before it is {last[0]} (a record "
                             "of that lane deleted, or this one forged)", seq, item.position)
                return 1
        for lane, link in sorted(links.items()):
            last = self.lanes.get(lane, START)
            if link == last:
                continue
            if not self.strict and link[0] > last[0]:
                self.gap += 1  # that lane's records in between are other writers' (absent here)
                continue
            if link[0] > last[0]:
                what = (f"record {link[0]}, which is missing before it on lane {lane} (deleted "
                        "or moved)")
            else:
                what = (f"record {link[0]} on lane {lane}, whose last record before it is "
                        f"{last[0]} (a record of the lane deleted and re-linked, or {seq} "
                        "inserted, forked or edited)")
            self.problem("chain", f"record {seq} links to {what}", seq, item.position)
            return 1
        return 0

    def _writer(self, item: Item, record: dict[str, Any], seq: int) -> int:
        writer = record.get("writer")
        if not isinstance(writer, dict):
            return 0
        wid, n = writer.get("id"), writer.get("n")
        if not (isinstance(wid, str) and isinstance(n, int) and not isinstance(n, bool)):
            self.problem("malformed", f"record {seq}: unreadable writer member", seq,
                         item.position)
            return 1
        last = self.writers.get(wid)
        if len(self.writers) >= _MAX_WRITERS and last is None:
            self.writers.clear()
        self.writers[wid] = n
        if last is None or n == last + 1:
            return 0
        if n > last + 1:
            lost = n - last - 1
            self.problem("chain", f"record {seq}: {lost} earlier record(s) of the same writer "
                         f"are missing from this source (deleted; that writer's numbers "
                         f"{last + 1}-{n - 1})", seq, item.position)
        else:
            self.problem("chain", f"record {seq}: its writer's count goes from {last} back to "
                         f"{n} (reordered or duplicated)", seq, item.position)
        return 1
