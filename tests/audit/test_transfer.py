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
