"""Moving records between ledgers (``dpbudget.accountant.audit.transfer``): an export imports into an
empty ledger and audits clean; a non-empty ledger or a damaged export is refused, with nothing
written."""

from __future__ import annotations

import pytest

from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.transfer import import_jsonl
from dpbudget.accountant.ledger import MemoryLedger, SqliteLedger
from dpbudget.accountant.values.errors import LedgerCorruptedError, LedgerError
from tests.audit.support import exported as _export
import contextlib
import io
from pathlib import Path
from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant import cli
from dpbudget.accountant.audit import transfer
from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
from dpbudget.accountant.ledger import SqliteLedger
from dpbudget.mechanisms import Laplace


def test_export_import_round_trip(tmp_path):
    path, _ = _export(tmp_path)
    target = SqliteLedger(tmp_path / "copy.db")
    assert import_jsonl(path, target) == 7
    report = audit(target)
    assert report.ok and report.head_seq == 7
    with pytest.raises(LedgerError, match="not empty"):
        import_jsonl(path, target)
    target.close()
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    fresh = MemoryLedger()
    with pytest.raises(LedgerCorruptedError):
        import_jsonl(path, fresh)
    assert fresh.head()[0] == 0


# ------------------------------------------------------------------------------------------------
# ``dpbudget import`` refuses a JSONL file with a duplicated line: a typed error naming the line,
# never its content, and nothing imported (issue 32).
#
# The figure: the audit before the import reads a log's repeated line once (a log written
# again after an interrupt may hold one), so the file "audited clean" and the import then failed
# inside the ledger with a raw SQLite "UNIQUE constraint failed", after committing the batches before
# it. Import now holds the file to a complete chain (``audit(..., complete=True)``), which an export
# is: every record from the first to the head, each once.
# ------------------------------------------------------------------------------------------------

CANARY = "canary-label-7719"


def _export_lines(tmp_path: Path, n: int = 6) -> list[str]:
    acc = Accountant(Budget(10.0))
    for i in range(n):
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="d", label=f"{CANARY}-{i}")
    export_jsonl(acc.ledger, tmp_path / "export.jsonl")
    return (tmp_path / "export.jsonl").read_text(encoding="utf-8").splitlines()


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "file.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _records(db: Path) -> int:
    with SqliteLedger(db, create=False) as ledger:
        return ledger.head()[0]


def test_a_duplicated_line_is_a_typed_error_naming_it_and_nothing_is_imported(
        tmp_path: Path) -> None:
    lines = _export_lines(tmp_path)
    path = _write(tmp_path, lines[:4] + [lines[3]] + lines[4:])  # line 5 repeats line 4
    db = tmp_path / "new.db"
    with SqliteLedger(db) as ledger, pytest.raises(LedgerCorruptedError) as caught:
        import_jsonl(path, ledger)
    message = str(caught.value)
    assert "line 5: record 4 appears twice (a duplicated line)" in message
    assert "nothing imported" in message and CANARY not in message and "UNIQUE" not in message
    assert _records(db) == 0

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(["import", str(path), str(tmp_path / "cli.db")]) == 2
    assert err.getvalue().startswith("dpbudget import: ") and "line 5:" in err.getvalue()
    assert CANARY not in err.getvalue() and _records(tmp_path / "cli.db") == 0


def test_negative_control_the_old_audit_lets_the_line_through_to_a_partial_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit as import ran it (a log's duplicates read once): the file passes, the ledger
    raises SQLite's own error, and the batches before the line stay imported."""
    lines = _export_lines(tmp_path)
    path = _write(tmp_path, lines[:4] + [lines[3]] + lines[4:])
    real = transfer.audit
    monkeypatch.setattr(transfer, "audit", lambda *a, **kw: real(*a, **{**kw, "complete": False}))
    monkeypatch.setattr(transfer, "_BATCH", 2)
    db = tmp_path / "new.db"
    with SqliteLedger(db) as ledger, pytest.raises(LedgerError) as caught:
        import_jsonl(path, ledger)
    assert type(caught.value) is LedgerError and "UNIQUE constraint failed" in str(caught.value)
    assert _records(db) == 4  # not all or nothing


def test_a_clean_export_still_imports_whole(tmp_path: Path) -> None:
    lines = _export_lines(tmp_path)
    with SqliteLedger(tmp_path / "new.db") as ledger:
        assert import_jsonl(_write(tmp_path, lines), ledger) == len(lines)
    assert _records(tmp_path / "new.db") == len(lines)
    assert audit(str(tmp_path / "new.db")).ok
