"""The chain commits to the accounts table (accountant.ledger.table_sum): an account row — or the
policy pointer — rewound to an earlier record, deleted or added by hand is refused when the ledger
opens, before any release, and the audit reports a forged commitment."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from accountant import Accountant, Budget
from accountant.audit import audit
from accountant.errors import LedgerCorruptedError
from accountant.ledger import open_ledger, record_hash, table_sum
from mechanisms import Laplace
from tests.policies.test_policy_attacks import load_policy_text


def _spent_ledger(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "l.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(1.0), ledger=url, rng=0) as acc:
        for _ in range(4):
            acc.release(Laplace(0.25), 1.0, dataset="people")
    return url, path


def test_every_record_commits_to_the_table_it_leaves(tmp_path: Path) -> None:
    url, _ = _spent_ledger(tmp_path)
    with open_ledger(url) as ledger:
        rows = [(a.key, a.seq) for a in ledger.accounts()]
        head = ledger.entry(ledger.head()[0])
        assert head is not None and table_sum.read(head.text) == table_sum.total(rows)
    assert audit(url).ok


def test_an_account_row_rewound_to_an_earlier_record_is_refused(tmp_path: Path) -> None:
    url, path = _spent_ledger(tmp_path)
    with sqlite3.connect(path) as db:  # record 2's state, record 2's seq: each row "consistent"
        text = db.execute("SELECT record FROM entries WHERE seq = 2").fetchone()[0]
        state = json.dumps(json.loads(text)["accounts"]["dataset:people"]["state"],
                           sort_keys=True, separators=(",", ":"))
        db.execute("UPDATE accounts SET seq = 2, state = ? WHERE key = 'dataset:people'", (state,))
    with pytest.raises(LedgerCorruptedError, match="accounts table"):
        Accountant.open(url)
    assert not audit(url).ok


def test_a_policy_pointer_rewound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(10.0), ledger=url) as acc:
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                         by="o", reason="lower")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = 1 WHERE key = 'policy'")
    with pytest.raises(LedgerCorruptedError, match="accounts table"):
        Accountant.open(url)


def test_a_deleted_account_row_is_refused(tmp_path: Path) -> None:
    url, path = _spent_ledger(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM accounts WHERE key = 'dataset:people'")
    with pytest.raises(LedgerCorruptedError, match="accounts table"):
        Accountant(Budget(1.0), ledger=url)


def test_the_check_can_fail_only_on_a_change(tmp_path: Path) -> None:
    """Negative control: rewriting a row with its own values changes nothing."""
    url, path = _spent_ledger(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = seq WHERE key = 'dataset:people'")
    Accountant.open(url).close()


def test_the_audit_reports_a_forged_commitment(tmp_path: Path) -> None:
    url, _ = _spent_ledger(tmp_path)
    export = tmp_path / "e.jsonl"
    from accountant.transfer import export_jsonl
    with open_ledger(url) as ledger:
        export_jsonl(ledger, export)
    lines = export.read_text().splitlines()
    obj = json.loads(lines[-1])
    obj["record"]["table"] = "0" * 128
    text = json.dumps(obj["record"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    lines[-1] = json.dumps({"hash": record_hash(text), "record": obj["record"]},
                           separators=(",", ":"), ensure_ascii=False)
    export.write_text("\n".join(lines) + "\n")
    report = audit(str(export))
    assert any("commitment to the accounts table" in p.message for p in report.problems)
