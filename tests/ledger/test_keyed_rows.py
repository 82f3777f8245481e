"""A keyed SQLite ledger refuses, when it opens, an account row rewound, deleted or added by hand
(``dpbudget.accountant.ledger.table_sum``: its head record, under the HMAC key, pins the table).

Also refused (a second review): an older authentic record inserted as a new head with the rows
set back to its time, or moved under the seq a row names (each record must sit under its own
number); and a keyed ledger whose records stopped carrying ``table`` (written between versions)
still opens, its head left to the audit.

The attacks of the review that found the commitment deleted: with the limit spent, a holder of
the file rewinds the row to an earlier record (3 answers more), deletes it (4 more), or rewinds the
policy pointer past a lowered limit (36 more). On a keyed ledger each is refused at the open now,
with nothing answered; without a key the holder could rewrite the chain too, and these are the
audit's to report (tests/ledger/test_account_rows.py). Negative control: the open's check taken
out, the rewound keyed ledger answers again.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget, LedgerCorruptedError
from dpbudget.accountant.ledger import table_sum
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


def _rewind(db: sqlite3.Connection) -> None:
    seq, text = db.execute("SELECT seq, record FROM entries WHERE record LIKE "
                           "'%dataset:people%' ORDER BY seq LIMIT 1").fetchone()
    state = json.dumps(json.loads(text)["accounts"]["dataset:people"]["state"], sort_keys=True,
                       separators=(",", ":"))
    db.execute("UPDATE accounts SET seq = ?, state = ? WHERE key = 'dataset:people'", (seq, state))


def _delete(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM accounts WHERE key = 'dataset:people'")


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


@pytest.mark.parametrize("edit", [_rewind, _delete], ids=["rewound", "deleted"])
def test_a_keyed_ledger_refuses_an_edited_row_when_it_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        edit: Callable[[sqlite3.Connection], None]) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "l.db"
    url = _spent(path)
    assert _answers(url) == 0
    with sqlite3.connect(path) as db:
        edit(db)
    with pytest.raises(LedgerCorruptedError):
        Accountant.open(url)


def test_a_keyed_ledger_refuses_a_rewound_policy_pointer(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "p.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(10.0), ledger=url, owner_key=OWNER) as acc:
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                         by="owner", reason="lower", owner_key=OWNER)
    assert _answers(url) == 4
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = 1 WHERE key = 'policy'")
    with pytest.raises(LedgerCorruptedError):
        Accountant.open(url)


def test_a_keyed_ledger_untouched_opens_and_goes_on(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    url = _spent(tmp_path / "l.db")
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="other")
    with Accountant.open(url) as acc:  # (the commitment follows every record)
        assert acc.spent("other").epsilon == pytest.approx(0.25)


def test_negative_control_without_the_check_the_rewound_keyed_ledger_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "l.db"
    url = _spent(path)
    with sqlite3.connect(path) as db:
        _rewind(db)
    monkeypatch.setattr(table_sum, "committed", lambda ledger: False)
    assert _answers(url) == 3


def _rows_as_of(db: sqlite3.Connection, s0: int) -> dict:
    rows = {}
    for seq, text in db.execute("SELECT seq, record FROM entries WHERE seq <= ? ORDER BY seq",
                                (s0,)):
        for k, a in (json.loads(text).get("accounts") or {}).items():
            cfg = {c: v for c, v in a.items() if c != "state"}
            rows[k] = (a["rule"], cfg, a["state"], seq)
    return rows


def _canon(x) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"))


def test_an_old_record_inserted_as_a_new_head_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only INSERT (allowed by the triggers): the text of old record s0 is inserted at seq
    head+1, rows set back to their state as of s0. The head is authentic and its table matches."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "l.db"
    url = _spent(path)
    assert _answers(url) == 0
    db = sqlite3.connect(path)
    s0 = db.execute("SELECT min(seq) FROM entries WHERE record LIKE '%dataset:people%'").fetchone()[0]
    head = db.execute("SELECT max(seq) FROM entries").fetchone()[0]
    text, digest = db.execute("SELECT record, hash FROM entries WHERE seq = ?", (s0,)).fetchone()
    cols = [r[1] for r in db.execute("PRAGMA table_info(accounts)")]
    existing = {r[0]: r for r in db.execute("SELECT key, rule, config, state, seq FROM accounts")}
    rows = _rows_as_of(db, s0)
    for k in existing:
        if k not in rows:
            db.execute("DELETE FROM accounts WHERE key = ?", (k,))
    for k, (rule, cfg, state, seq) in rows.items():
        db.execute("UPDATE accounts SET state = ?, seq = ? WHERE key = ?", (_canon(state), seq, k))
    db.execute("INSERT INTO entries (seq, hash, record) VALUES (?, ?, ?)", (head + 1, digest, text))
    db.commit()
    db.close()
    with pytest.raises(LedgerCorruptedError):
        Accountant.open(url)


def test_an_older_record_moved_under_a_rows_seq_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder drops the UPDATE trigger and puts the text of an older record charging the
    account under the seq the row names (not the head): the sum is unchanged."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "l.db"
    url = _spent(path)
    with Accountant.open(url) as acc:  # a record on another account becomes the head
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="other")
    assert _answers(url) == 0
    db = sqlite3.connect(path)
    seqs = [r[0] for r in db.execute("SELECT seq FROM entries WHERE record LIKE "
                                     "'%dataset:people%' ORDER BY seq")]
    s0, last = seqs[0], db.execute("SELECT seq FROM accounts WHERE key='dataset:people'").fetchone()[0]
    text, digest = db.execute("SELECT record, hash FROM entries WHERE seq = ?", (s0,)).fetchone()
    state = json.loads(text)["accounts"]["dataset:people"]["state"]
    db.execute("DROP TRIGGER entries_append_only_u")
    db.execute("UPDATE entries SET record = ?, hash = ? WHERE seq = ?", (text, digest, last))
    db.execute("UPDATE accounts SET state = ? WHERE key = 'dataset:people'", (_canon(state),))
    db.commit()
    db.close()
    with pytest.raises(LedgerCorruptedError):
        Accountant.open(url)


def test_keyed_ledger_with_earlier_table_records_then_records_without_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Versions up to 11370b5 wrote table (keyed too); 11370b5..d944c3e wrote none. A keyed
    ledger that lived through both must still open."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Accountant(Budget(10.0), ledger=url) as acc:  # era A: records carry table
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    with monkeypatch.context() as m:  # era B (the previous commit): no table member
        m.setattr(table_sum, "committed", lambda ledger: False)
        with Accountant.open(url) as acc:
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    with Accountant.open(url) as acc:  # this version
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")


def test_keyed_ledger_of_previous_commit_only_opens_and_continues(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with monkeypatch.context() as m:
        m.setattr(table_sum, "committed", lambda ledger: False)
        with Accountant(Budget(10.0), ledger=url) as acc:
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    for _ in range(2):
        with Accountant.open(url) as acc:
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")


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
