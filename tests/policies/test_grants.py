"""Every policy field declares how it can grant more (``dpbudget.policies.grants``), and ``raised`` flags an
edit that widens access through any of them: the attacks are the fields the old key-name matcher
did not know (a default for undeclared datasets, ``other_datasets`` admitted, an unlock schedule
dropped, a larger unlock fraction), and every other field, one row each."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from dpbudget.accountant import Accountant
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.values.budget import Budget
from dpbudget.policies import stored
from dpbudget.policies.grants import GRANTS, grants_of
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import _model_in
from dpbudget.policies.stored import raised
from tests.support import OWNER


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model a document of ``root`` holds (itself, its fields' models, theirs...)."""
    seen: list[type[BaseModel]] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            inner, _ = _model_in(field.annotation)
            if inner is not None:
                todo.append(inner)
    return seen


def _fields(root: type[BaseModel]) -> dict[str, str | None]:
    """``"Model.field"`` -> the kind it declares (None: nothing), for every model under root.
    A field inherited from a base is named by the model that defines it (``_Limit.limit``)."""
    out: dict[str, str | None] = {}
    for model in _models(root):
        for name, field in model.model_fields.items():
            owner = next(c for c in model.__mro__ if name in c.__dict__.get("__annotations__", {}))
            out[f"{owner.__name__}.{name}"] = grants_of(field)
    return out


def test_every_field_of_every_policy_model_declares_how_it_grants_more() -> None:
    fields = _fields(stored._Document)
    assert {"Budget.epsilon", "Cap.delta", "Unlock.fraction", "Blocks.first", "Policy.datasets",
            "DatasetLimit.allowed_mechanisms", "_Limit.period"} <= set(fields)
    assert [f for f, kind in fields.items() if kind is None] == []
    assert set(fields.values()) <= set(GRANTS)


def test_negative_control_a_new_field_that_declares_nothing_is_caught_and_flagged() -> None:
    class Wider(DatasetLimit):  # a field added without a declaration
        share_raw_rows: bool = False
        declared: bool = Field(False, json_schema_extra={"grants": "no-such-kind"})

    fields = _fields(Wider)
    assert fields["Wider.share_raw_rows"] is None and fields["Wider.declared"] is None
    # ... and raised treats it as "any change can grant more": flagged, never missed.
    assert stored._compare(Wider, {"share_raw_rows": False}, {"share_raw_rows": True}, "d") == [
        "d.share_raw_rows: False -> True (another rule, window or division can admit more: "
        "each can grant its budget again)"]


def _doc(**at: Any) -> dict[str, Any]:
    """A stored document (``dpbudget.policies.stored.document``'s shape) with values set at dotted paths."""
    doc: dict[str, Any] = {"policy": {"datasets": {"d": {"limit": {"epsilon": 1.0, "delta": 0.0}}},
                                      "other_datasets": None}, "default": None}
    for path, value in at.items():
        *parents, leaf = path.split("__")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return doc


_B = {"epsilon": 1.0, "delta": 1e-6}
_BLOCKS = {"by": "day", "limit": _B, "first": "2026-11-10"}
_UNLOCK = {**_BLOCKS, "unlock": {"every": "1d", "fraction": 0.25}}
D = "policy__datasets__d__"

