"""Ledger backends: the ``LedgerContract`` battery on every registered backend, SQLite specifics
(WAL, synchronous=FULL: SQLite syncs each commit itself, append-only triggers, format version), and ``open_ledger``'s URL parsing."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from dpbudget.accountant import InvalidArgumentError, InvalidTypeError, LedgerError, PrivacyError
from dpbudget.accountant.ledger import Account, MemoryLedger, SqliteLedger, open_ledger
from tests.contracts import LedgerContract, fields


class TestLedgerContract(LedgerContract):
    """Runs once per entry of ``tests.conftest.LEDGER_BACKENDS`` (the ``ledger_opener`` fixture)."""


class TestSqliteLedger:
    def _ledger_with_entries(self, path: Path, n: int = 2) -> SqliteLedger:
        ledger = SqliteLedger(path)
        LedgerContract._append(ledger, n)
        return ledger

    def test_durability_pragmas(self, tmp_path: Path) -> None:
        ledger = SqliteLedger(tmp_path / "l.db")
        try:
            assert ledger._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: SQLite syncs each commit
        finally:
            ledger.close()
        # WAL is persistent in the file: another connection sees it too.
        conn = sqlite3.connect(tmp_path / "l.db")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()

    def test_entries_are_append_only(self, tmp_path: Path) -> None:
        ledger = self._ledger_with_entries(tmp_path / "l.db")
        ledger.close()
        conn = sqlite3.connect(tmp_path / "l.db")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("UPDATE entries SET record = '{}' WHERE seq = 1")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("DELETE FROM entries WHERE seq = 2")
        conn.close()
        assert len(list(SqliteLedger(tmp_path / "l.db").entries())) == 2

    def test_other_format_version_refused(self, tmp_path: Path) -> None:
        self._ledger_with_entries(tmp_path / "l.db").close()
        conn = sqlite3.connect(tmp_path / "l.db")
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'format'")
        conn.commit()
        conn.close()
        with pytest.raises(LedgerError, match="99"):
            SqliteLedger(tmp_path / "l.db")

    def test_not_a_database_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "junk.db"
        path.write_bytes(b"this is not an sqlite database at all" * 200)
        with pytest.raises(LedgerError) as info:
            SqliteLedger(path)
        assert isinstance(info.value, PrivacyError)
        assert "junk.db" in str(info.value)

    def test_missing_directory_refused(self, tmp_path: Path) -> None:
        with pytest.raises(LedgerError):
            SqliteLedger(tmp_path / "no" / "such" / "dir" / "l.db")

    def test_open_waits_for_another_writer_on_a_new_file(self, tmp_path: Path) -> None:
        """Two processes creating the same new ledger at once: while one holds a write lock on
        the fresh file, opening it must wait (up to ``timeout``) as documented, not fail at once
        with "database is locked" (seen with 4 worker processes starting together)."""
        path = tmp_path / "l.db"
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("CREATE TABLE unrelated (x)")
        other.execute("BEGIN IMMEDIATE")  # a writer in the middle of its own set-up
        release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
        release.start()
        try:
            start = time.monotonic()
            ledger = SqliteLedger(path, timeout=10.0)
            ledger.close()
            assert time.monotonic() - start < 5.0
        finally:
            release.join()
            other.close()

    def test_reader_sees_committed_not_staged(self, tmp_path: Path) -> None:
        ledger = self._ledger_with_entries(tmp_path / "l.db", 1)
        other = SqliteLedger(tmp_path / "l.db", timeout=0.2)
        try:
            with ledger.transaction() as tx:
                tx.append(fields(kind="release"),
                          [Account("dataset:a", "basic", {}, {"epsilon": 9.0, "delta": 0.0}, 0)])
                # another connection does not see the uncommitted record ...
                assert [e.seq for e in other.entries()] == [1]
                # ... and cannot start its own check-and-debit meanwhile (BEGIN IMMEDIATE).
                with pytest.raises(LedgerError):
                    with other.transaction():
                        pass
            assert [e.seq for e in other.entries()] == [1, 2]
            assert other.account("dataset:a").state == {"epsilon": 9.0, "delta": 0.0}
        finally:
            other.close()
            ledger.close()


# -- open_ledger ----------------------------------------------------------------------------------

def test_open_ledger_urls(tmp_path: Path) -> None:
    assert isinstance(open_ledger(None), MemoryLedger)
    assert isinstance(open_ledger("memory://"), MemoryLedger)
    mem = MemoryLedger()
    assert open_ledger(mem) is mem
    for spec in (f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "b.db", str(tmp_path / "c.db")):
        ledger = open_ledger(spec)
        try:
            assert isinstance(ledger, SqliteLedger)
        finally:
            ledger.close()
    assert {p.name for p in tmp_path.glob("*.db")} == {"a.db", "b.db", "c.db"}


@pytest.mark.parametrize(("spec", "error"), [
    ("ftp://example.org/ledger", InvalidArgumentError),
    ("mysql://localhost/db", InvalidArgumentError),
    ("", InvalidArgumentError),
    ("   ", InvalidArgumentError),
    (42, InvalidTypeError),
    (b"sqlite:///x.db", InvalidTypeError),
    (object(), InvalidTypeError),
])
def test_open_ledger_rejects(spec: object, error: type) -> None:
    with pytest.raises(error) as info:
        open_ledger(spec)  # type: ignore[arg-type]
    assert info.value.argument == "ledger"
    assert repr(spec) in str(info.value)
