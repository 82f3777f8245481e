"""A keyed SQLite ledger refuses, when it opens, an account row rewound, deleted or added by hand
(``dpbudget.accountant.ledger.table_sum``: its head record, under the HMAC key, pins the table).

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
