"""The chain commits to the accounts table (accountant.ledger.table_sum): an account row — or the
policy pointer — rewound to an earlier record, deleted or added by hand is refused when the ledger
opens, before any release, and the audit reports a forged commitment."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.values.errors import LedgerCorruptedError
from dpbudget.accountant.ledger import open_ledger, record_hash, table_sum
from dpbudget.mechanisms import Laplace
from tests.policies.test_policy_attacks import load_policy_text
from tests.support import OWNER


def _spent_ledger(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "l.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(1.0), ledger=url, rng=0, simulation=True) as acc:
        for _ in range(4):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
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
    with Accountant(Budget(10.0), ledger=url, owner_key=OWNER) as acc:
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                         by="o", reason="lower", owner_key=OWNER)
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
    from dpbudget.accountant.audit.transfer import export_jsonl
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


def _rewind(path: Path) -> None:
    with sqlite3.connect(path) as db:
        text = db.execute("SELECT record FROM entries WHERE seq = 2").fetchone()[0]
        state = json.dumps(json.loads(text)["accounts"]["dataset:people"]["state"],
                           sort_keys=True, separators=(",", ":"))
        db.execute("UPDATE accounts SET seq = 2, state = ? WHERE key = 'dataset:people'", (state,))


def test_a_head_without_its_commitment_is_refused_when_earlier_records_carry_one(
        tmp_path: Path) -> None:
    url, path = _spent_ledger(tmp_path)
    _rewind(path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO entries VALUES (6, 'junk', '{\"kind\":\"note\"}')")
    with pytest.raises(LedgerCorruptedError):
        Accountant.open(url)


def test_a_keyed_ledger_refuses_an_unkeyed_head(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", "s3cret")
    url, path = _spent_ledger(tmp_path)
    _rewind(path)
    with sqlite3.connect(path) as db:  # a forged head, unkeyed, committing to the rewound rows
        head_seq, head_hash = db.execute("SELECT seq, hash FROM entries ORDER BY seq DESC "
                                         "LIMIT 1").fetchone()
        rows = db.execute("SELECT key, seq FROM accounts").fetchall()
        record = {"seq": head_seq + 1, "prev": head_hash, "auth": "sha256", "kind": "note",
                  "accounts": {}, "table": f"{table_sum.total(rows):0128x}"}
        text = json.dumps(record, sort_keys=True, separators=(",", ":"))
        db.execute("INSERT INTO entries VALUES (?, ?, ?)", (head_seq + 1, record_hash(text), text))
    with pytest.raises(LedgerCorruptedError):
        Accountant.open(url)


def test_a_keyed_record_edited_with_its_row_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The row names a record whose state was edited (a refund): its HMAC no longer matches."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", "s3cret")
    path = tmp_path / "k.db"
    url = f"sqlite:///{path}"
    with Accountant(limits={"people": Budget(1.0), "other": Budget(1.0)}, ledger=url,
                    rng=0, simulation=True) as acc:
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="other")  # the head is not people's record
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER IF EXISTS entries_append_only_u")
        seq, text = db.execute("SELECT seq, record FROM entries WHERE record LIKE "
                               "'%dataset:people%' ORDER BY seq DESC LIMIT 1").fetchone()
        edited = text.replace('"epsilon":1.0}', '"epsilon":0.0}')
        assert edited != text
        db.execute("UPDATE entries SET record = ? WHERE seq = ?", (edited, seq))
        db.execute("UPDATE accounts SET state = ? WHERE key = 'dataset:people'",
                   ('{"delta":0.0,"epsilon":0.0}',))
    with pytest.raises(LedgerCorruptedError):
        Accountant.open(url)


def test_opening_while_another_thread_writes_is_never_taken_for_tampering(
        tmp_path: Path) -> None:
    import threading

    url = f"sqlite:///{tmp_path / 'busy.db'}"
    writer = Accountant(Budget(1e9), ledger=url, rng=0, simulation=True)
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            writer.release(Laplace(1.0, sensitivity=1.0), 1.0)
    thread = threading.Thread(target=write)
    thread.start()
    try:
        for _ in range(40):
            Accountant.open(url).close()
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert audit(url).ok


def test_a_name_that_would_forge_an_account_key_is_refused() -> None:
    from dpbudget.accountant.values.errors import InvalidArgumentError

    for name in ("x/analyst:bob", "a:b", "a@b", "a+b"):
        with pytest.raises(InvalidArgumentError, match="limits key"):
            Accountant(limits={name: Budget(1.0)})
