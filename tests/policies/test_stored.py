"""The policy in force lives in the ledger (``policies.stored``, issue 11): the attacks of a second
analyst who opens a shared ledger with limits of their own, and what the owner and the auditor
see; the attacks an independent review found; policy changes against an existing ledger."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, LedgerConflictError, PolicyChangedError,
)
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.audit.status import budget_rows
from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.gate.gate import Gate
from dpbudget.accountant.gate.owner_key import new_key_file
from dpbudget.accountant.gate.planner import Planner
from dpbudget.accountant.ledger import MemoryLedger, open_ledger
from dpbudget.accountant.values.errors import (
    InvalidArgumentError, InvalidTypeError, LedgerCorruptedError, LedgerError, PolicyError,
    UnknownDatasetError,
)
from dpbudget.mechanisms import DiscreteLaplace, Laplace
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.policies import load_policy
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy
from dpbudget.policies.stored import raised
from tests.support import (OWNER, assert_chain, errors_in_threads, import_one_release,
                           load_policy_text)

from conftest import RNGS

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
    assert not errors_in_threads(lambda: Accountant(Budget(1.0), ledger=url).close(), 4)
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


# -- attacks on the stored policy found by an independent review, each turned into a test

CANARY = 4_918_273.5


def _policy(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'l.db'}"


def test_an_accountant_opened_before_a_lowered_policy_is_refused(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    p10 = _policy(tmp_path, "p10.toml", "[datasets.people]\nlimit = { epsilon = 10.0 }\n")
    p1 = _policy(tmp_path, "p1.toml", "[datasets.people]\nlimit = { epsilon = 1.0 }\n")
    stale = Accountant.from_policy(p10, ledger=url, owner_key=OWNER)
    stale.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people")
    with Accountant.open(url) as owner:
        owner.apply_policy(p1, by="owner", reason="lower it", owner_key=OWNER)
    before = audit(url).records
    with pytest.raises(PolicyChangedError, match="Accountant.open"):
        stale.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
    assert audit(url).records == before  # nothing debited
    with pytest.raises(PolicyChangedError):
        with stale.pipeline("p", dataset="people", budget=Budget(0.1)):
            pass
    stale.close()
    with Accountant.open(url) as fresh:  # the policy in force: 0.5 of 1.0 left
        assert fresh.remaining("people") == Budget(0.5)
        fresh.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people")
    assert audit(url).ok


def test_apply_policy_keeps_its_own_accountant_current(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    acc = Accountant(Budget(2.0), ledger=url, owner_key=OWNER)
    acc.apply_policy(Policy.model_validate({"datasets": {"people": {"limit": {"epsilon": 1.0}}}}),
                     by="owner", reason="declare it", owner_key=OWNER)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people")
    assert acc.remaining("people") == Budget(0.5)
    acc.close()


def test_a_ledger_without_a_policy_record_does_not_adopt_higher_limits(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    import_one_release(url, tmp_path, 1.0)  # an in-memory ledger stores no policy record
    with pytest.raises(LedgerConflictError, match="policy apply"):
        Accountant(Budget(100.0), ledger=url)
    with Accountant(Budget(1.0), ledger=url) as same:  # the recorded limits are adopted
        assert same.remaining("people") == Budget(0.0)
    assert audit(url).ok


def test_raising_explicitly_records_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _ledger_url(tmp_path)
    key = tmp_path / "owner.pem"
    new_key_file(key)
    Accountant.from_policy(_policy(tmp_path, "a.toml", "[datasets.people]\nlimit = "
                                   "{ epsilon = 1.0 }\n"), ledger=url, owner_key=key).close()
    bigger = _policy(tmp_path, "b.toml", "[datasets.people]\nlimit = { epsilon = 3.0 }\n"
                     'composition = "advanced"\n')
    assert cli(["policy", "apply", str(bigger), url, "--reason", "more", "--by", "o",
                "--owner-key", str(key)]) == 0
    out = capsys.readouterr().out
    assert "WARNING" in out and "epsilon: 1.0 -> 3.0" in out and "another rule" in out


@pytest.mark.parametrize(("old", "new", "expected"), [
    ({"composition": "basic"}, {"composition": "advanced"}, "composition"),
    ({"period": None}, {"period": "1h"}, "period"),
    ({"analysts": {"alice": {"limit": {"epsilon": 0.5}}}}, {"analysts": {}}, "alice: removed"),
    ({"per_query": {"epsilon": 0.1}}, {"per_query": None}, "per_query: removed"),
])
def test_raised_names_every_change_that_can_grant_more(old, new, expected) -> None:
    def doc(limit: dict) -> dict:  # (raised compares documents: policies.stored.document)
        return {"policy": {"datasets": {"d": limit}}, "default": None}

    assert any(expected in line for line in raised(doc(old), doc(new)))


def test_removing_the_default_grants_less() -> None:
    assert raised({"default": {"limit": {"epsilon": 5.0}}}, {"default": None}) == []


def test_a_policy_that_would_not_read_back_is_never_written(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    acc = Accountant(Budget(1.0), ledger=url)
    broken = Policy.model_construct(datasets={"people": DatasetLimit()}, analysts={},
                                    other_analysts="maybe", limit=None)
    before = audit(url).records
    # A Policy object is checked again as a file is (policies.policy.validated), before the
    # round trip that would have caught it when writing.
    with pytest.raises(PolicyError, match="^other_analysts: must be 'allow' or 'deny'"):
        acc.apply_policy(broken, by="o", reason="r", owner_key=OWNER)
    assert audit(url).records == before
    acc.close()
    Accountant.open(url).close()  # still opens


def test_policy_apply_on_a_mistyped_ledger_creates_nothing(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "p.toml", "[datasets.people]\nlimit = { epsilon = 1.0 }\n")
    typo = tmp_path / "typo.db"
    assert cli(["policy", "apply", str(policy), str(typo), "--reason", "r"]) == 2
    assert not typo.exists()


def test_a_memory_ledger_with_a_policy_record_is_held_to_it() -> None:
    ledger = MemoryLedger()
    owner = Accountant(Budget(100.0), ledger=ledger, owner_key=OWNER)
    owner.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                       by="o", reason="declare it", owner_key=OWNER)
    with pytest.raises(LedgerConflictError):
        Accountant(Budget(100.0), ledger=ledger)
    other = Accountant.open(ledger)
    owner.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 0.5 }\n"),
                       by="o", reason="lower it", owner_key=OWNER)
    with pytest.raises(PolicyChangedError):
        other.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="people")


@pytest.mark.parametrize("where", ["dataset", "analyst", "label"])
def test_data_passed_as_a_name_is_described_never_shown(where: str) -> None:
    acc = Accountant(Budget(1.0))
    with pytest.raises(InvalidTypeError) as info:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, **{where: CANARY})
    assert str(CANARY) not in str(info.value) and str(CANARY) not in repr(info.value)
    assert "a float" in str(info.value)


def test_the_audit_reports_a_policy_pointer_rolled_back(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    path = tmp_path / "l.db"
    with Accountant(Budget(10.0), ledger=url, owner_key=OWNER) as acc:
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                         by="o", reason="lower", owner_key=OWNER)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = 1 WHERE key = 'policy'")
    report = audit(url)
    assert not report.ok
    assert any("policy" in p.message and "latest" in p.message for p in report.problems)


def test_opening_a_ledger_whose_path_is_mistyped_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LedgerError):
        Accountant.open(f"sqlite:///{tmp_path / 'nothing-here.db'}")
    assert not (tmp_path / "nothing-here.db").exists()


def test_case_only_twins_are_refused_across_accountants_open_at_once(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    a = Accountant(Budget(1.0), ledger=url)
    b = Accountant(Budget(1.0), ledger=url)  # opened before "people" was charged
    a.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
    before = audit(url).records
    with pytest.raises(InvalidArgumentError, match="variant"):
        b.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="People")
    assert audit(url).records == before
    assert not b.can_afford(Laplace(1.0, sensitivity=1.0), dataset="people")
    a.close()
    b.close()


STALE = """
[datasets.people]
limit = { epsilon = 10.0 }
[datasets.secret]
limit = { epsilon = 10.0 }
"""
IN_FORCE = """
[datasets.people]
limit = { epsilon = 10.0 }
max_per_query = { epsilon = 0.5 }
allowed_mechanisms = ["Laplace"]
other_analysts = "deny"
[datasets.people.analysts.alice]
limit = { epsilon = 5.0 }
"""


@contextlib.contextmanager
def _stale_gate(url: str) -> Iterator[Gate]:
    """A ledger created under STALE whose owner then applied IN_FORCE, and a gate of an older
    version (no policy check in its debit) still planning under STALE."""
    stale_policy = load_policy_text(STALE)
    Accountant.from_policy(stale_policy, ledger=url, owner_key=OWNER).close()
    with Accountant.open(url) as owner:
        owner.apply_policy(load_policy_text(IN_FORCE), by="o", reason="tighten", owner_key=OWNER)
    with open_ledger(url) as ledger:
        stale = Gate(ledger, Planner(stale_policy, None), Sampler(0))
        stale._check_policy = lambda pointer: None  # type: ignore[method-assign]
        yield stale


@pytest.mark.parametrize(("dataset", "analyst", "mechanism", "why"), [
    ("secret", None, Laplace(0.1, sensitivity=1.0), "secret"),                          # no longer declared
    ("people", "mallory", Laplace(0.1, sensitivity=1.0), "other_analysts"),            # analyst denied
    ("people", "alice", Laplace(1.0, sensitivity=1.0), "max_per_query"),               # above the cap
    ("people", "alice", DiscreteLaplace(0.1, sensitivity=1), "allowed_mechanisms"),
])
def test_the_audit_holds_a_stale_writers_release_to_the_policy_in_force(
        tmp_path: Path, dataset, analyst, mechanism, why) -> None:
    url = _ledger_url(tmp_path)
    with _stale_gate(url) as stale:
        stale.release(mechanism, 1, None, (dataset, analyst))
    report = audit(url)
    assert report.exit_status & EXIT_BITS["limit"]
    assert any("refuses it" in p.message and why in p.message for p in report.problems), \
        report.problems


def test_the_audit_passes_releases_the_policy_in_force_admits(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    Accountant.from_policy(load_policy_text(IN_FORCE), ledger=url).close()
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people", analyst="alice")
        with acc.pipeline("p", dataset="people", analyst="alice", budget=Budget(2.0)) as p:
            p.release(Laplace(0.5, sensitivity=1.0), 1.0)  # inside: paid by the allocation
    assert audit(url).ok


def test_status_reports_against_the_policy_in_force(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import json

    url = _ledger_url(tmp_path)
    with Accountant(Budget(10.0), ledger=url, owner_key=OWNER) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people")
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 0.4 }\n"),
                         by="o", reason="lower it below the spend", owner_key=OWNER)
    capsys.readouterr()
    assert cli(["status", url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["accounts"]
    assert out["policy"] == "the policy stored in the ledger"
    assert row["limit"]["epsilon"] == 0.4 and row["over_limit"] is True
    assert cli(["status", url]) == 0
    assert "refuse every release: dataset:people" in capsys.readouterr().out


def test_status_applies_a_stored_default_limit(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import json

    url = _ledger_url(tmp_path)
    with Accountant(Budget(2.0), ledger=url) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="sales")
    capsys.readouterr()
    assert cli(["status", url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["accounts"]
    assert row["limit"]["epsilon"] == 2.0 and row["over_limit"] is False
    # "sales" is not listed (Accountant(limit) lists none): charged under the default limit
    assert row["new_dataset"] is True and row["note"].startswith("new dataset")


OTHER = """
[datasets.people]
limit = { epsilon = 2.0 }
[other_datasets]
limit = { epsilon = 0.5 }
"""


def test_a_policy_file_admits_new_datasets_only_through_other_datasets(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    closed = _policy(tmp_path, "closed.toml", "[datasets.people]\nlimit = { epsilon = 2.0 }\n")
    with Accountant.from_policy(closed, ledger=f"sqlite:///{tmp_path / 'c.db'}") as acc:
        with pytest.raises(UnknownDatasetError):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="sales")
    with Accountant.from_policy(_policy(tmp_path, "open.toml", OTHER), ledger=url) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="sales")   # a budget of its own: 0.5
        assert acc.remaining("sales") == Budget(0.0)
        with pytest.raises(InvalidArgumentError, match="variant"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="Sales")
    with Accountant.open(url) as again:                     # the stored policy keeps it
        assert again.remaining("orders") == Budget(0.5)
    report = audit(url)
    assert report.ok and set(report.by_dataset) == {"sales"}


def test_a_document_written_before_a_member_existed_still_matches() -> None:
    from dpbudget.policies.stored import differences

    assert differences({"policy": {"limit": None}}, {"policy": {"limit": None,
                                                                "other_datasets": None}}) == []
    assert differences({"policy": {}}, {"policy": {"other_datasets": {"limit": 1}}}) != []


def test_a_policy_applied_to_a_shared_memory_ledger_stops_the_other_accountant() -> None:
    ledger = MemoryLedger()
    a = Accountant(Budget(10.0), ledger=ledger)
    # a records no policy (in memory, no owner key); b, with one, records its first policy
    b = Accountant(Budget(10.0), ledger=ledger, owner_key=OWNER)
    b.apply_policy(load_policy_text("[datasets.default]\nlimit = { epsilon = 1.0 }\n"),
                   by="o", reason="r", owner_key=OWNER)
    with pytest.raises(PolicyChangedError):
        a.release(Laplace(2.0, sensitivity=1.0), 1.0)
    assert audit(ledger).records == 2  # the policy records only


def test_reads_of_what_is_left_say_the_policy_changed(tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    stale = Accountant(Budget(10.0), ledger=url, owner_key=OWNER)
    with Accountant.open(url) as owner:
        owner.apply_policy(load_policy_text("[datasets.default]\nlimit = { epsilon = 1.0 }\n"),
                           by="o", reason="r", owner_key=OWNER)
    for read in (lambda: stale.remaining(), lambda: stale.spent(),
                 lambda: stale.can_afford(Laplace(0.5, sensitivity=1.0)), lambda: stale.max_releases(Laplace(0.5, sensitivity=1.0))):
        with pytest.raises(PolicyChangedError):
            read()
    stale.close()


def test_the_audit_checks_each_item_of_a_stale_writers_batch_against_the_cap(
        tmp_path: Path) -> None:
    url = _ledger_url(tmp_path)
    with _stale_gate(url) as stale:
        stale.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(1.0, sensitivity=1.0), 1.0)], None, ("people", "alice"))
    report = audit(url)
    assert any("max_per_query" in p.message for p in report.problems), report.problems
    with Accountant.open(url) as acc:  # the gate refuses the same batch
        with pytest.raises(BudgetExceededError):
            acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(1.0, sensitivity=1.0), 1.0)], dataset="people",
                             analyst="alice")


# -- policy changes against an existing ledger: lowering a limit below its spend is allowed but
# the account then refuses everything; changing a rule is refused

ORIGINAL = """
    limit = { epsilon = 5.0 }
    [datasets.adult]
    limit = { epsilon = 2.0 }
    [datasets.adult.analysts.alice]
    limit = { epsilon = 1.0 }
    [analysts.bob]
    limit = { epsilon = 1.0 }
