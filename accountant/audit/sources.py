"""Where an audit reads records from: a ledger (SQLite file, PostgreSQL URL) or a JSONL export/log.

Every source yields ``Item``s in storage order; a line that cannot be parsed is yielded as an item
with ``text=None`` rather than raised, so that the auditor can report it and go on.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from dpbudget.accountant.values.errors import LedgerError
from dpbudget.accountant.ledger import Account, Ledger, canonical, open_ledger

__all__ = ["REORDER_WINDOW", "Item", "MergedSource", "Source", "open_source", "progress_items"]

_SQLITE_MAGIC = b"SQLite format 3\x00"
_LINE_PREFIX = '{"hash":"'


class Item(NamedTuple):
    """One stored record: where it is (``position``: row seq or line number), the hash stored with
    it, and its canonical text (None when the stored form could not be read). ``record``: that
    text parsed, where the source had to parse it anyway (a JSONL line put in ``seq`` order, or
    not in the form ``export_line`` writes), so that the audit parses each record once."""

    position: int
    hash: str | None
    text: str | None
    error: str = ""
    origin: str = ""  # which file, when several are merged
    refusal: Any = None  # a refused request's log line (``dpbudget.accountant.gate.refusals``): not a record
    record: Any = None


class Source:
    """Records to audit, and (for a ledger) its stored running state.

    ``reorder``: for a JSONL file, yield its records in ``seq`` order within a window of that many
    lines (0: file order). A process's log is written after each commit, so writers sharing it
    (threads, ledger objects) can leave neighbouring lines out of order; the order of lines is not
    part of the chain, so restoring it hides nothing.
    """

    def __init__(self, name: str, ledger: Ledger | None = None, path: Path | None = None) -> None:
        # Exactly one of ledger and path is set.
        self.name = name
        self.ledger = ledger
        self.path = path
        self.reorder = 0

    def items(self) -> Iterator[Item]:
        if self.ledger is not None:
            position = 0
            try:
                for entry in self.ledger.entries():
                    position = entry.seq
                    yield Item(position, entry.hash, entry.text)
            except LedgerError as exc:  # a damaged file: reported, the rest unread
                yield Item(position + 1, None, None, str(exc))
            return
        assert self.path is not None  # exactly one of ledger and path is set
        if self.reorder:
            yield from (item for _, _, item in _window(_keyed(self._lines()), self.reorder))
            return
        yield from self._lines()

    def _lines(self) -> Iterator[Item]:
        assert self.path is not None
        with self.path.open("r", encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                line = line.rstrip("\n")
                if line.strip():
                    yield _parse_line(number, line)

    def size_hint(self) -> int:
        """Approximate number of records (for progress display)."""
        if self.ledger is not None:
            return self.ledger.head()[0]
        assert self.path is not None
        return max(1, os.path.getsize(self.path) // 600)

    def stored_accounts(self) -> list[Account] | None:
        """The ledger's stored running state, or None for a JSONL file (which has none)."""
        return None if self.ledger is None else self.ledger.audited_accounts()

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


class MergedSource(Source):
    """Several JSONL logs (one per process, say) read as one source in ``seq`` order: a k-way
    merge of files each in ``seq`` order, so memory does not grow with their length. A record
    present in several of them (same ``seq``, same hash) is read once (``duplicates`` counts the
    others); one ``seq`` with different contents is passed on for the auditor to report."""

    def __init__(self, sources: list[Source]) -> None:
        super().__init__(" + ".join(s.name for s in sources))
        self.sources = sources
        self.duplicates = 0

    def items(self) -> Iterator[Item]:
        for source in self.sources:  # a k-way merge needs each stream in seq order
            source.reorder = source.reorder or REORDER_WINDOW
        streams = [_keyed(s.items(), s.name) for s in self.sources]
        seen: tuple[int, set[str | None]] = (-1, set())
        for seq, _, item in heapq.merge(*streams, key=lambda t: (t[0], t[1])):
            if item.text is not None and seq == seen[0]:
                if item.hash in seen[1]:
                    self.duplicates += 1
                    continue
                seen[1].add(item.hash)
            elif item.text is not None:
                seen = (seq, {item.hash})
            yield item

    def size_hint(self) -> int:
        return sum(s.size_hint() for s in self.sources)

    def close(self) -> None:
        for source in self.sources:
            source.close()


REORDER_WINDOW = 4096


