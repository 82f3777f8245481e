"""Where an audit reads records from: a ledger (SQLite file, PostgreSQL URL) or a JSONL export/log.

Every source yields ``Item``s in storage order; a line that cannot be parsed is yielded as an item
with ``text=None`` rather than raised, so that the auditor can report it and go on.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple
from collections.abc import Iterator
from pathlib import Path

from accountant.errors import LedgerError
from accountant.ledger import Account, Ledger, canonical, open_ledger

__all__ = ["Item", "Source", "open_source"]

_SQLITE_MAGIC = b"SQLite format 3\x00"
_LINE_PREFIX = '{"hash":"'


class Item(NamedTuple):
    """One stored record: where it is (``position``: row seq or line number), the hash stored with
    it, and its canonical text (None when the stored form could not be read)."""

    position: int
    hash: str | None
    text: str | None
    error: str = ""


class Source:
    """Records to audit, and (for a ledger) its stored running state."""

    def __init__(self, name: str, ledger: Ledger | None = None, path: Path | None = None) -> None:
        # Exactly one of ledger and path is set.
        self.name = name
        self.ledger = ledger
        self.path = path

    def items(self) -> Iterator[Item]:
        if self.ledger is not None:
            for entry in self.ledger.entries():
                yield Item(entry.seq, entry.hash, entry.text)
            return
        assert self.path is not None  # exactly one of ledger and path is set
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
        return None if self.ledger is None else self.ledger.accounts()

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


def _parse_line(number: int, line: str) -> Item:
    # Fast path: a line as written by export_line, whose record part is the canonical text itself.
    if line.startswith(_LINE_PREFIX) and line[73:84] == '","record":' and line.endswith("}"):
        return Item(number, line[9:73], line[84:-1])
    try:
        obj = json.loads(line)
        return Item(number, str(obj["hash"]), canonical(obj["record"]))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # hostile nesting too
        return Item(number, None, None, f"unreadable line ({type(exc).__name__})")


def open_source(location: str | os.PathLike[str] | Ledger) -> Source:
    """A ledger (object, URL or SQLite file) or a JSONL file of exported/logged records.

    Raises:
        LedgerError: nothing readable at ``location``.
    """
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
