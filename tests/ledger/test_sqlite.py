"""The SQLite ledger (``accountant.ledger.sqlite``): WAL, synchronous=FULL (SQLite syncs each commit
itself), append-only triggers, format version, files that are not a ledger, readers and writers.
(The ``LedgerContract`` battery on every backend: tests/ledger/test_base.py.)"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from dpbudget.accountant import LedgerError, PrivacyError
from dpbudget.accountant.ledger import Account
from dpbudget.accountant.ledger.sqlite import SqliteLedger
from tests.contracts import LedgerContract, fields
from tests.support import run_cli
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any
from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.ledger import SqliteLedger, open_ledger
from dpbudget.accountant.ledger import sqlite as sqlite_module
from dpbudget.accountant.values.errors import LedgerError
from dpbudget.mechanisms import Laplace


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


# ------------------------------------------------------------------------------------------------
# An SQLite ledger on read-only media can be audited, and read by status and export (issue 32).
#
# SQLite opens a WAL-mode file for writing, and needs to create its ``-shm`` beside it: on a
# read-only folder or file (an archive, a read-only mount, an auditor's copy) the audit failed with
# "unable to open database file". Readers (``create=False``) now fall back to SQLite's read-only
# URIs (``SqliteLedger._read_only``): ``mode=ro``, and with no ``-wal`` ``immutable=1``.
#
# The media are made read-only as they are in practice: ``chmod`` for a user other than root (root
# ignores modes), or, for root, the immutable attribute (``chattr +i``, which binds root too); each
# skips with its reason where it cannot apply. The URI path itself is also tested wherever the
# suite runs, with the file reported unwritable (``os.access``) and SQLite's writable open refused.
# ------------------------------------------------------------------------------------------------

def _ledger(folder: Path, n: int = 4) -> Path:
    folder.mkdir()
    path = folder / "l.db"
    with Accountant(Budget(10.0), ledger=f"sqlite:///{path}") as acc:
        for i in range(n):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset=f"d{i % 2}")
    return path


@contextlib.contextmanager
def _read_only(how: str, folder: Path) -> Iterator[None]:
    """``folder`` and its files made read-only: by mode (not root) or the immutable attribute."""
    paths = [folder, *folder.iterdir()]
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root ignores file modes: the chattr case covers root")
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p in paths:
                p.chmod(0o755 if p.is_dir() else 0o644)
        return
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("the immutable attribute needs root and chattr (the chmod case covers users)")
    if subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True).returncode:
        subprocess.run(["chattr", "-i", *map(str, paths)], capture_output=True)
        pytest.skip("this filesystem has no immutable attribute")
    try:
        with pytest.raises(OSError):  # the media are read-only, for root too
            (folder / "probe").write_text("x")
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


@pytest.mark.parametrize("how", ["chmod", "chattr"])
def test_a_ledger_on_read_only_media_audits_and_reports(tmp_path: Path, how: str) -> None:
    path = _ledger(tmp_path / "media")
    with _read_only(how, path.parent):
        rc, out, err = run_cli("audit", str(path))
        assert rc == 0 and "5 records, 5 verified" in out, err
        rc, out, _ = run_cli("status", str(path))
        assert rc == 0 and "5 records" in out and "running states checked" in out
        assert run_cli("export", str(path), str(tmp_path / "out.jsonl"))[0] == 0
        with pytest.raises(LedgerError):  # an accountant cannot write there
            Accountant(Budget(10.0), ledger=f"sqlite:///{path}")
        with open_ledger(path, create=False) as ledger:
            with pytest.raises(LedgerError, match="read-only media"), ledger.transaction():
                pass
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 5


@pytest.mark.parametrize("how", ["chmod", "chattr"])
def test_negative_control_without_the_fallback_the_audit_cannot_open_it(
        tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SqliteLedger, "_read_only", lambda self: False)
    path = _ledger(tmp_path / "media")
    with _read_only(how, path.parent):
        rc, _, err = run_cli("audit", str(path))
    assert rc == 2 and "unable to open database file" in err  # the figure


@pytest.mark.parametrize("how", ["chmod", "chattr"])
def test_commits_in_a_wal_on_read_only_media_are_read_or_refused_never_missed(
        tmp_path: Path, how: str) -> None:
    """A copy taken while the ledger was open: its last commits are in the -wal only. The
    immutable URI would not see them; the audit reads them (mode=ro) or refuses, never reports
    fewer records as clean."""
    live = _ledger(tmp_path / "live", 2)
    copy = tmp_path / "media"
    copy.mkdir()
    with Accountant(Budget(10.0), ledger=f"sqlite:///{live}") as acc:
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="d0")
        for suffix in ("", "-wal", "-shm"):
            shutil.copyfile(f"{live}{suffix}", copy / f"l.db{suffix}")
    with _read_only(how, copy):
        rc, out, err = run_cli("audit", str(copy / "l.db"))
    assert (rc == 0 and "4 records, 4 verified" in out) or (rc == 2 and "cannot open" in err)


# -- the URI path itself, wherever the suite runs ---------------------------------------------

def _unwritable(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """``path`` as read-only media present it: not writable, and SQLite's writable open fails
    (only the read-only URIs, which are strings, open)."""
    real_access, real_connect = os.access, sqlite3.connect

    def access(p: Any, mode: int, **kw: Any) -> bool:
        return False if mode & os.W_OK and Path(p) in (path, path.parent) else real_access(
            p, mode, **kw)

    def connect(target: Any, *args: Any, **kw: Any) -> Any:
        if not isinstance(target, str) and Path(target) == path:
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(target, *args, **kw)

    monkeypatch.setattr(sqlite_module.os, "access", access)
    monkeypatch.setattr(sqlite_module.sqlite3, "connect", connect)


def test_the_read_only_uri_reads_every_record_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _ledger(tmp_path / "media")
    before = path.read_bytes()
    _unwritable(monkeypatch, path)
    rc, out, err = run_cli("audit", str(path))
    assert rc == 0 and "5 records, 5 verified" in out, err
    assert run_cli("status", str(path))[0] == 0
    with open_ledger(path, create=False) as ledger:
        assert isinstance(ledger, SqliteLedger)
        assert ledger._target.startswith(f"file:{path}?mode=ro")  # (immutable: no -shm)
        assert ledger.head()[0] == 5
        with pytest.raises(LedgerError, match="read-only media"), ledger.transaction():
            pass
    assert path.read_bytes() == before


def test_negative_control_the_emulated_media_refuse_the_old_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulation above is not vacuous: without the fallback the audit cannot open it."""
    path = _ledger(tmp_path / "media")
    _unwritable(monkeypatch, path)
    monkeypatch.setattr(SqliteLedger, "_read_only", lambda self: False)
    rc, _, err = run_cli("audit", str(path))
    assert rc == 2 and "unable to open database file" in err


def test_a_writable_ledger_never_takes_the_read_only_path(tmp_path: Path) -> None:
    """The fallback is for read-only media only: an error on a writable file stands (a file
    that is not a ledger, here), and a writable ledger opens as always."""
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(LedgerError, match="not a dpbudget ledger"):
        open_ledger(other, create=False)
    path = _ledger(tmp_path / "media")
    with open_ledger(path, create=False) as ledger:
        assert ledger._target == path  # type: ignore[attr-defined]
