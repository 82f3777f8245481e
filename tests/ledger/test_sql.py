"""The SQL ledgers' shared reads and format check (``accountant.ledger.sql``), shown on SQLite
(tests/ledger/postgres runs the same contract on PostgreSQL): the ``meta`` table pins the record
format, and a ledger written in another format is refused, never misread."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dpbudget.accountant import LedgerError
from dpbudget.accountant.ledger.record import FORMAT_VERSION
from dpbudget.accountant.ledger.sql import SqlLedger
from dpbudget.accountant.ledger.sqlite import SqliteLedger
from tests.contracts import LedgerContract


def _set_format(path: Path, value: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'format'", (value,))
    conn.commit()
    conn.close()


def test_the_format_is_pinned_and_another_one_refused(tmp_path: Path) -> None:
    """A new ledger records this version's format; one that says 99 is refused naming both,
    and nothing is written to it (the control: set back to this version, it opens)."""
    path = tmp_path / "l.db"
    ledger = SqliteLedger(path)
    assert isinstance(ledger, SqlLedger)
    LedgerContract._append(ledger, 2)
    ledger.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0] \
        == str(FORMAT_VERSION)
    conn.close()
    _set_format(path, "99")
    with pytest.raises(LedgerError, match=f"format 99; this version of dpbudget reads format "
                                          f"{FORMAT_VERSION}"):
        SqliteLedger(path)
    _set_format(path, str(FORMAT_VERSION))
    reopened = SqliteLedger(path)
    assert [e.seq for e in reopened.entries()] == [1, 2]
    reopened.close()


def test_a_refused_format_says_how_to_move_and_writes_nothing(tmp_path: Path) -> None:
    """The one format check both backends share: the refusal names the way to a new ledger
    (export, then import) and the file's bytes are untouched by it."""
    path = tmp_path / "l.db"
    ledger = SqliteLedger(path)
    LedgerContract._append(ledger, 1)
    ledger.close()
    _set_format(path, "99")
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="does not upgrade a ledger in place: `dpbudget "
                                          "export` it, then `dpbudget import`"):
        SqliteLedger(path)
    assert path.read_bytes() == before