"""


@pytest.fixture
def used(write, tmp_path):
    """An SQLite ledger on which alice spent 0.8 and bob 0.2 on adult under ORIGINAL."""
    db = tmp_path / "budget.db"
    with Accountant.from_policy(write(ORIGINAL), ledger=db, rng=0, simulation=True,
                                owner_key=OWNER) as acc:
        acc.release(Laplace(0.8, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
        acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset="adult", analyst="bob")
    return db


def test_lowering_a_limit_below_spend_refuses_everything(write, used, untouched):
    lowered = write(ORIGINAL.replace("limit = { epsilon = 2.0 }", "limit = { epsilon = 0.5 }"))
    rng = np.random.default_rng(0)
    with pytest.raises(LedgerConflictError, match="datasets.adult.limit.epsilon: stored 2.0"):
        Accountant.from_policy(lowered, ledger=used, rng=rng,
                               simulation=True)  # other limits: refused
    acc = Accountant.open(used, rng=rng, simulation=True)
    change = acc.apply_policy(lowered, by="test", reason="lower adult", owner_key=OWNER)
    assert change.raised == [] and change.changes
    RNGS[id(acc)] = rng
    assert acc.remaining("adult") == Budget(0.0)
    for who in ("alice", "bob", "carol", None):
        with untouched(acc), pytest.raises(BudgetExceededError) as info:
            acc.release(Laplace(1e-6, sensitivity=1.0), 1.0, dataset="adult", analyst=who)
        assert info.value.account == "dataset:adult"
    rows = {r["account"]: r for r in budget_rows(acc.ledger, load_policy(lowered))}
    assert rows["dataset:adult"]["over_limit"] and "OVER LIMIT" in rows["dataset:adult"]["note"]
    assert rows["dataset:adult"]["limit"] == {"epsilon": 0.5, "delta": 0.0}
    assert not rows["dataset:adult/analyst:alice"]["over_limit"]
    acc.close()


def test_lowering_an_analyst_limit(write, used):
    alice = "[datasets.adult.analysts.alice]\n    limit = { epsilon = "
    lowered = write(ORIGINAL.replace(alice + "1.0 }", alice + "0.5 }"))
    with Accountant.open(used, rng=0, simulation=True) as acc:
        acc.apply_policy(lowered, by="test", reason="lower alice", owner_key=OWNER)
        with pytest.raises(BudgetExceededError) as info:
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
        assert info.value.account == "dataset:adult/analyst:alice"
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult", analyst="bob")


def test_raising_a_limit_resumes_from_the_recorded_spend(write, used):
    raised = write(ORIGINAL.replace("limit = { epsilon = 2.0 }", "limit = { epsilon = 3.0 }"))
    with Accountant.open(used, rng=0, simulation=True) as acc:
        change = acc.apply_policy(raised, by="test", reason="raise adult", owner_key=OWNER)
        assert change.raised == ["policy.datasets.adult.limit.epsilon: 2.0 -> 3.0"]
        assert acc.spent("adult").epsilon == pytest.approx(1.0)
        assert acc.remaining("adult").epsilon == pytest.approx(2.0)


@pytest.mark.parametrize("table", [
    "[datasets.adult]",
    "[datasets.adult.analysts.alice]",
    "[analysts.bob]",
    None,  # the global limit
])
def test_a_different_rule_is_a_conflict_for_every_kind_of_account(write, used, other_rule,
                                                                   table):
    text = ORIGINAL
    if table is None:
        bob = "[analysts.bob]\n    limit = { epsilon = 1.0 }"
        # only the global rule changes: bob keeps "basic" explicitly
        text = 'composition = "other"\n' + text.replace(bob, bob + '\n    composition = "basic"')
    else:
        text = text.replace(table, f'{table}\n    composition = "other"')
    with pytest.raises(LedgerConflictError, match="rule cannot change"):
        Accountant.from_policy(write(text), ledger=used)


def test_plain_accountant_also_checks_windowed_and_declared_accounts(used, other_rule):
    with pytest.raises(LedgerConflictError):
        Accountant(limits={"adult": Budget(2.0)}, composition="other", ledger=used)
