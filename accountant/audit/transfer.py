"""Moving records between ledgers: export to JSONL and import from it.

An export is one line per record, ``{"hash": ..., "record": {...}}`` (``ledger.record.export_line``),
the same form the logging handler writes. Import verifies the whole file with the auditor first, as
a complete chain (every record from the first to the head, each once), and refuses anything that
does not audit clean, naming the line, before writing anything; it then writes the records with
their original hashes (so the chain, and any HMAC under the original key, still verifies) and sets
each account's running state from the last record that debited it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.values.errors import LedgerCorruptedError, LedgerError
from dpbudget.accountant.ledger import Account, Entry, Ledger, export_line
from dpbudget.accountant.audit.sources import open_source, progress_items

__all__ = ["export_jsonl", "import_jsonl"]

_BATCH = 2000


def export_jsonl(ledger: Ledger, path: str | os.PathLike[str]) -> int:
    """Write every record of ``ledger`` to ``path`` (JSONL); return how many were written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for entry in ledger.entries():
            f.write(export_line(entry.hash, entry.text) + "\n")
            n += 1
    return n


def import_jsonl(path: str | os.PathLike[str], ledger: Ledger, *,
                 key: bytes | str | None = None, progress: bool | None = None) -> int:
    """Load a JSONL export into an empty ``ledger``; return the number of records. ``progress``:
    a progress bar on stderr for the audit and the load (default: large files on a terminal).

    Raises:
        LedgerCorruptedError: the file does not audit clean (nothing is written).
        LedgerError: the target ledger is not empty.
    """
    # Complete: an export holds every record from the first to its head, in order, each once;
    # a line that repeats one (or a log that lacks some) is refused here, before anything is
    # written, naming its line (not a raw constraint error from the ledger halfway through).
    report = audit(str(path), key=key, progress=progress, complete=True)
    if not report.ok:
        first = report.problems[0]
        where = f"line {first.position}: " if first.position is not None else ""
        raise LedgerCorruptedError(f"{path} does not audit clean as a complete export "
                                   f"({report.problem_count} problems; first: {where}"
                                   f"{first.message}); nothing imported")
    if ledger.head()[0] != 0:
        raise LedgerError(f"the target ledger {ledger.url} is not empty; import only into a new one")
    if not ledger.lanes:
        _one_chain(path, ledger)
    last: dict[str, Account] = {}
    batch: list[Entry] = []
    source = open_source(path)
    try:
        for item in progress_items(source, progress, "import"):
            if item.text is None or item.hash is None:  # verified above: cannot happen
                raise LedgerCorruptedError(f"line {item.position} is unreadable")
            record = json.loads(item.text)
            entry = Entry(record["seq"], item.text, item.hash)
            for k, acct in (record.get("accounts") or {}).items():
                config = {c: v for c, v in acct.items() if c != "state"}
                last[k] = Account(k, acct["rule"], config, acct["state"], record["seq"])
            batch.append(entry)
            if len(batch) >= _BATCH:
                _write(ledger, batch, [])
                batch = []
        _write(ledger, batch, list(last.values()))
    finally:
        source.close()
    return report.records


def _one_chain(path: str | os.PathLike[str], ledger: Ledger) -> None:
    """Refuse, before anything is written, an export linked per account (format 2,
    ``dpbudget.accountant.ledger.lanes``) into a ledger of one chain: its next record could not link."""
    source = open_source(path)
    try:
        for item in source.items():
            if item.text is not None and "links" in json.loads(item.text):
                raise LedgerError(f"{path} is linked per account (a PostgreSQL ledger's export) "
                                  f"and {ledger.url} is a ledger of one chain; import it into a "
                                  "PostgreSQL ledger; nothing imported")
    finally:
        source.close()


def _write(ledger: Ledger, entries: list[Entry], accounts: list[Account]) -> None:
    with ledger.transaction():
        for entry in entries:
            ledger._write_entry(entry)
        ledger._write_accounts(accounts)
