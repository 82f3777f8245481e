"""The wire format (dpbudget.accountant.service.wire): a request can name no clock, seed,
sensitivity, mechanism, analyst or dataset; answers round-trip as their own types; a refusal is
rebuilt as the same typed error, carrying parameters, never a data value."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

import dpbudget as dp
from dpbudget.accountant.service import wire

BASE = {"table": "t", "statistic": "count", "epsilon": 0.5}


@pytest.mark.parametrize("field", ["analyst", "dataset", "clock", "seed", "rng", "sensitivity",
                                   "mechanism", "scale", "noise"])
def test_a_request_cannot_name_what_decides_the_charge(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        wire.Query.model_validate_json(json.dumps({**BASE, field: "bob"}))


@pytest.mark.parametrize("bad", [{"epsilon": "0.5"}, {"epsilon": True}, {"bounds": {"lower": 1}},
                                 {"filters": [{"column": "x", "op": "like", "value": 1}]},
                                 {"filters": [{"column": "x", "op": "==", "value": {"a": 1}}]}])
def test_strict_types_and_no_expressions(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        wire.Query.model_validate_json(json.dumps({**BASE, **bad}))


@pytest.mark.parametrize("answer", [3.5, {"mean": 1.0, "count": 2.0}, {("a", 1): 2.0, ("b", 2): 3.0},
                                    {1: {"mean": 1.0}}, None, [1.0, 2.0]])
def test_answers_round_trip_as_their_own_types(answer: object) -> None:
    assert wire.decode(json.loads(json.dumps(wire.encode(answer)))) == answer


def test_a_refusal_is_rebuilt_as_the_same_typed_error() -> None:
    err = dp.BudgetExceededError(dp.Budget(1.0), dp.Budget(0.3), "visits",
                                 "dataset:visits/analyst:alice")
    body = json.loads(json.dumps(wire.error_body(err)))
    with pytest.raises(dp.BudgetExceededError) as rebuilt:
        wire.raise_error(body)
    assert (rebuilt.value.requested, rebuilt.value.remaining, rebuilt.value.account) == (
        dp.Budget(1.0), dp.Budget(0.3), "dataset:visits/analyst:alice")
    assert str(rebuilt.value) == str(err)


def test_a_data_value_never_travels_and_unknown_types_are_plain_privacy_errors() -> None:
    canary = "CANARY-4711"
    body = wire.error_body(dp.InvalidDataError("value", canary, "a finite number"))
    assert canary not in json.dumps(body) and body["attrs"]["argument"] == "value"
    with pytest.raises(dp.PrivacyError) as rebuilt:
        wire.raise_error({"type": "SystemExit", "message": "m", "attrs": {}})
    assert type(rebuilt.value) is dp.PrivacyError
