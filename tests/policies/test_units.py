"""The privacy unit in the policy (dpbudget.policies.units, DatasetLimit's three fields).

What is promised: the fields validate (bounds and raw_values need the unit they are per), they
are stored with the policy and read back exactly (``dpbudget policy apply``, the owner-signed
policy record), and an edit that could let more through — a new unit, raw values allowed, a
bound raised or removed — counts as granting more, where lowering a bound does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant import Accountant
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.gate.owner_key import new_key_file
from dpbudget.accountant.ledger import open_ledger
from dpbudget.accountant.gate import opening
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (InvalidArgumentError, LedgerConflictError,
                                               PolicyError)
from dpbudget.mechanisms import Laplace
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy, load_policy
from dpbudget.policies.stored import raised
from dpbudget.policies.units import (BOUNDS, RAW, ContributionBounds, bounds_problem,
                                     per_account, per_unit, unit_refusal)

UNIT_POLICY = """
[datasets.events]
limit = { epsilon = 1.0 }
privacy_unit = "person_id"
bounds = { max_rows_per_unit = 20, max_groups_per_unit = 3 }
raw_values = "deny"
"""


def _doc(**events: Any) -> dict[str, Any]:
    """A stored policy document (``dpbudget.policies.stored``) with dataset ``events``."""
    limit = DatasetLimit.model_validate({"limit": {"epsilon": 1.0}, **events})
    return {"policy": Policy(datasets={"events": limit}).model_dump(mode="python"),
            "default": None}


@pytest.mark.parametrize("field, value", [("bounds", {"max_rows_per_unit": 20}),
                                          ("raw_values", "allow")])
def test_bounds_or_raw_values_without_a_unit_are_refused_naming_the_field(
        field: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=f"'{field}' is set without 'privacy_unit'"):
        DatasetLimit(**{field: value})
    DatasetLimit(**{field: value, "privacy_unit": "person_id"})  # with it: fine


@pytest.mark.parametrize("bound", [0, -1, 2.5, True, "20"])
def test_a_bound_is_a_positive_whole_number(bound: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="bounds.max_rows_per_unit"):
        DatasetLimit(privacy_unit="p", bounds={"max_rows_per_unit": bound})


def test_unknown_bound_names_and_raw_values_are_refused() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        ContributionBounds.model_validate({"max_rows": 3})
    with pytest.raises(ValueError, match="raw_values"):
        DatasetLimit.model_validate({"privacy_unit": "p", "raw_values": "maybe"})
    with pytest.raises(ValueError, match="privacy_unit"):
        DatasetLimit.model_validate({"privacy_unit": ""})


def test_a_policy_file_reads_the_three_fields(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(UNIT_POLICY)
    events = load_policy(path).datasets["events"]
    assert events.privacy_unit == "person_id" and events.raw_values == "deny"
    assert events.bounds == ContributionBounds(max_rows_per_unit=20, max_groups_per_unit=3)
    path.write_text(UNIT_POLICY.replace('privacy_unit = "person_id"\n', ""))
    with pytest.raises(PolicyError, match="datasets.events"):
        load_policy(path)


def test_policy_apply_stores_the_unit_and_the_owner_signed_record_reads_it_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPBUDGET_OWNER_KEY", raising=False)
    policy, key, db = tmp_path / "p.toml", tmp_path / "owner.pem", tmp_path / "l.db"
    policy.write_text(UNIT_POLICY)
    new_key_file(key)
    url = f"sqlite:///{db}"
    assert cli(["policy", "apply", str(policy), url, "--init", "--owner-key", str(key)]) == 0
    ledger = open_ledger(url)
    try:
        stored, _ = policy_record.stored_policy(ledger)
        first = json.loads(next(iter(ledger.entries())).text)
    finally:
        ledger.close()
    assert stored.datasets["events"] == load_policy(policy).datasets["events"]
    assert first["policy"]["policy"]["datasets"]["events"]["privacy_unit"] == "person_id"
    assert "sig" in first or "owner" in first  # the owner-signed first record
    with Accountant.open(url) as acc:
        assert acc._gate.limit("events").bounds == ContributionBounds(
            max_rows_per_unit=20, max_groups_per_unit=3)


@pytest.mark.parametrize("before, after", [
    ({}, {"privacy_unit": "person_id"}),  # a unit declared where there was none
    ({"privacy_unit": "person_id"}, {"privacy_unit": "household_id"}),  # another unit
    ({"privacy_unit": "person_id"}, {"privacy_unit": "person_id", "raw_values": "allow"}),
    ({"privacy_unit": "p", "bounds": {"max_rows_per_unit": 20}},
     {"privacy_unit": "p", "bounds": {"max_rows_per_unit": 40}}),  # a bound raised
    ({"privacy_unit": "p", "bounds": {"max_rows_per_unit": 20}},
     {"privacy_unit": "p", "bounds": {}}),  # a bound removed (None is the largest)
    ({"privacy_unit": "p", "bounds": {"max_groups_per_unit": 3}},
     {"privacy_unit": "p"}),  # the default bounds removed
])
def test_an_edit_of_the_unit_fields_that_can_let_more_through_is_a_raise(
        before: dict[str, Any], after: dict[str, Any]) -> None:
    lines = raised(_doc(**before), _doc(**after))
    assert [line for line in lines if line.startswith("policy.datasets.events.")], lines


def test_negative_control_lowering_a_bound_or_denying_raw_values_is_no_raise() -> None:
    wide = _doc(privacy_unit="p", raw_values="allow", bounds={"max_rows_per_unit": 40})
    narrow = _doc(privacy_unit="p", raw_values="deny", bounds={"max_rows_per_unit": 20})
    assert raised(wide, narrow) == []
    assert raised(narrow, wide) != []


def test_what_a_budget_is_per() -> None:
    datasets = {"events": DatasetLimit(privacy_unit="person_id"), "plain": DatasetLimit()}
    assert per_unit("person_id") == "per person_id" and per_unit(None) == "per row"
    for key in ("dataset:events", "dataset:events/analyst:bob", "dataset:events/block:d1",
                "dataset:events@2026-11-21+1d"):
        assert per_account(key, datasets) == "per person_id", key
    for key in ("dataset:plain", "global", "analyst:bob", "pipeline:p#3", "dataset:other"):
        assert per_account(key, datasets) == "per row", key
    assert per_account("dataset:other", datasets, datasets["events"]) == "per person_id"


def test_raw_values_allowed_is_said_where_the_budget_is_reported() -> None:
    """Under ``raw_values = "allow"`` a raw value is charged per row: status and the audit must
    not claim the account's ε is per person only."""
    datasets = {"events": DatasetLimit(privacy_unit="person_id", raw_values="allow")}
    assert per_account("dataset:events", datasets) == (
        "per person_id (raw values allowed: per row)")


