"""Policy records (``dpbudget.accountant.gate.policy_record``): the limits in force live in the
ledger's hash chain; the first opener records them, the stored policy is read back from its record
and the record's hash is checked on every read (a hand-edited limit is refused, not enforced)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.gate.policy_record import actor, stored_document, stored_policy
from dpbudget.accountant.ledger import MemoryLedger, open_ledger
from dpbudget.accountant.values.errors import LedgerCorruptedError, LedgerError


def _created(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Accountant(limits={"adult": Budget(1.0, 1e-6)}, ledger=url).close()
    return url


def test_the_first_opener_records_the_policy_and_it_reads_back(tmp_path: Path) -> None:
    url = _created(tmp_path)
    with open_ledger(url, create=False) as ledger:
        first = json.loads(next(iter(ledger.entries())).text)
        assert first["kind"] == "policy" and first["by"] == actor()
        assert stored_document(ledger) == first["policy"]
    policy, _ = stored_policy(url)
    assert policy.datasets["adult"].limit == Budget(1.0, 1e-6)


def _hand_edited(tmp_path: Path) -> str:
    """The attack: a created ledger whose policy record (seq 1) is edited by hand in the file,
    its limit raised from ε = 1 to ε = 1000 (the append-only trigger dropped first)."""
    url = _created(tmp_path)
    with sqlite3.connect(tmp_path / "l.db") as conn:
        conn.execute("DROP TRIGGER entries_append_only_u")
        text = conn.execute("SELECT record FROM entries WHERE seq = 1").fetchone()[0]
        conn.execute("UPDATE entries SET record = ? WHERE seq = 1",
                     (text.replace('"epsilon":1.0', '"epsilon":1000.0'),))
    return url


def test_a_hand_edited_limit_is_refused_not_enforced(tmp_path: Path) -> None:
    url = _hand_edited(tmp_path)
    with pytest.raises(LedgerCorruptedError):
        stored_policy(url)


def test_negative_control_without_the_hash_check_the_edited_limit_would_be_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: reading the record without re-checking its hash (re-created) returns the
    forged limit, which the test above refuses."""
    url = _hand_edited(tmp_path)
    monkeypatch.setattr(policy_record, "_verified", lambda entry, ledger: json.loads(entry.text))
    policy, _ = stored_policy(url)
    assert policy.datasets["adult"].limit.epsilon == 1000.0


def test_a_ledger_without_a_policy_says_how_to_give_it_one() -> None:
    with pytest.raises(LedgerError, match="stores no policy"):
        stored_policy(MemoryLedger())


def test_a_mistyped_ledger_path_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(LedgerError):
        stored_policy(f"sqlite:///{tmp_path / 'typo.db'}")
    assert not (tmp_path / "typo.db").exists()


def test_the_actor_is_the_environments_or_the_os_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_ACTOR", "carol")
    assert actor() == "carol"
    monkeypatch.delenv("DPBUDGET_ACTOR")
    monkeypatch.setattr(policy_record.getpass, "getuser", lambda: "dave")
    assert actor() == "dave"
