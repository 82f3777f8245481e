"""The ledger interface (``accountant.ledger.base``): the ``LedgerContract`` battery on every
registered backend, ``open_ledger``'s URL parsing, a limit's running state read in O(1), never
by a rescan, and the stored account rows against the records: a row whose state
is not what the authentic record it names wrote is refused when the ledger opens; a row rewound to
an earlier record (with that record's state, each row "consistent"), deleted or added by hand is
reported by the audit, which replays every record and compares every row (on a keyed ledger
too: tests/audit/test_run.py). Records of earlier versions carry a ``table`` member (a
commitment no longer kept): they still open and audit clean."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger import MemoryLedger, SqliteLedger, open_ledger
from dpbudget.accountant.ledger.base import Ledger
from dpbudget.accountant.values.errors import LedgerCorruptedError
from dpbudget.mechanisms import Laplace
from tests.contracts import LedgerContract
from tests.support import OWNER, load_policy_text


def _spent_ledger(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "l.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(1.0), ledger=url, rng=0, simulation=True) as acc:
        for _ in range(4):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    return url, path


def _state_problems(url: str) -> list[str]:
    return [p.message for p in audit(url).problems if p.kind == "state"]


def test_an_account_row_rewound_to_an_earlier_record_is_reported(tmp_path: Path) -> None:
    url, path = _spent_ledger(tmp_path)
    with sqlite3.connect(path) as db:  # record 2's state, record 2's seq: the row "consistent"
        text = db.execute("SELECT record FROM entries WHERE seq = 2").fetchone()[0]
        state = json.dumps(json.loads(text)["accounts"]["dataset:people"]["state"],
                           sort_keys=True, separators=(",", ":"))
        db.execute("UPDATE accounts SET seq = 2, state = ? WHERE key = 'dataset:people'", (state,))
    assert any("dataset:people" in m and "differs from the replay" in m
               for m in _state_problems(url))


def test_a_policy_pointer_rewound_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(10.0), ledger=url, owner_key=OWNER) as acc:
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                         by="o", reason="lower", owner_key=OWNER)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = 1 WHERE key = 'policy'")
    assert any("policy pointer" in m for m in _state_problems(url))


def test_a_deleted_account_row_is_reported(tmp_path: Path) -> None:
    """The attack: the row deleted, the gate starts the account afresh (a whole budget again);
    the audit names the account before any release, and after it too."""
    url, path = _spent_ledger(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM accounts WHERE key = 'dataset:people'")
    assert any("dataset:people" in m and "no running state" in m for m in _state_problems(url))
    with Accountant(Budget(1.0), ledger=url, rng=0, simulation=True) as acc:  # (audit only)
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    assert any("dataset:people" in p.message and p.kind == "limit" for p in audit(url).problems)


def test_an_added_account_row_is_reported(tmp_path: Path) -> None:
    url, path = _spent_ledger(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO accounts SELECT 'dataset:other', rule, config, state, seq "
                   "FROM accounts WHERE key = 'dataset:people'")
    assert any("dataset:other" in m for m in _state_problems(url))


def test_negative_control_rows_left_alone_or_rewritten_as_they_were_audit_clean(
        tmp_path: Path) -> None:
    """The checks above can fail only on a change: the same ledger untouched, or its row
    rewritten with its own values, opens and audits clean."""
    url, path = _spent_ledger(tmp_path)
    assert audit(url).ok
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = seq, state = state WHERE key = 'dataset:people'")
    Accountant.open(url).close()
    assert audit(url).ok


def test_records_of_earlier_versions_with_a_table_member_open_and_audit_clean(
        tmp_path: Path) -> None:
    """Earlier versions wrote ``table`` (128 hex digits) into every durable record, keyed or
    not; this version writes none (tests/audit/test_run.py says why).
    The member is part of the hashed text, so such records stay authentic and are read as they
    are."""
    url, _ = _spent_ledger(tmp_path)
    with open_ledger(url) as ledger, ledger.transaction() as tx:
        tx.append({"kind": '"note"', "accounts": "{}", "table": '"' + "ab" * 64 + '"'}, [])
    with open_ledger(url) as ledger:
        head = ledger.entry(ledger.head()[0])
        assert head is not None and '"table":"abab' in head.text
    Accountant.open(url).close()
    report = audit(url)
    assert report.ok, [p.message for p in report.problems]


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


class TestLedgerContract(LedgerContract):
    """Runs once per entry of ``tests.conftest.LEDGER_BACKENDS`` (the ``ledger_opener`` fixture)."""


def test_open_ledger_urls(tmp_path: Path) -> None:
    assert isinstance(open_ledger(None), MemoryLedger)
    assert isinstance(open_ledger("memory://"), MemoryLedger)
    mem = MemoryLedger()
    assert open_ledger(mem) is mem
    for spec in (f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "b.db", str(tmp_path / "c.db")):
        ledger = open_ledger(spec)
        try:
            assert isinstance(ledger, SqliteLedger)
        finally:
            ledger.close()
    assert {p.name for p in tmp_path.glob("*.db")} == {"a.db", "b.db", "c.db"}


@pytest.mark.parametrize(("spec", "error"), [
    ("ftp://example.org/ledger", InvalidArgumentError),
    ("mysql://localhost/db", InvalidArgumentError),
    ("", InvalidArgumentError),
    ("   ", InvalidArgumentError),
    (42, InvalidTypeError),
    (b"sqlite:///x.db", InvalidTypeError),
    (object(), InvalidTypeError),
])
def test_open_ledger_rejects(spec: object, error: type) -> None:
    with pytest.raises(error) as info:
        open_ledger(spec)  # type: ignore[arg-type]
    assert info.value.argument == "ledger"
    assert repr(spec) in str(info.value)


def test_a_running_state_is_read_without_a_rescan(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each limit's running state is kept beside the records, so a reopened ledger reads and
    debits an account without reading the records back (here made to fail). The negative
    control: the audit, which does replay them, meets the failure."""
    ledger = SqliteLedger(tmp_path / "l.db")
    LedgerContract._append(ledger, 3)
    ledger.close()
    reopened = SqliteLedger(tmp_path / "l.db")
    try:
        def rescan(*args: object, **kwargs: object) -> None:
            raise AssertionError("the records were read back")

        monkeypatch.setattr(reopened, "entries", rescan)
        assert isinstance(reopened, Ledger)
        assert reopened.account("dataset:a").state == {"epsilon": 0.75, "delta": 0.0}
        LedgerContract._append(reopened, 1)
        assert reopened.account("dataset:a").state["epsilon"] == 1.0
        with pytest.raises(AssertionError, match="read back"):
            audit(reopened)
    finally:
        reopened.close()