# (the field it widens access through, path, old value, new value); "__" separates path parts.
WIDENINGS: list[tuple[str, str, Any, Any]] = [
    ("_Document.policy", "policy", None, {"datasets": {"d": {}}}),
    ("_Document.default", "default", None, {"limit": _B}),
    ("Policy.datasets", "policy__datasets", {"d": {}}, {"d": {}, "e": {}}),
    ("Policy.analysts", "policy__analysts", {"alice": {"limit": _B}}, {}),
    ("Policy.other_analysts", "policy__other_analysts", "deny", "allow"),
    ("Policy.other_datasets", "policy__other_datasets", None, {"limit": _B}),
    ("Policy.composition", "policy__composition", "basic", "advanced"),
    ("_Limit.limit", D + "limit", _B, {"epsilon": 2.0, "delta": 1e-6}),
    ("_Limit.per_query", D + "per_query", _B, None),
    ("_Limit.conversion_share", D + "conversion_share", 0.5, 1.0),
    ("_Limit.order", D + "order", 8.0, 2.0),
    ("_Limit.step", D + "step", [0.01, 1.0], [0.01, 0.5]),
    ("_Limit.period", D + "period", "7d", "1d"),
    ("DatasetLimit.composition", D + "composition", "basic", "renyi"),
    ("DatasetLimit.max_per_query", D + "max_per_query", {"epsilon": 0.5}, None),
    ("DatasetLimit.allowed_mechanisms", D + "allowed_mechanisms", ["Laplace"],
     ["Laplace", "Gaussian"]),
    ("DatasetLimit.analysts", D + "analysts", {}, {"bob": {}}),
    ("DatasetLimit.other_analysts", D + "other_analysts", "deny", "allow"),
    ("DatasetLimit.blocks", D + "blocks", _BLOCKS, None),
    ("DatasetLimit.privacy_unit", D + "privacy_unit", "person_id", "household_id"),
    ("DatasetLimit.bounds", D + "bounds", {"max_rows_per_unit": 20}, None),
    ("DatasetLimit.raw_values", D + "raw_values", "deny", "allow"),
    ("ContributionBounds.max_rows_per_unit", D + "bounds__max_rows_per_unit", 20, 40),
    ("ContributionBounds.max_groups_per_unit", D + "bounds__max_groups_per_unit", 3, None),
    ("ContributionBounds.max_rows_per_group", D + "bounds__max_rows_per_group", 1, 2),
    ("AnalystLimit.composition", D + "analysts__bob__composition", None, "advanced"),
    ("AnalystLimit.tokens", "policy__analysts__alice__tokens", [],
     ["0123456789abcdef:" + "0" * 64 + ":4000000000"]),
    ("Budget.epsilon", D + "limit__epsilon", 1.0, "inf"),
    ("Budget.delta", D + "limit__delta", 0.0, 1e-9),
    ("Cap.epsilon", D + "max_per_query__epsilon", 0.5, 0.6),
    ("Cap.delta", D + "max_per_query__delta", 1e-9, None),
    ("Blocks.by", D + "blocks", _BLOCKS, {**_BLOCKS, "by": "week", "first": None}),
    ("Blocks.names", D + "blocks", {"names": ["a"], "limit": _B},
     {"names": ["a", "b"], "limit": _B}),
    ("Blocks.limit", D + "blocks__limit", _B, {"epsilon": 1.0, "delta": 1e-5}),
    ("Blocks.composition", D + "blocks__composition", "basic", "advanced"),
    ("Blocks.per_query", D + "blocks__per_query", {"epsilon": 0.1}, {"epsilon": 0.2}),
    ("Blocks.conversion_share", D + "blocks__conversion_share", 1.0, 0.5),
    ("Blocks.order", D + "blocks__order", None, 4.0),
    ("Blocks.first", D + "blocks", _BLOCKS, {**_BLOCKS, "first": "2026-11-01"}),
    ("Blocks.unlock", D + "blocks", _UNLOCK, _BLOCKS),
    ("Unlock.every", D + "blocks__unlock__every", "7d", "1d"),
    ("Unlock.fraction", D + "blocks__unlock__fraction", 0.25, 0.5),
]


def test_the_table_widens_every_declared_field() -> None:
    assert {row[0] for row in WIDENINGS} == set(_fields(stored._Document))


@pytest.mark.parametrize(("field", "path", "old", "new"), WIDENINGS,
                         ids=[row[0] for row in WIDENINGS])
def test_an_edit_widening_access_through_each_field_is_a_raise(field: str, path: str, old: Any,
                                                              new: Any) -> None:
    base = {D + "blocks": _UNLOCK} if "blocks__" in path else {}
    before, after = _doc(**{**base, path: old}), _doc(**{**base, path: new})
    where = path.replace("__", ".")
    assert [line for line in raised(before, after) if line.startswith(where)], field
    assert raised(before, before) == []


def test_admitting_undeclared_datasets_is_reported_when_the_owner_applies_it(
        write: Any, tmp_path: Path) -> None:
    """The old matcher knew no ``other_datasets``: admitting every dataset not listed was an
    edit that granted more and said nothing (apply returned ``raised == []``)."""
    db = tmp_path / "l.db"
    plain = "[datasets.adult]\nlimit = { epsilon = 1.0 }\n"
    with Accountant.from_policy(write(plain), ledger=db, rng=0, simulation=True,
                                owner_key=OWNER) as acc:
        wide = write(plain + "[other_datasets]\nlimit = { epsilon = 1.0 }\n")
        change = acc.apply_policy(wide, by="admin", reason="test", owner_key=OWNER)
    assert change.raised == ["policy.other_datasets added"]
    report = audit(f"sqlite:///{db}")
    assert report.ok and report.policies[1].raised == ["policy.other_datasets added"]


def test_lowering_every_budget_grants_nothing() -> None:
    before = _doc(**{D + "limit": _B, D + "max_per_query": {"epsilon": 0.5},
                     "policy__other_analysts": "allow"})
    after = _doc(**{D + "limit": {"epsilon": 0.5, "delta": 0.0},
                    D + "max_per_query": {"epsilon": 0.1, "delta": 1e-9},
                    "policy__other_analysts": "deny", D + "blocks": _BLOCKS})
    assert raised(before, after) == []
    assert Budget.model_fields["epsilon"].json_schema_extra == {"grants": "higher"}
