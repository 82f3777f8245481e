"""A damaged ``-wal`` never loses committed records silently (issue 32, row 3: one flipped byte
in the WAL made SQLite's recovery drop every later commit, while open, release and audit stayed
clean: 109 of 150 trials). The attack: releases, the files copied while the ledger is open (as a
crash leaves them), one byte of a committed frame flipped, the copy reopened. Now refused before
SQLite touches the files (``accountant.ledger.wal``); with the check patched away, the
negative control shows the old silent loss. An undamaged copy, and one whose WAL restarted over
an earlier one's frames, still open with every record (no false alarm)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.ledger import SqliteLedger, open_ledger
from dpbudget.accountant.ledger import sqlite as sqlite_module
from dpbudget.accountant.ledger.wal import dropped_commits
from dpbudget.accountant.values.errors import LedgerCorruptedError
from dpbudget.mechanisms import Laplace
from tests.support import run_cli

_SUFFIXES = ("", "-wal", "-shm")


def _crashed_copy(tmp_path: Path, releases: int = 10,
                  restart: bool = False) -> tuple[Path, tuple[int, str]]:
    """A ledger's files copied while it is open, as a crash leaves them; and its head.
    ``restart``: a full checkpoint first, so that the WAL restarts over its earlier frames."""
    live, copy = tmp_path / "live.db", tmp_path / "copy.db"
    with Accountant(Budget(100.0), ledger=f"sqlite:///{live}") as acc:
        for _ in range(releases):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="d")
        if restart:
            with SqliteLedger(live) as other:
                assert other._conn.execute("PRAGMA wal_checkpoint(FULL)").fetchone()[0] == 0
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="d")
        with open_ledger(live, create=False) as ledger:
            head = ledger.head()
        for suffix in _SUFFIXES:
            shutil.copyfile(f"{live}{suffix}", f"{copy}{suffix}")
    return copy, head


def _frames(wal: Path) -> list[int]:
    """The offset of each frame of ``wal`` (its page size from the header)."""
    data = wal.read_bytes()
    page = int.from_bytes(data[8:12], "big")
    return list(range(32, len(data) - 24 - page + 1, 24 + page))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_wal_byte_is_refused_at_open_with_nothing_written(tmp_path: Path) -> None:
    copy, (head, digest) = _crashed_copy(tmp_path)
    wal = Path(f"{copy}-wal")
    _flip(wal, _frames(wal)[len(_frames(wal)) // 2] + 24 + 1000)  # (a middle frame: later commits)
    before = {s: Path(f"{copy}{s}").read_bytes() for s in _SUFFIXES}
    with pytest.raises(LedgerCorruptedError, match="-wal file is damaged"):
        SqliteLedger(copy)
    with pytest.raises(LedgerCorruptedError):
        Accountant(Budget(100.0), ledger=f"sqlite:///{copy}")  # no release on it
    rc, out, err = run_cli("audit", str(copy))
    assert rc == 2 and "-wal file is damaged" in err and out == ""
    assert {s: Path(f"{copy}{s}").read_bytes() for s in _SUFFIXES} == before  # evidence kept
    # The documented acknowledgement: SQLite itself checkpoints what it can read (the sqlite3
    # shell's ``PRAGMA wal_checkpoint(TRUNCATE)``); the ledger opens without the lost commits.
    conn = sqlite3.connect(copy)
    assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    conn.close()
    with open_ledger(copy, create=False) as ledger:
        assert 0 < ledger.head()[0] < head
    rc, _, _ = run_cli("audit", str(copy), "--expect-head", digest)
    assert rc & 8  # the head kept elsewhere (a receipt) shows the loss as a chain finding


def test_negative_control_without_the_check_the_loss_is_silent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy, (head, _) = _crashed_copy(tmp_path)
    wal = Path(f"{copy}-wal")
    _flip(wal, _frames(wal)[len(_frames(wal)) // 2] + 24 + 1000)
    monkeypatch.setattr(sqlite_module, "dropped_commits", lambda wal: 0)  # the old open
    with open_ledger(copy, create=False) as ledger:
        seen = ledger.head()[0]
    assert seen < head  # committed records gone
    rc, out, _ = run_cli("audit", str(copy))
    assert rc == 0 and f"{seen} records, {seen} verified" in out  # ... and the audit is clean


def test_a_flip_in_any_frame_but_the_last_is_refused(tmp_path: Path) -> None:
    """Every frame of the WAL (the page and the frame header), bar the last: a commit follows
    it, which SQLite would drop. Damage to the last frame alone (or to the checksum the last
    frame is seeded on) is what a crash while writing it leaves, and is not seen (module
    docstring of ``accountant.ledger.wal``)."""
    copy, _ = _crashed_copy(tmp_path, releases=4)
    wal = Path(f"{copy}-wal")
    original = wal.read_bytes()
    page = int.from_bytes(original[8:12], "big")
    frames = _frames(wal)
    assert len(frames) >= 8
    for n, at in enumerate(frames[:-1]):
        # Its page number and page; its stored checksum, which seeds the next frame's, bar the
        # next to last frame's (then no commit after the damage verifies).
        for where in (at + 2, at + 24 + page // 2) + ((at + 20,) if n < len(frames) - 2 else ()):
            wal.write_bytes(original)
            _flip(wal, where)
            assert dropped_commits(str(wal)) >= 1
            with pytest.raises(LedgerCorruptedError):
                SqliteLedger(copy)
    for where in (4, 20):  # the WAL header: SQLite would ignore every frame
        wal.write_bytes(original)
        _flip(wal, where)
        with pytest.raises(LedgerCorruptedError):
            SqliteLedger(copy)


@pytest.mark.parametrize("restart", [False, True])
def test_an_undamaged_wal_opens_with_every_record(tmp_path: Path, restart: bool) -> None:
    """No false alarm: a crashed copy, and one whose WAL restarted (new salts) over frames of
    the earlier WAL that are still in the file, open with their every record."""
    copy, (head, _) = _crashed_copy(tmp_path, restart=restart)
    if restart:
        wal = Path(f"{copy}-wal").read_bytes()
        salts = {wal[at + 8:at + 16] for at in _frames(Path(f"{copy}-wal"))}
        assert len(salts) == 2  # (the earlier WAL's frames are there)
    assert dropped_commits(f"{copy}-wal") == 0
    with open_ledger(copy, create=False) as ledger:
        assert ledger.head()[0] == head