def _window(keyed: Iterator[tuple[int, int, Item]],
            size: int) -> Iterator[tuple[int, int, Item]]:
    """``keyed`` in key order within a sliding window of ``size`` items (bounded memory)."""
    heap: list[tuple[int, int, Item]] = []
    for entry in keyed:
        heapq.heappush(heap, entry)
        if len(heap) > size:
            yield heapq.heappop(heap)
    while heap:
        yield heapq.heappop(heap)


def _keyed(items: Iterator[Item], origin: str = "") -> Iterator[tuple[int, int, Item]]:
    """Items keyed by ``seq`` (an unreadable line keeps its place: the key of the line before
    it), and their file order; tagged with the file they come from when ``origin`` is given.

    The key only orders lines; the chain check verifies each record's own ``seq``, and reports a
    line out of place whatever key put it there. So a canonical text's ``seq`` is read where its
    sorted keys put it (the last ``,"seq":`` member), without a parse the check would repeat."""
    seq, rank = 0, 0
    for item in items:
        text, record = item.text, item.record
        if record is None and text is not None and item.refusal is None:
            at = text.rfind(',"seq":')
            found = _DIGITS.match(text, at + 7) if at >= 0 else None
            if found is not None:
                seq = int(found.group())
            else:
                try:
                    record = json.loads(text)  # (kept: the check reads it, not the text again)
                    value = record.get("seq")
                    seq = value if isinstance(value, int) else seq
                except (ValueError, AttributeError, RecursionError):
                    record = None
        elif isinstance(record, dict) and isinstance(record.get("seq"), int):
            seq = record["seq"]
        rank += 1
        if origin or record is not item.record:
            item = Item(item.position, item.hash, text, item.error, origin or item.origin,
                        item.refusal, record)
        yield seq, rank, item


_DIGITS = re.compile(r"[0-9]{1,19}(?=[,}])")


def _parse_line(number: int, line: str) -> Item:
    # Fast path: a line as written by export_line, whose record part is the canonical text itself.
    if line.startswith(_LINE_PREFIX) and line[73:84] == '","record":' and line.endswith("}"):
        return Item(number, line[9:73], line[84:-1])
    try:
        obj = json.loads(line)
        if isinstance(obj, dict) and set(obj) == {"refused"}:
            return Item(number, None, None, refusal=obj["refused"])
        record = obj["record"]  # (its canonical text is what the chain hashed)
        return Item(number, str(obj["hash"]), canonical(record), record=record)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # hostile nesting too
        return Item(number, None, None, f"unreadable line ({type(exc).__name__})")


def open_source(location: str | os.PathLike[str] | Ledger
                | Sequence[str | os.PathLike[str]]) -> Source:
    """A ledger (object, URL or SQLite file), a JSONL file of exported/logged records, or several
    JSONL files merged (a sequence of paths).

    Raises:
        LedgerError: nothing readable at ``location``, or a ledger among files to merge.
    """
    if isinstance(location, (list, tuple)):
        sources = [open_source(one) for one in location]
        if len(sources) == 1:
            return sources[0]
        ledgers = [s.name for s in sources if s.ledger is not None]
        if ledgers or not sources:
            for source in sources:
                source.close()
            raise LedgerError("only JSONL logs or exports can be merged; a ledger holds the "
                              f"whole chain already (audit it alone): {ledgers}")
        return MergedSource(sources)
    if isinstance(location, Ledger):
        return Source(location.url, ledger=location)
    text = str(location)
    if "://" in text:
        return Source(text, ledger=open_ledger(text, create=False))
    path = Path(text)
    if not path.is_file():
        raise LedgerError(f"no ledger or JSONL file at {text!r}")
    with path.open("rb") as f:
        magic = f.read(len(_SQLITE_MAGIC))
    if magic == _SQLITE_MAGIC:
        return Source(text, ledger=open_ledger(path, create=False))
    return Source(text, path=path)


def progress_items(src: Source, enabled: bool | None, label: str = "audit") -> Iterator[Item]:
    """The source's items, with a progress bar on stderr when ``enabled`` (default: only for
    more than 100,000 records on a terminal): tqdm's when it is installed (the ``progress``
    extra), else a plain one."""
    total = src.size_hint()
    if enabled is None:
        enabled = total > 100_000 and sys.stderr.isatty()
    items = src.items()
    if not enabled:
        yield from items
        return
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        yield from tqdm(items, total=total or None, unit=" records", desc=label, file=sys.stderr)
        return
    step = max(1, total // 200)
    for n, item in enumerate(items, start=1):
        if n % step == 0:
            done = min(1.0, n / total)
            bar = "#" * int(done * 40)
            print(f"\r{label} {bar:<40} {n:,} records", end="", file=sys.stderr, flush=True)
        yield item
    print(file=sys.stderr)
