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
from dpbudget.accountant.values.errors import InvalidArgumentError, PolicyError
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy, load_policy
from dpbudget.policies.stored import raised
from dpbudget.policies.units import ContributionBounds, per_account, per_unit, unit_problem

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


@pytest.mark.parametrize("record, why", [
    ({}, "raw value"),
    ({"unit": None, "bounds": {"upper": 1.0}}, "per row"),
    ({"unit": "user_id", "bounds": {"upper": 1.0}}, "per 'user_id'"),
    ({"unit": 7, "bounds": {"upper": 1.0}}, "malformed"),
    ({"unit": "person_id"}, "without the bounds"),
    ({"unit": "person_id", "bounds": {}}, "without the bounds"),
])
def test_unit_problem_names_each_record_the_gate_does_not_write(record: dict[str, Any],
                                                                 why: str) -> None:
    problem = unit_problem("events", "person_id", "deny", record)
    assert problem is not None and why in problem


def test_unit_problem_passes_what_the_gate_writes() -> None:
    table = {"unit": "person_id", "bounds": {"max_rows_per_unit": 20}}
    assert unit_problem("events", "person_id", "deny", table) is None
    assert unit_problem("events", "person_id", "allow", {}) is None  # a raw value, allowed
    assert unit_problem("events", None, "deny", {}) is None  # no unit: per row, as before
