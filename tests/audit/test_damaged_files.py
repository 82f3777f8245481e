"""``dpbudget audit`` and ``dpbudget status`` on damaged files never end in a traceback (issue 31).

A fuzz over 200 damaged copies (fixed seed 31) of a small SQLite ledger and of its JSONL export:
a byte flipped at a random offset (130 copies: 100 of the ledger, 30 of the export), the file
truncated (35: 20 of the ledger, 15 of the export), 4 random bytes over the 100-byte header (15),
and a ledger copied while open with its ``-wal``/``-shm`` deleted, flipped or truncated (20). Each
command runs in process through ``main(argv)``: ``audit`` ends with its documented exit bits (or
2, the command line's own, for a file it cannot open), ``status`` with 0 or a typed message and
2; nothing escapes ``main``. Found by it, and fixed: a damaged entries table that repeats rows
made ``SqlLedger.entries`` page forever (the audit hung), NULL or mistyped rows and unreadable
stored states and records ended ``status`` in a TypeError, KeyError or JSONDecodeError.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import random
import shutil
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant import cli
from dpbudget.accountant.audit.run import EXIT_BITS
from dpbudget.accountant.values.errors import LedgerCorruptedError
from dpbudget.accountant.ledger import SqliteLedger, open_ledger, sql
from dpbudget.accountant.ledger.entry import Entry
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.mechanisms import Laplace

SEED = 31
DOCUMENTED = sum(set(EXIT_BITS.values()))


def _run(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` in process: its exit status and what it wrote to stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)  # an exception here is the traceback the test forbids
    return rc, err.getvalue()


def _release(acc: Accountant, n: int) -> None:
    for i in range(n):
        acc.release(Laplace(0.05, sensitivity=1.0), 1.0, dataset=f"d{i % 3}", label=f"q{i}")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    """A closed ledger, its JSONL export, and a ledger copied (with -wal, -shm) while open."""
    root = tmp_path_factory.mktemp("originals")
    acc = Accountant(Budget(2.0), ledger=f"sqlite:///{root / 'l.db'}")
    _release(acc, 8)
    acc.close()
    with open_ledger(root / "l.db", create=False) as ledger:
        export_jsonl(ledger, root / "l.jsonl")
    live = root / "live"
    live.mkdir()
    acc = Accountant(Budget(2.0), ledger=f"sqlite:///{live / 'l.db'}")
    _release(acc, 8)
    for suffix in ("", "-wal", "-shm"):  # (the recent commits are in the WAL still)
        shutil.copyfile(live / f"l.db{suffix}", root / f"open.db{suffix}")
    acc.close()
    return {"db": root / "l.db", "jsonl": root / "l.jsonl", "open": root / "open.db"}


def _damaged(originals: dict[str, Path], folder: Path) -> list[tuple[str, Path]]:
    """The 200 damaged copies: (what was done, the file to run the commands on)."""
    rng = random.Random(SEED)
    plan = ([("flip", "db")] * 100 + [("flip", "jsonl")] * 30 + [("truncate", "db")] * 20
            + [("truncate", "jsonl")] * 15 + [("header", "db")] * 15
            + [(what, "open") for what in ("no-wal", "no-shm", "neither", "wal-flip")] * 5)
    cases = []
    for n, (what, which) in enumerate(plan):
        source = originals[which]
        target = folder / str(n) / source.name
        target.parent.mkdir()
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{source}{suffix}").exists():
                shutil.copyfile(f"{source}{suffix}", f"{target}{suffix}")
        data = bytearray(target.read_bytes())
        if what == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif what == "truncate":
            data = data[:rng.randrange(len(data))]
        elif what == "header":
            at = rng.randrange(96)
            data[at:at + 4] = rng.randbytes(4)
        target.write_bytes(bytes(data))
        if what in ("no-wal", "neither"):
            Path(f"{target}-wal").unlink()
        if what in ("no-shm", "neither"):
            Path(f"{target}-shm").unlink()
        if what == "wal-flip":
            wal = bytearray(Path(f"{target}-wal").read_bytes())
            wal[rng.randrange(len(wal))] ^= 1 << rng.randrange(8)
            Path(f"{target}-wal").write_bytes(bytes(wal))
        cases.append((f"{what} {which} #{n}", target))
    return cases


def _commands(path: Path) -> list[list[str]]:
    return [["audit", str(path)]] + ([["status", str(path)]] if path.suffix == ".db" else [])


def test_audit_and_status_end_in_exit_bits_or_a_typed_message_on_200_damaged_copies(
        originals, tmp_path):
    cases = _damaged(originals, tmp_path)
    assert len(cases) == 200
    flagged = 0
    for what, path in cases:
        for argv in _commands(path):
            rc, err = _run(argv)
            assert "Traceback" not in err, what
            if argv[0] == "audit":
                assert rc == 2 or rc & ~DOCUMENTED == 0, (what, rc)
            else:
                assert rc in (0, 2), (what, rc)
            if rc == 2:
                assert err.startswith(f"dpbudget {argv[0]}: "), (what, err)
            flagged += argv[0] == "audit" and rc != 0
    assert flagged >= 100  # most damage is seen (a flip in free space may not be)


def test_negative_control_without_the_fixes_damage_escapes_as_a_traceback(originals, tmp_path,
                                                                            monkeypatch):
    """With the command line's net and the row checks taken out, the same copies raise out of
    ``main`` (what the test above would report)."""
    monkeypatch.setattr(cli, "_DAMAGE", ())
    monkeypatch.setattr(sql, "_account", lambda row: sql.Account(
        row[0], row[1], sql._parse_config(row[2]), sql.json.loads(row[3]), row[4]))
    escaped = 0
    for _, path in _damaged(originals, tmp_path)[:130]:  # (the flips: no repeating rows)
        for argv in _commands(path):
            try:
                _run(argv)
            except Exception:
                escaped += 1
    assert escaped > 0


class _Repeating:
    """A reading connection over a damaged table whose rows come back 1, 2, then seq 0 with
    NULLs, whatever page is asked for (what SQLite gave on one of the fuzzed copies)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def execute(self, query, args):
        return self

    def fetchall(self):
        return [(1, "{}", "a" * 64), (2, "{}", "b" * 64), (0, None, None)]


def test_entries_of_a_table_that_repeats_rows_end_with_a_typed_error(tmp_path, monkeypatch):
    ledger = SqliteLedger(tmp_path / "l.db")
    monkeypatch.setattr(ledger, "_reader", _Repeating)
    with pytest.raises(LedgerCorruptedError, match="entries table is damaged after record 2"):
        list(ledger.entries())
    ledger.close()


def test_negative_control_unchecked_rows_page_forever(tmp_path, monkeypatch):
    ledger = SqliteLedger(tmp_path / "l.db")
    monkeypatch.setattr(ledger, "_reader", _Repeating)
    monkeypatch.setattr(sql, "_entry", lambda seq, text, digest, after: Entry(seq, text, digest))
    assert len(list(itertools.islice(ledger.entries(), 1000))) == 1000  # (it never ends)
    ledger.close()
