"""The policy in force lives in the ledger (issue 11): the attacks of a second analyst who opens a
shared ledger with limits of their own, and what the owner and the auditor see."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerConflictError
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    LedgerCorruptedError,
    LedgerError,
    UnknownDatasetError,
)
from dpbudget.accountant.gate.gate import Gate
from dpbudget.accountant.ledger import MemoryLedger, open_ledger
from dpbudget.accountant.gate.planner import Planner
from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
from dpbudget.mechanisms import Laplace
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy
from tests.support import assert_chain
from dpbudget.accountant.gate.owner_key import new_key_file
from tests.support import OWNER

POLICY = """
[datasets.people]
limit = { epsilon = 2.0 }
[datasets.people.analysts.alice]
limit = { epsilon = 1.0 }
"""


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'shared.db'}"


def _records(url: str) -> list[dict]:
    with open_ledger(url) as ledger:
        return [e.record for e in ledger.entries()]


def test_reopening_with_a_bigger_limit_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    url = _url(tmp_path)
    with Accountant(Budget(2.0), ledger=url) as owner:
        owner.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people")
    before = _records(url)
    with pytest.raises(LedgerConflictError) as info:
        Accountant(Budget(100.0), ledger=url)  # Bob's own limits
    assert "default.limit.epsilon: stored 2.0, given 100.0" in str(info.value)
    assert "Accountant.open" in str(info.value)
    assert _records(url) == before
    with Accountant.open(url) as bob:  # what Bob can do: the owner's limits
        assert bob.remaining("people") == Budget(1.5)
        with pytest.raises(BudgetExceededError):
            bob.release(Laplace(1.6, sensitivity=1.0), 1.0, dataset="people")


def test_a_policy_file_with_other_limits_is_refused_naming_each(tmp_path: Path) -> None:
    url = _url(tmp_path)
    original = tmp_path / "p.toml"
    original.write_text(POLICY)
    Accountant.from_policy(original, ledger=url).close()
    bigger = tmp_path / "bigger.toml"
    bigger.write_text(POLICY.replace("epsilon = 2.0", "epsilon = 20.0")
                      .replace("epsilon = 1.0", "epsilon = 10.0"))
    with pytest.raises(LedgerConflictError) as info:
        Accountant.from_policy(bigger, ledger=url)
    text = str(info.value)
    assert "policy.datasets.people.limit.epsilon: stored 2.0, given 20.0" in text
    assert "policy.datasets.people.analysts.alice.limit.epsilon: stored 1.0, given 10.0" in text
    Accountant.from_policy(original, ledger=url).close()  # the same limits: fine, nothing written
    assert [r["kind"] for r in _records(url)] == ["policy"]


def test_open_enforces_the_analyst_limits_it_finds(tmp_path: Path) -> None:
    url = _url(tmp_path)
    p = tmp_path / "p.toml"
    p.write_text(POLICY)
    Accountant.from_policy(p, ledger=url).close()
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.9, sensitivity=1.0), 1.0, dataset="people", analyst="alice")
        with pytest.raises(BudgetExceededError) as info:
            acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset="people", analyst="alice")
        assert info.value.account == "dataset:people/analyst:alice"


def test_apply_policy_is_one_audited_record_and_says_when_it_weakens(tmp_path: Path,
                                                                     monkeypatch) -> None:
    url = _url(tmp_path)
    p = tmp_path / "p.toml"
    p.write_text(POLICY)
    monkeypatch.setenv("DPBUDGET_ACTOR", "owner")
    with Accountant.from_policy(p, ledger=url, owner_key=OWNER) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people", analyst="alice")
        lower = tmp_path / "lower.toml"
        lower.write_text(POLICY.replace("epsilon = 1.0", "epsilon = 0.6"))
        change = acc.apply_policy(lower, by="carol", reason="alice's quota cut", owner_key=OWNER)
        assert change.raised == []
        assert change.changes == [
            "policy.datasets.people.analysts.alice.limit.epsilon: stored 1.0, given 0.6"]
        with pytest.raises(BudgetExceededError):
            acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset="people", analyst="alice")
        higher = tmp_path / "higher.toml"
        higher.write_text(POLICY.replace("epsilon = 2.0", "epsilon = 3.0"))
        change = acc.apply_policy(higher, by="carol", reason="more queries", owner_key=OWNER)
        assert change.raised == ["policy.datasets.people.analysts.alice.limit.epsilon: 0.6 -> 1.0",
                                 "policy.datasets.people.limit.epsilon: 2.0 -> 3.0"]
    kinds = [(r["kind"], r.get("by"), r.get("reason")) for r in _records(url)]
    assert kinds == [("policy", "owner", "created"), ("release", None, None),
                     ("policy", "carol", "alice's quota cut"), ("policy", "carol", "more queries")]
    assert audit(url).ok
    with Accountant.open(url) as again:
        assert again.remaining("people") == Budget(2.5)


def test_policy_apply_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _url(tmp_path)
    p = tmp_path / "p.toml"
    p.write_text(POLICY)
    key = tmp_path / "owner.pem"
    new_key_file(key)
    Accountant.from_policy(p, ledger=url, owner_key=key).close()
    higher = tmp_path / "higher.toml"
    higher.write_text(POLICY.replace("epsilon = 2.0", "epsilon = 3.0"))
    assert cli(["policy", "apply", str(higher), url, "--reason", "more", "--by", "dana",
                "--owner-key", str(key)]) == 0
    out = capsys.readouterr().out
    assert "policy record 2 written, 1 change(s)" in out
    assert "WARNING" in out and "policy.datasets.people.limit.epsilon: 2.0 -> 3.0" in out
    with pytest.raises(SystemExit):  # --reason is required
        cli(["policy", "apply", str(higher), url])
    assert _records(url)[-1]["by"] == "dana"


def test_audit_without_policy_catches_a_release_above_the_limit_in_force(tmp_path: Path) -> None:
    """A writer that skips the stored-policy check (an old version, or code that builds a gate
    by hand) records releases under a limit of 100; the chain is intact, and each record carries
    its own (forged) limit, but the audit holds spend to the policy record in force."""
    url = _url(tmp_path)
    Accountant(Budget(1.0), ledger=url).close()
    with open_ledger(url) as ledger:
        forged = Policy.model_construct(datasets={})
        gate = Gate(ledger, Planner(forged, DatasetLimit(limit=Budget(100.0))), Sampler(0))
        gate._check_policy = lambda pointer: None  # type: ignore[method-assign]  # (old version)
        for _ in range(3):
            gate.release(Laplace(0.5, sensitivity=1.0), 1.0, None, ("people", None))
    report = audit(url)
    assert not report.ok and report.exit_status & EXIT_BITS["limit"]
    assert any("over the limit in force" in p.message and p.seq == 4 for p in report.problems)


def test_an_edited_stored_policy_is_refused_not_enforced(tmp_path: Path) -> None:
    url = _url(tmp_path)
    Accountant(Budget(1.0), ledger=url).close()
    with sqlite3.connect(tmp_path / "shared.db") as conn:
        conn.execute("DROP TRIGGER entries_append_only_u")
        text = conn.execute("SELECT record FROM entries WHERE seq = 1").fetchone()[0]
        assert '"epsilon":1.0' in text
        conn.execute("UPDATE entries SET record = ? WHERE seq = 1",
                     (text.replace('"epsilon":1.0', '"epsilon":1000.0'),))
    with pytest.raises(LedgerCorruptedError, match="stored policy cannot be trusted"):
        Accountant.open(url)
    with pytest.raises(LedgerCorruptedError):
        Accountant(Budget(1000.0), ledger=url)
    assert audit(url).exit_status & EXIT_BITS["chain"]


def test_two_processes_creating_a_ledger_write_one_policy_record(tmp_path: Path) -> None:
    """Four accountants opening a new (empty) ledger at once: the read, compare and append are
    one transaction, so exactly one policy record is written."""
    url = _url(tmp_path)
    open_ledger(url).close()
    errors: list[BaseException] = []

    def create() -> None:
        try:
            Accountant(Budget(1.0), ledger=url).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [r["kind"] for r in _records(url)] == ["policy"]


def test_a_ledger_from_before_stored_policies_adopts_the_first_one_given(tmp_path: Path) -> None:
    old = MemoryLedger()  # in-memory ledgers store no policy (nobody else can open them)
    acc = Accountant(Budget(1.0), ledger=old)
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    assert [e.record["kind"] for e in old.entries()] == ["release"]
    export_jsonl(old, tmp_path / "old.jsonl")
    url = _url(tmp_path)
    with open_ledger(url) as target:
        import_jsonl(tmp_path / "old.jsonl", target)
    with pytest.raises(LedgerError, match="stores no policy"):
        Accountant.open(url)
    Accountant(Budget(1.0), ledger=url).close()
    last = _records(url)[-1]
    assert last["kind"] == "policy" and last["reason"].startswith("adopted")
    with Accountant.open(url) as acc:
        assert acc.spent() == Budget(0.25)
    with open_ledger(url) as ledger:
        assert assert_chain(ledger) == 1


def test_a_keyed_ledger_authenticates_its_policy_record(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", "s3cret")
    url = _url(tmp_path)
    Accountant(Budget(1.0), ledger=url).close()
    (first,) = _records(url)
    assert first["auth"] == "hmac-sha256"
    assert Accountant.open(url).remaining() == Budget(1.0)
    monkeypatch.delenv("DPBUDGET_LEDGER_KEY")
    with pytest.raises(LedgerCorruptedError):  # without the key it cannot be verified
        Accountant.open(url)


def test_the_stored_policy_shows_no_data(tmp_path: Path) -> None:
    url = _url(tmp_path)
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(0.25, sensitivity=1.0), 123456.789, dataset="people")
    text = json.dumps(_records(url)[0])
    assert "123456" not in text


def test_a_deleted_policy_pointer_does_not_let_the_next_opener_adopt_its_limits(
        tmp_path: Path) -> None:
    url = _url(tmp_path)
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    with sqlite3.connect(tmp_path / "shared.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        table = "accounts" if "accounts" in tables else tables[0]
        conn.execute(f"DELETE FROM {table} WHERE key = 'policy'")
    before = _records(url)
    with pytest.raises(LedgerCorruptedError, match="pointer to its policy is missing|deleted"):
        Accountant(Budget(100.0), ledger=url)
    assert _records(url) == before


@pytest.mark.parametrize("twin", ["People", "PEOPLE", "people ", " people", "peo ple",
                                  "people\t", "people\u200b", "people.", "people-", "people_",
                                  "peo-ple", "PEOPLE..", "_people"])
def test_one_table_gets_one_default_budget_not_three(twin: str, tmp_path: Path) -> None:
    """Under a default limit, a variant of a dataset's name is refused (before anything is
    drawn or debited), in this process and in the next one that opens the ledger."""
    url = _url(tmp_path)
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
        with pytest.raises(InvalidArgumentError) as info:
            acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset=twin)
        assert info.value.argument == "dataset"
        assert acc.spent(dataset="people") == Budget(1.0)
    with Accountant.open(url) as again:
        with pytest.raises(InvalidArgumentError):
            again.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset=twin)
        assert [a.key for a in again.ledger.accounts()] == ["dataset:people", "policy"]


def test_declared_datasets_keep_their_names() -> None:
    """Names given as explicit limits are not held to the default's syntax."""
    acc = Accountant(limits={"sales 2026": Budget(1.0)}, rng=0)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="sales 2026")
    with pytest.raises(UnknownDatasetError):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="Sales 2026")
