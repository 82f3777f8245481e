"""The audit holds each record to the accounts the gate's plan charges (issue 28 review).

The attack the review measured on SQLite: a record written by hand that names alice but charges
bob's quota (``dataset:adult/analyst:bob``). Bob can no longer release, alice's quota is
untouched, and the audit passed it (exit 0): it checked blocks, caps and allowed mechanisms
against the policy in force, never which accounts were charged. The same gap let alice leave out
her own quota. Now a record whose accounts are not those of its plan — for its dataset(s),
analyst and blocks under the policy in force — is a ``limit`` problem. On PostgreSQL the server
refuses the first attack itself (tests/ledger/postgres/test_ledger.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dpbudget.accountant.audit.policy as audit_policy
from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.findings import EXIT_BITS
from dpbudget.accountant.composition import rule_from_config
from dpbudget.accountant.ledger import Account
from dpbudget.accountant.ledger.record import AccountLayout, assemble, canonical
from dpbudget.mechanisms import AboveThreshold, Laplace
from dpbudget.policies.policy import Policy
from dpbudget.accountant import Accountant
from dpbudget.accountant.audit.status import budget_table
from dpbudget.accountant.audit.text import audit_text
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.gate.bounded import UnitBounds, release_bounded
from dpbudget.mechanisms import Laplace
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.units import per_account

ALICE, BOB = "dataset:adult/analyst:alice", "dataset:adult/analyst:bob"
# What the ledger adds to a record's members (``Transaction.append``): not copied.
_LEDGER_MEMBERS = {"v", "seq", "prev", "table", "links", "reads", "time", "auth", "writer"}


def _policy() -> Policy:
    """A dataset of ε = 1, alice's and bob's quotas of 0.3 on it, and alice's 0.5 a day
    everywhere (a windowed account)."""
    return Policy.model_validate({
        "datasets": {"adult": {"limit": {"epsilon": 1.0}, "analysts": {
            "alice": {"limit": {"epsilon": 0.3}}, "bob": {"limit": {"epsilon": 0.3}}}}},
        "analysts": {"alice": {"limit": {"epsilon": 0.5}, "period": "1d"}}})


def _forge(acc: Accountant, keys: list[str]) -> None:
    """Append, by hand, a copy of alice's first release (its analyst, dataset, mechanism, cost)
    charged to ``keys`` instead: each debited by its cost under the rule of the genuine
    record's account of the same kind (the dataset's, or a per-analyst one)."""
    entries = [json.loads(e.text) for e in acc.ledger.entries()]
    genuine = next(r for r in entries if r.get("kind") == "release")
    assert genuine["analyst"] == "alice" and ALICE in genuine["accounts"]
    configs = {k: {m: v for m, v in a.items() if m != "state"}
               for k, a in genuine["accounts"].items()}
    charge = Laplace(0.1, sensitivity=1.0).charge
    assert genuine["cost"]["epsilon"] == pytest.approx(0.1)
    with acc.ledger.transaction() as tx:
        accounts, members = [], {}
        for key in keys:
            rule = rule_from_config(configs["dataset:adult" if key == "dataset:adult" else ALICE])
            current = tx.account(key)
            state = rule.debit(rule.initial_state() if current is None else current.state,
                               charge)
            accounts.append(Account(key, rule.name, rule.describe(), state, 0))
            members[key] = AccountLayout(rule.describe()).text(state)
        fields: dict[str, Any] = {m: canonical(v) for m, v in genuine.items()
                                  if m not in _LEDGER_MEMBERS and m != "accounts"}
        tx.append({**fields, "accounts": assemble(members)}, accounts)


def _ledger(tmp_path: Path) -> Accountant:
    """An SQLite ledger under ``_policy`` with one genuine release by alice (ε = 0.1)."""
    acc = Accountant.from_policy(_policy(), ledger=f"sqlite:///{tmp_path / 'l.db'}")
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    return acc


def _charged_problems(report: Any) -> list[str]:
    return [p.message for p in report.problems
            if p.kind == "limit" and "charged other accounts than its plan" in p.message]


def test_a_record_naming_alice_that_charges_bobs_quota_is_flagged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _ledger(tmp_path) as acc:
        assert audit(acc.ledger).ok  # negative control: the genuine record audits clean
        for _ in range(3):  # bob's whole quota, under alice's name
            _forge(acc, ["dataset:adult", BOB])
        # The attack's effect: bob can no longer release; alice's quotas are untouched.
        with pytest.raises(BudgetExceededError):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst="bob")
        assert acc.remaining("adult", analyst="alice").epsilon == pytest.approx(0.2)
        report = audit(acc.ledger)
        assert report.exit_status & EXIT_BITS["limit"]
        flagged = _charged_problems(report)
        assert len(flagged) == 3, report.problems
        assert f"missing ['analyst:alice@…+1d', '{ALICE}'], extra ['{BOB}']" in flagged[0]
        # Negative control: the audit as it was (no such check) passes the same ledger.
        monkeypatch.setattr(audit_policy, "charged", lambda accounts, plan: None)
        old = audit(acc.ledger)
        assert old.ok and old.exit_status == 0, old.problems


@pytest.mark.parametrize("omitted", [ALICE, "analyst:alice"])
def test_a_record_that_skips_alices_own_quota_is_flagged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, omitted: str) -> None:
    with _ledger(tmp_path) as acc:
        genuine = json.loads(list(acc.ledger.entries())[-1].text)["accounts"]
        kept = [k for k in genuine if not k.startswith(omitted)]
        assert len(kept) == len(genuine) - 1
        _forge(acc, kept)
        report = audit(acc.ledger)
        assert report.exit_status & EXIT_BITS["limit"]
        (flagged,) = _charged_problems(report)
        assert "missing [" in flagged and omitted in flagged and "extra []" in flagged
        monkeypatch.setattr(audit_policy, "charged", lambda accounts, plan: None)
        assert audit(acc.ledger).ok  # the old audit: passed


def test_honest_records_of_every_kind_audit_clean(tmp_path: Path) -> None:
    """Negative control: releases, a batch, a session, a pipeline and one opened inside it (each
    charged to its parent's account only), with windowed and per-analyst accounts."""
    with _ledger(tmp_path) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")  # no analyst: the dataset's only
        acc.release_many([(Laplace(0.01, sensitivity=1.0), 1.0), (Laplace(0.01, sensitivity=1.0), 2.0)], dataset="adult",
                         analyst="bob")
        with acc.session(AboveThreshold(0.05, threshold=10.0, sensitivity=1.0), dataset="adult", analyst="alice") as svt:
            svt.test(1.0)
        with acc.pipeline("p", dataset="adult", analyst="alice", budget=Budget(0.1)) as p:
            p.release(Laplace(0.01, sensitivity=1.0), 1.0)
            with p.pipeline("q", budget=Budget(0.02)) as q:
                q.release(Laplace(0.01, sensitivity=1.0), 1.0)
        kinds = {json.loads(e.text).get("kind") for e in acc.ledger.entries()}
        assert {"release", "session", "pipeline"} <= kinds
        report = audit(acc.ledger)
        assert report.ok, [p.message for p in report.problems]


# ------------------------------------------------------------------------------------------------
# The audit holds releases on a dataset with a privacy unit to it (issue 33).
#
# The attack: whoever can write the ledger (a writer role, an old or patched library) appends a
# release on a dataset whose policy declares ``privacy_unit = "person_id"`` that is not per that
# unit — a raw value (no ``unit``, no ``bounds``), a table query per another column, or one that
# names the unit without the bounds its sensitivity came from. Its chain is intact and its cost
# fits, so only the policy can tell: each is a ``release`` problem (exit bit 16). And the audit and
# ``dpbudget status`` say what each account's ε is per.
# ------------------------------------------------------------------------------------------------

_UNIT_LEDGER_MEMBERS = {"v", "seq", "prev", "table", "links", "reads", "time", "auth", "writer"}
BOUNDS = {"max_rows_per_unit": 20, "lower": 0.0, "upper": 1000.0}


def _unit_ledger(tmp_path: Path, **events: Any) -> Accountant:
    """An SQLite ledger whose policy gives ``events`` a unit, with one genuine table query."""
    policy = Policy.model_validate({"datasets": {
        "events": {"limit": {"epsilon": 10.0}, "privacy_unit": "person_id", **events},
        "plain": {"limit": {"epsilon": 10.0}}}})
    acc = Accountant.from_policy(policy, ledger=f"sqlite:///{tmp_path / 'l.db'}")
    release_bounded(acc._gate, [Laplace(0.5, sensitivity=20.0)], lambda rng: [100.0],
                    UnitBounds("person_id", BOUNDS), None, ("events", None))
    return acc


def _forge_unit(acc: Accountant, change: dict[str, Any], drop: tuple[str, ...] = ()) -> None:
    """Append by hand a copy of the genuine table query, members changed or dropped, its
    account debited by its cost as the gate would (so only its unit members are wrong)."""
    genuine = next(r for r in map(json.loads, (e.text for e in acc.ledger.entries()))
                   if r.get("kind") == "release")
    (key, stored), = genuine["accounts"].items()
    config = {m: v for m, v in stored.items() if m != "state"}
    rule = rule_from_config(config)
    charge = Laplace(0.5, sensitivity=20.0).charge
    with acc.ledger.transaction() as tx:
        state = rule.debit(tx.account(key).state, charge)  # type: ignore[union-attr]
        fields = {m: canonical(v) for m, v in {**genuine, **change}.items()
                  if m not in _UNIT_LEDGER_MEMBERS and m != "accounts" and m not in drop}
        tx.append({**fields, "accounts": assemble({key: AccountLayout(config).text(state)})},
                  [Account(key, rule.name, rule.describe(), state, 0)])


def _release_problems(report: Any) -> list[str]:
    return [p.message for p in report.problems if p.kind == "release"]


def test_the_genuine_table_query_passes(tmp_path: Path) -> None:
    acc = _unit_ledger(tmp_path)
    acc.close()
    report = audit(f"sqlite:///{tmp_path / 'l.db'}")
    assert report.ok, report.problems


@pytest.mark.parametrize("change, drop, why", [
    ({}, ("unit", "bounds"), "a raw value is refused"),
    ({"unit": "user_id"}, (), "per 'user_id'"),
    ({"unit": None}, (), "per row"),
    ({}, ("bounds",), "without the bounds"),
    ({"bounds": {}}, (), "without the bounds"),
    # Bounds the gate now refuses (review finding 4): the audit holds records to the same words.
    ({"bounds": {"max_rows_per_unit": 0, "junk": -1e300}}, (), "'max_rows_per_unit'"),
    ({"bounds": {"max_rows_per_unit": 20, "junk": 1}}, (), "'junk' is not one of"),
    ({"bounds": {"lower": 5.0, "upper": 1.0}}, (), "'lower' is above"),
])
def test_a_forged_release_not_per_the_unit_is_a_release_problem(
        tmp_path: Path, change: dict[str, Any], drop: tuple[str, ...], why: str) -> None:
    acc = _unit_ledger(tmp_path)
    _forge_unit(acc, change, drop)
    acc.close()
    report = audit(f"sqlite:///{tmp_path / 'l.db'}")
    problems = _release_problems(report)
    assert len(problems) == 1 and why in problems[0] and "record 3" in problems[0], problems
    assert report.exit_status & EXIT_BITS["release"]
    assert len(report.problems) == 1  # the chain and the spend are fine: only the unit is wrong


def test_negative_control_an_audit_without_the_unit_check_passes_the_forgery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acc = _unit_ledger(tmp_path)
    _forge_unit(acc, {}, ("unit", "bounds"))
    acc.close()
    url = f"sqlite:///{tmp_path / 'l.db'}"
    assert not audit(url).ok
    monkeypatch.setattr(audit_policy, "unit_refusal", lambda *args: None)
    assert audit(url).ok  # the forgery is invisible to everything else the audit checks


def test_a_raw_value_is_no_problem_where_the_policy_allows_raw_values(tmp_path: Path) -> None:
    acc = _unit_ledger(tmp_path, raw_values="allow")
    acc.release(Laplace(0.5, sensitivity=1.0), 3.0, dataset="events")
    acc.close()
    assert audit(f"sqlite:///{tmp_path / 'l.db'}").ok


def test_the_audit_and_status_say_what_each_epsilon_is_per(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    acc = _unit_ledger(tmp_path)
    acc.release(Laplace(0.5, sensitivity=1.0), 3.0, dataset="plain")
    policy = acc._gate.planner.policy
    table = budget_table(acc.ledger, policy)
    acc.close()
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "per person_id" in rows["dataset:events"] and "per row" in rows["dataset:plain"]
    url = f"sqlite:///{tmp_path / 'l.db'}"
    text = audit_text(audit(url), None)
    events = next(line for line in text.splitlines() if line.strip().startswith("dataset:events"))
    assert "per person_id" in events
    assert cli(["status", url, "--json"]) == 0
    accounts = {a["account"]: a for a in json.loads(capsys.readouterr().out)["accounts"]}
    assert accounts["dataset:events"]["per"] == "per person_id"
    assert accounts["dataset:plain"]["per"] == "per row"


def test_a_pipeline_and_raw_values_allowed_are_reported_honestly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review findings 6 and 9: under ``raw_values = "allow"`` an account's ε also counts raw
    values per row, and a pipeline opened on a unit dataset spends that dataset's (per person)
    budget; status and the audit said "per person_id" and "per row" respectively."""
    acc = _unit_ledger(tmp_path, raw_values="allow")
    with acc.pipeline("p", dataset="events", budget=Budget(1.0)) as pipe:
        pipe.release(Laplace(0.5, sensitivity=1.0), 3.0)
    acc.close()
    url = f"sqlite:///{tmp_path / 'l.db'}"
    said = "per person_id (raw values allowed: per row)"
    assert cli(["status", url, "--json"]) == 0
    accounts = {a["account"]: a for a in json.loads(capsys.readouterr().out)["accounts"]}
    pipeline = next(key for key in accounts if key.startswith("pipeline:"))
    assert accounts["dataset:events"]["per"] == said and accounts[pipeline]["per"] == said
    report = {a.account: a.per for a in audit(url).accounts}
    assert report["dataset:events"] == said and report[pipeline] == said
    # Negative control: a pipeline's key alone (as before) names no dataset: "per row".
    assert per_account(pipeline, {"events": DatasetLimit(privacy_unit="person_id")}) == "per row"