# --- the one statement of the unit rule (gate and audit alike) ---

UNIT = DatasetLimit(privacy_unit="person_id")
ALLOW = DatasetLimit(privacy_unit="person_id", raw_values="allow")
PLAIN = DatasetLimit()


@pytest.mark.parametrize("limit, unit, joined, why", [
    (UNIT, RAW, False, "a raw value is refused"),
    (UNIT, None, False, "a table query per row is refused"),
    (UNIT, "user_id", False, "a table query per 'user_id' is refused"),
    (UNIT, 7, False, "per a malformed unit"),
    (PLAIN, "person_id", True, "declares no privacy_unit: a join per 'person_id' is refused"),
])
def test_unit_refusal_names_each_release_the_unit_rule_refuses(limit: DatasetLimit, unit: Any,
                                                                joined: bool, why: str) -> None:
    refused = unit_refusal("events", limit, unit, joined)
    assert refused is not None and why in refused[0], refused


@pytest.mark.parametrize("limit, unit, joined", [
    (UNIT, "person_id", False), (UNIT, "person_id", True), (ALLOW, RAW, False),
    (PLAIN, RAW, False), (PLAIN, RAW, True), (PLAIN, None, True),  # rows on rows: as before
    (PLAIN, "person_id", False),  # a per-unit Δ on one dataset bounds a row's too
])
def test_unit_refusal_admits_what_the_gate_writes(limit: DatasetLimit, unit: Any,
                                                  joined: bool) -> None:
    assert unit_refusal("events", limit, unit, joined) is None


def test_the_hint_says_the_right_thing_per_case() -> None:
    """Raw values: the table API or ``raw_values``; a table query per the wrong unit: its bounds
    per the dataset's unit (allowing raw values would not admit it); a join: the missing unit."""
    raw = unit_refusal("events", UNIT, RAW, False)
    wrong = unit_refusal("events", UNIT, "user_id", False)
    join = unit_refusal("events", PLAIN, "person_id", True)
    assert raw is not None and "raw_values = 'allow'" in raw[1]
    assert wrong is not None and "raw_values" not in wrong[1] and "'person_id'" in wrong[1]
    assert join is not None and "datasets.events.privacy_unit" in join[1]


