"""Attacks on the stored policy found by an independent review, each turned into a test: an
accountant that opened before the policy was lowered, a ledger from before stored policies
adopting higher limits, a policy change that grants more without saying so, a malformed policy
that would brick the ledger, a mistyped ledger path, an in-memory ledger with a policy record,
data passed where a name belongs."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    LedgerConflictError,
    PolicyChangedError,
)
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    LedgerError,
    PolicyError,
    UnknownDatasetError,
)
from dpbudget.accountant.gate.gate import Gate
from dpbudget.accountant.ledger import MemoryLedger, open_ledger
from dpbudget.accountant.gate.planner import Planner
from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
from dpbudget.mechanisms import DiscreteLaplace, Laplace
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy
from dpbudget.policies.stored import raised
from dpbudget.accountant.gate.owner_key import new_key_file
from tests.support import OWNER

CANARY = 4_918_273.5


def _policy(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'l.db'}"


def test_an_accountant_opened_before_a_lowered_policy_is_refused(tmp_path: Path) -> None:
    url = _url(tmp_path)
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
    url = _url(tmp_path)
    acc = Accountant(Budget(2.0), ledger=url, owner_key=OWNER)
    acc.apply_policy(Policy.model_validate({"datasets": {"people": {"limit": {"epsilon": 1.0}}}}),
                     by="owner", reason="declare it", owner_key=OWNER)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people")
    assert acc.remaining("people") == Budget(0.5)
    acc.close()


def test_a_ledger_without_a_policy_record_does_not_adopt_higher_limits(tmp_path: Path) -> None:
    memory = Accountant(Budget(1.0))  # an in-memory ledger stores no policy record
    memory.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people")
    jsonl = tmp_path / "old.jsonl"
    export_jsonl(memory.ledger, jsonl)
    url = _url(tmp_path)
    with open_ledger(url) as ledger:
        import_jsonl(jsonl, ledger)
    with pytest.raises(LedgerConflictError, match="policy apply"):
        Accountant(Budget(100.0), ledger=url)
    with Accountant(Budget(1.0), ledger=url) as same:  # the recorded limits are adopted
        assert same.remaining("people") == Budget(0.0)
    assert audit(url).ok


def test_raising_explicitly_records_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _url(tmp_path)
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
    url = _url(tmp_path)
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


def load_policy_text(text: str) -> Policy:
    import tomllib

    return Policy.model_validate(tomllib.loads(text))


@pytest.mark.parametrize("where", ["dataset", "analyst", "label"])
def test_data_passed_as_a_name_is_described_never_shown(where: str) -> None:
    acc = Accountant(Budget(1.0))
    with pytest.raises(InvalidTypeError) as info:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, **{where: CANARY})
    assert str(CANARY) not in str(info.value) and str(CANARY) not in repr(info.value)
    assert "a float" in str(info.value)


def test_the_audit_reports_a_policy_pointer_rolled_back(tmp_path: Path) -> None:
    url = _url(tmp_path)
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
    url = _url(tmp_path)
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
    url = _url(tmp_path)
    with _stale_gate(url) as stale:
        stale.release(mechanism, 1, None, (dataset, analyst))
    report = audit(url)
    assert report.exit_status & EXIT_BITS["limit"]
    assert any("refuses it" in p.message and why in p.message for p in report.problems), \
        report.problems


def test_the_audit_passes_releases_the_policy_in_force_admits(tmp_path: Path) -> None:
    url = _url(tmp_path)
    Accountant.from_policy(load_policy_text(IN_FORCE), ledger=url).close()
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="people", analyst="alice")
        with acc.pipeline("p", dataset="people", analyst="alice", budget=Budget(2.0)) as p:
            p.release(Laplace(0.5, sensitivity=1.0), 1.0)  # inside: paid by the allocation
    assert audit(url).ok


def test_status_reports_against_the_policy_in_force(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import json

    url = _url(tmp_path)
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

    url = _url(tmp_path)
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
    url = _url(tmp_path)
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
    url = _url(tmp_path)
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
    url = _url(tmp_path)
    with _stale_gate(url) as stale:
        stale.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(1.0, sensitivity=1.0), 1.0)], None, ("people", "alice"))
    report = audit(url)
    assert any("max_per_query" in p.message for p in report.problems), report.problems
    with Accountant.open(url) as acc:  # the gate refuses the same batch
        with pytest.raises(BudgetExceededError):
            acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(1.0, sensitivity=1.0), 1.0)], dataset="people",
                             analyst="alice")
