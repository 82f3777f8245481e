"""The planner (``dpbudget.accountant.gate.planner``): the one place a request is mapped to its
accounts — the dataset's limit, its analyst's there, the analyst's everywhere — and refused when
its dataset or analyst is unknown or denied; plans are kept least recently used first out."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

from dpbudget.accountant.gate import planner as planner_module
from dpbudget.accountant.gate.planner import Planner
from dpbudget.accountant.values.errors import (InvalidArgumentError, UnknownAnalystError,
                                               UnknownDatasetError)
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import parse_policy

POLICY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    other_analysts = "deny"
    [datasets.adult.analysts.alice]
    limit = { epsilon = 0.5 }
    [datasets.census]
    limit = { epsilon = 2.0 }
    [analysts.alice]
    limit = { epsilon = 1.5 }
"""


def _planner(default: DatasetLimit | None = None) -> Planner:
    return Planner(parse_policy(POLICY, "toml"), default)


def _keys(plan: Any) -> list[str]:
    return [t.key for t in plan.targets]


def test_a_request_is_charged_to_every_limit_that_applies_dataset_first() -> None:
    planner = _planner()
    assert _keys(planner.plan("adult", "alice")) == [
        "dataset:adult", "dataset:adult/analyst:alice", "analyst:alice"]
    assert _keys(planner.plan("census", None)) == ["dataset:census"]
    join = planner.plan(("adult", "census"), "alice")
    assert {"dataset:adult", "dataset:census", "dataset:adult/analyst:alice"} <= set(_keys(join))
    assert planner.plan(["adult", "census"], "alice") == join  # a list is the same join


def test_unknown_and_denied_requests_are_refused() -> None:
    planner = _planner()
    with pytest.raises(UnknownDatasetError):
        planner.plan("survey", None)
    with pytest.raises(UnknownAnalystError):
        planner.plan("adult", "mallory")  # adult denies analysts it does not list
    assert _keys(planner.plan("census", "mallory")) == ["dataset:census"]  # census does not


def test_a_twin_of_a_known_dataset_is_refused_under_the_default_limit() -> None:
    default = parse_policy(POLICY, "toml").datasets["census"]
    planner = _planner(default)
    assert _keys(planner.plan("survey", None)) == ["dataset:survey"]
    for twin in ("Survey", "sur-vey", "SURVEY"):
        with pytest.raises(InvalidArgumentError, match="one table, one budget"):
            planner.plan(twin, None)


def _clearing(cache: OrderedDict[Any, Any], key: Any, make: Any) -> Any:
    """The plan cache before the LRU (issue 31): cleared whenever it was full."""
    if key not in cache:
        if len(cache) >= planner_module._PLAN_CACHE:
            cache.clear()
        cache[key] = make()
    return cache[key]


def _kept_when_busy(monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether a plan in constant use survives a stream of one-off requests."""
    monkeypatch.setattr(planner_module, "_PLAN_CACHE", 3)
    planner = _planner()
    hot = planner.plan("adult", "alice")
    for i in range(6):
        planner.plan("census", f"analyst{i}")
        planner.plan("adult", "alice")
    return planner.plan("adult", "alice") is hot


def test_a_plan_in_use_stays_cached_while_one_off_plans_come_and_go(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _kept_when_busy(monkeypatch)
    monkeypatch.setattr(planner_module, "_PLAN_CACHE", 3)
    planner = _planner()
    for analyst in ("a1", "a2", "a3", "a4", "a5"):
        planner.plan("census", analyst)
    assert len(planner._plans) == 3


def test_negative_control_a_cache_cleared_when_full_drops_the_plan_in_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_module, "_lru", _clearing)
    assert not _kept_when_busy(monkeypatch)