@pytest.mark.parametrize("bounds, unit, why", [
    ({}, "person_id", "without the bounds"),
    (None, "person_id", "without the bounds"),
    ({"max_rows_per_unit": 0, "junk": -1e300}, "person_id", "max_rows_per_unit"),  # the figure
    ({"junk": 1}, None, "not one of"),
    ({"max_rows_per_unit": 0}, "person_id", "'max_rows_per_unit' is not a positive whole"),
    ({"max_groups_per_unit": 2.5}, "person_id", "'max_groups_per_unit'"),
    ({"max_rows_per_group": True}, "person_id", "'max_rows_per_group'"),
    ({"upper": float("inf")}, "person_id", "'upper' is not a finite number"),
    ({"lower": "0"}, "person_id", "'lower'"),
    ({"lower": 5.0, "upper": 1.0}, "person_id", "'lower' is above"),
    ([("upper", 1.0)], None, "not a mapping"),
])
def test_bounds_problem_refuses_empty_unknown_and_invalid_bounds(bounds: Any, unit: Any,
                                                                 why: str) -> None:
    problem = bounds_problem(bounds, unit)
    assert problem is not None and why in problem, problem
    assert "1e+300" not in problem and "-1e300" not in problem  # names, never a value


def test_bounds_problem_admits_the_vocabulary() -> None:
    assert bounds_problem(dict.fromkeys(BOUNDS, 3), "person_id") is None
    assert bounds_problem({"max_rows_per_unit": 20, "lower": 0.0, "upper": 1000.0},
                          "person_id") is None
    assert bounds_problem({}, None) is None  # a query per row states no bounds
    assert set(BOUNDS) >= set(ContributionBounds.model_fields)  # the policy's bounds: its words


# --- a ledger written before the unit fields (issue 33 review, finding 1) ---

_NEW_FIELDS = ("privacy_unit", "bounds", "raw_values")


def _as_before(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored policy document as the code before the unit fields wrote it: without them."""
    def strip(limit: Any) -> Any:
        return limit if limit is None else {k: v for k, v in limit.items()
                                            if k not in _NEW_FIELDS}

    policy = dict(doc["policy"])
    policy["datasets"] = {name: strip(limit) for name, limit in policy["datasets"].items()}
    return {**doc, "policy": policy, "default": strip(doc["default"])}


def _old_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Policy]:
    policy = Policy(datasets={"events": DatasetLimit(limit=Budget(1.0))})
    url = f"sqlite:///{tmp_path / 'old.db'}"
    real = opening.document
    with monkeypatch.context() as old:
        for module in (opening, policy_record):  # (its written-reads-back check too)
            old.setattr(module, "document", lambda p, d: _as_before(real(p, d)))
        with Accountant.from_policy(policy, ledger=url) as acc:
            acc.release(Laplace(0.1, sensitivity=1.0), 3.0, dataset="events")
    ledger = open_ledger(url)
    try:
        stored = policy_record.stored_document(ledger)
    finally:
        ledger.close()
    assert not set(_NEW_FIELDS) & set(stored["policy"]["datasets"]["events"])  # written as before
    return url, policy


def test_a_ledger_written_before_the_unit_fields_opens_and_releases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, policy = _old_ledger(tmp_path, monkeypatch)
    with Accountant.from_policy(policy, ledger=url) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 3.0, dataset="events")
        assert acc.spent("events") == Budget(0.2)
    with Accountant.open(url) as acc:  # its stored policy reads back: no unit, raw values
        assert acc._gate.limit("events").privacy_unit is None


def test_negative_control_the_old_default_deny_cannot_open_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's figure: with ``raw_values`` defaulting to "deny" (its re-dump re-created
    here), the old ledger is refused; and a real change of the unit fields is still seen."""
    url, policy = _old_ledger(tmp_path, monkeypatch)
    real = opening.document

    def deny_by_default(p: Any, d: Any) -> dict[str, Any]:
        doc = real(p, d)
        for limit in doc["policy"]["datasets"].values():
            limit["raw_values"] = limit.get("raw_values") or "deny"
        return doc

    with monkeypatch.context() as old:
        old.setattr(opening, "document", deny_by_default)
        with pytest.raises(LedgerConflictError, match="raw_values: not in the stored policy"):
            Accountant.from_policy(policy, ledger=url)
    unit = Policy(datasets={"events": DatasetLimit(limit=Budget(1.0), privacy_unit="p")})
    with pytest.raises(LedgerConflictError, match="privacy_unit"):
        Accountant.from_policy(unit, ledger=url)
