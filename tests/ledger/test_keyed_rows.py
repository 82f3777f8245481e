"""A keyed SQLite ledger whose account rows were edited by someone who can write the file but
does not hold the key: the audit (with the key) reports each edit; opening does not refuse them.

Until this change, each record of a keyed SQLite ledger carried ``table``, a running commitment
to the accounts table under the key, and opening refused a table its head did not commit to.
It was deleted: it stopped no one who can write the file. Such a holder copies the file before
the analysts spend and puts the copy back after (``test_an_older_copy_of_the_whole_file_answers
_again``): every record authentic, every row and the commitment consistent, the budget back —
which only ``dpbudget audit --expect-head`` sees, for a keyed ledger as for an unkeyed one.
Rows rewound, deleted or moved under another record are the audit's to report, as on an unkeyed
ledger (tests/ledger/test_account_rows.py). Negative control: the untouched keyed ledger audits
clean, so that a report below is the edit's.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger import open_ledger, writer
from dpbudget.mechanisms import Laplace
from tests.policies.test_policy_attacks import load_policy_text
from tests.support import OWNER

KEY = "a key the file's holder does not have"


def _spent(path: Path) -> str:
    url = f"sqlite:///{path}"
    with Accountant(Budget(1.0), ledger=url, rng=0, simulation=True) as acc:
        for _ in range(4):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    return url


def _answers(url: str) -> int:
    got = 0
    with Accountant.open(url) as acc:
        for _ in range(10):
            try:
                acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
            except Exception:
                break
            got += 1
    return got


def _canon(x: object) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"))


def _rewind(db: sqlite3.Connection) -> None:
    seq, text = db.execute("SELECT seq, record FROM entries WHERE record LIKE "
                           "'%dataset:people%' ORDER BY seq LIMIT 1").fetchone()
    state = json.loads(text)["accounts"]["dataset:people"]["state"]
    db.execute("UPDATE accounts SET seq = ?, state = ? WHERE key = 'dataset:people'",
               (seq, _canon(state)))


def _delete(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM accounts WHERE key = 'dataset:people'")


def _old_record_as_new_head(db: sqlite3.Connection) -> None:
    """Only INSERT (which the triggers allow): the text of the first record charging the
    dataset at head+1, the row set back to its state."""
    s0 = db.execute("SELECT min(seq) FROM entries WHERE record LIKE '%dataset:people%'"
                    ).fetchone()[0]
    head = db.execute("SELECT max(seq) FROM entries").fetchone()[0]
    text, digest = db.execute("SELECT record, hash FROM entries WHERE seq = ?", (s0,)).fetchone()
    db.execute("INSERT INTO entries (seq, hash, record) VALUES (?, ?, ?)", (head + 1, digest, text))
    state = json.loads(text)["accounts"]["dataset:people"]["state"]
    db.execute("UPDATE accounts SET state = ? WHERE key = 'dataset:people'", (_canon(state),))


def _older_record_under_the_rows_seq(db: sqlite3.Connection) -> None:
    """The UPDATE trigger dropped: the text of an older record charging the account put under
    the seq its row names, the row set to that record's state."""
    s0 = db.execute("SELECT min(seq) FROM entries WHERE record LIKE '%dataset:people%'"
                    ).fetchone()[0]
    last = db.execute("SELECT seq FROM accounts WHERE key = 'dataset:people'").fetchone()[0]
    text, digest = db.execute("SELECT record, hash FROM entries WHERE seq = ?", (s0,)).fetchone()
    db.execute("DROP TRIGGER entries_append_only_u")
    db.execute("UPDATE entries SET record = ?, hash = ? WHERE seq = ?", (text, digest, last))
    state = json.loads(text)["accounts"]["dataset:people"]["state"]
    db.execute("UPDATE accounts SET state = ? WHERE key = 'dataset:people'", (_canon(state),))


@pytest.mark.parametrize("edit", [_rewind, _delete, _old_record_as_new_head,
                                  _older_record_under_the_rows_seq],
                         ids=["rewound", "deleted", "old-record-as-new-head",
                              "older-record-under-the-rows-seq"])
def test_an_edited_row_of_a_keyed_ledger_is_reported_by_the_audit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        edit: Callable[[sqlite3.Connection], None]) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "l.db"
    url = _spent(path)
    assert _answers(url) == 0
    assert audit(url, key=KEY).ok  # (negative control: untouched, clean)
    with sqlite3.connect(path) as db:
        edit(db)
    report = audit(url, key=KEY)
    assert not report.ok
    assert report.exit_status & (8 | 32), [p.message for p in report.problems]  # chain or state


def test_a_rewound_policy_pointer_of_a_keyed_ledger_is_reported_by_the_audit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "p.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(10.0), ledger=url, owner_key=OWNER) as acc:
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                         by="owner", reason="lower", owner_key=OWNER)
    assert _answers(url) == 4
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = 1 WHERE key = 'policy'")
    report = audit(url, key=KEY)
    assert any("policy pointer" in p.message for p in report.problems if p.kind == "state")


def test_an_older_copy_of_the_whole_file_answers_again(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Why no check at opening: the holder of the file needs no row edit. A copy taken before
    the spend and put back after opens, answers the whole budget again and audits clean but for
    the head kept elsewhere (``expected_head``)."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path, copy = tmp_path / "l.db", tmp_path / "copy.db"
    url = f"sqlite:///{path}"
    Accountant(Budget(1.0), ledger=url, rng=0, simulation=True).close()
    shutil.copy(path, copy)
    assert _answers(url) == 4
    with open_ledger(url) as ledger:
        head = ledger.head()[1]
    shutil.copy(copy, path)
    monkeypatch.setattr(writer, "_WRITERS", {})  # (a later process: a writer of its own)
    assert _answers(url) == 4  # the budget back, with every record authentic
    assert audit(url, key=KEY).ok
    assert not audit(url, key=KEY, expected_head=head).ok


def test_a_keyed_ledger_whose_records_carry_a_table_member_opens_and_audits_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records written by the versions that kept the commitment carry ``table`` in their hashed
    text: they stay authentic, and the ledger opens and goes on."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    url = _spent(tmp_path / "l.db")
    with open_ledger(url) as ledger, ledger.transaction() as tx:
        tx.append({"kind": '"note"', "accounts": "{}", "table": '"' + "ab" * 64 + '"'}, [])
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="other")
    report = audit(url, key=KEY)
    assert report.ok, [p.message for p in report.problems]


def test_two_ledger_objects_one_file_interleaved(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    a = Accountant(Budget(100.0), ledger=url)
    b = Accountant.open(url)
    try:
        for i in range(6):
            (a if i % 2 else b).release(Laplace(0.25, sensitivity=1.0), 1.0,
                                        dataset="people" if i % 3 else "other")
    finally:
        a.close()
        b.close()
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    assert audit(url, key=KEY).ok
