"""``release_bounded``: a table query's one gate entry (dpbudget.accountant.gate.bounded).

Each test is the attack or the promise: one debit for the batch, nothing computed or drawn when
refused, the unit and bounds in the record, a query per another unit refused, the bounding
generator seeded from the accountant's source.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.gate.bounded import UnitBounds, release_bounded
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (BudgetExceededError, InvalidArgumentError,
                                               InvalidTypeError, UnitRequiredError)
from dpbudget.mechanisms import Laplace
from dpbudget.policies.limits import DatasetLimit

from tests.support import snapshot

BOUNDS = {"max_rows_per_unit": 20, "max_groups_per_unit": 3, "lower": 0.0, "upper": 1000.0}
PER_PERSON = UnitBounds("person_id", BOUNDS)


def _acc(unit: str | None = "person_id", eps: float = 1.0, rng: Any = 0) -> Accountant:
    return Accountant(limits={"events": DatasetLimit(limit=Budget(eps), privacy_unit=unit)},
                      rng=rng)


def _records(acc: Accountant) -> list[dict[str, Any]]:
    return [json.loads(e.text) for e in acc.ledger.entries()]


class _Compute:
    """A ``compute`` that records its calls and the generator it was handed."""

    def __init__(self, values: list[float]) -> None:
        self.values, self.calls, self.draws = values, 0, []

    def __call__(self, rng: np.random.Generator) -> list[float]:
        self.calls += 1
        self.draws.append(int(rng.integers(0, 2 ** 62)))
        return self.values


def _two(eps: float = 0.25) -> list[Laplace]:
    return [Laplace(epsilon=eps, sensitivity=20.0), Laplace(epsilon=eps, sensitivity=60.0)]


def test_one_debit_for_the_batch_then_compute_then_draw() -> None:
    acc = _acc()
    compute = _Compute([100.0, 5000.0])
    out = release_bounded(acc._gate, _two(), compute, PER_PERSON, "q1", ("events", None))
    assert compute.calls == 1 and len(out) == 2
    assert all(isinstance(x, float) for x in out)
    releases = [r for r in _records(acc) if r["kind"] == "release"]
    assert len(releases) == 1  # one record, one debit
    assert releases[0]["mechanism"]["name"] == "batch"
    assert acc.spent("events") == Budget(0.5)


def test_record_carries_unit_and_bounds() -> None:
    acc = _acc()
    release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), PER_PERSON, None, ("events", None))
    record = _records(acc)[-1]
    assert record["unit"] == "person_id"
    assert record["bounds"] == BOUNDS


def test_refused_batch_computes_draws_and_debits_nothing() -> None:
    acc = _acc(eps=0.4)  # 0.25 + 0.25 does not fit
    compute = _Compute([1.0, 2.0])
    before = snapshot(acc.ledger)
    with pytest.raises(BudgetExceededError):
        release_bounded(acc._gate, _two(), compute, PER_PERSON, None, ("events", None))
    assert compute.calls == 0
    assert snapshot(acc.ledger) == before
    # Nothing drawn: the next answer is a fresh seeded accountant's first one.
    one = [Laplace(epsilon=0.1, sensitivity=1.0)]
    fresh = _acc(eps=0.4)
    assert (release_bounded(acc._gate, one, _Compute([0.0]), PER_PERSON, None, ("events", None))
            == release_bounded(fresh._gate, one, _Compute([0.0]), PER_PERSON, None,
                               ("events", None)))


def test_negative_control_a_draw_before_refusal_is_seen() -> None:
    """The comparison above detects a single word taken from the source."""
    acc, fresh = _acc(), _acc()
    acc._gate.sampler.bits.word()
    one = [Laplace(epsilon=0.1, sensitivity=1.0)]
    assert (release_bounded(acc._gate, one, _Compute([0.0]), PER_PERSON, None, ("events", None))
            != release_bounded(fresh._gate, one, _Compute([0.0]), PER_PERSON, None,
                               ("events", None)))


@pytest.mark.parametrize("unit", [None, "user_id"])
def test_query_per_another_unit_is_refused(unit: str | None) -> None:
    acc = _acc()
    compute = _Compute([1.0, 2.0])
    before = snapshot(acc.ledger)
    with pytest.raises(UnitRequiredError, match="datasets.events.privacy_unit") as info:
        release_bounded(acc._gate, _two(), compute, UnitBounds(unit, BOUNDS), None,
                        ("events", None))
    assert info.value.dataset == "events" and "person_id" in str(info.value)
    assert compute.calls == 0 and snapshot(acc.ledger) == before


def test_query_per_another_unit_on_a_join_is_refused() -> None:
    acc = Accountant(limits={"a": DatasetLimit(limit=Budget(1.0)),
                             "b": DatasetLimit(limit=Budget(1.0), privacy_unit="person_id")})
    with pytest.raises(UnitRequiredError, match="datasets.b.privacy_unit"):
        release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), UnitBounds("user_id", BOUNDS),
                        None, (("a", "b"), None))


@pytest.mark.parametrize("unit", [None, "user_id"])
def test_dataset_without_a_unit_takes_either_and_the_record_says_which(unit: str | None) -> None:
    acc = _acc(unit=None)
    release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), UnitBounds(unit, BOUNDS), None,
                    ("events", None))
    assert _records(acc)[-1]["unit"] == unit


def test_seeded_accountant_reproduces_and_each_call_gets_a_fresh_seed() -> None:
    first, second = _Compute([1.0, 2.0]), _Compute([1.0, 2.0])
    a, b = _acc(eps=10.0), _acc(eps=10.0)
    outs_a = [release_bounded(a._gate, _two(), first, PER_PERSON, None, ("events", None))
              for _ in range(2)]
    outs_b = [release_bounded(b._gate, _two(), second, PER_PERSON, None, ("events", None))
              for _ in range(2)]
    assert first.draws == second.draws and outs_a == outs_b
    assert first.draws[0] != first.draws[1]  # a fresh seed per call
    other = _Compute([1.0, 2.0])
    release_bounded(_acc(rng=1)._gate, _two(), other, PER_PERSON, None, ("events", None))
    assert other.draws[0] != first.draws[0]  # the seed comes from the accountant's source


def test_compute_that_raises_leaves_the_debit_standing() -> None:
    acc = _acc()

    def broken(rng: np.random.Generator) -> list[float]:
        raise RuntimeError("the engine failed")

    with pytest.raises(RuntimeError):
        release_bounded(acc._gate, _two(), broken, PER_PERSON, None, ("events", None))
    assert acc.spent("events") == Budget(0.5)


def test_compute_returning_the_wrong_count_draws_nothing() -> None:
    acc = _acc()
    with pytest.raises(InvalidArgumentError, match="compute"):
        release_bounded(acc._gate, _two(), _Compute([1.0]), PER_PERSON, None, ("events", None))
    assert acc.spent("events") == Budget(0.5)  # the debit stands


@pytest.mark.parametrize("unit, error", [
    (("person_id", BOUNDS), InvalidTypeError),
    (UnitBounds(3, BOUNDS), InvalidTypeError),  # type: ignore[arg-type]
    (UnitBounds("person_id", {"upper": float("inf")}), InvalidArgumentError),
    (UnitBounds("person_id", {"upper": True}), InvalidArgumentError),
    (UnitBounds("person_id", [1]), InvalidTypeError),  # type: ignore[arg-type]
])
def test_malformed_unit_is_refused_before_anything(unit: Any, error: type) -> None:
    acc = _acc()
    before = snapshot(acc.ledger)
    with pytest.raises(error):
        release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), unit, None, ("events", None))
    assert snapshot(acc.ledger) == before


def test_empty_or_stream_mechanisms_are_refused() -> None:
    from dpbudget.mechanisms import AboveThreshold

    acc = _acc()
    with pytest.raises(InvalidArgumentError):
        release_bounded(acc._gate, [], _Compute([]), PER_PERSON, None, ("events", None))
    stream = AboveThreshold(epsilon=0.1, threshold=1.0, sensitivity=1.0)
    with pytest.raises(InvalidTypeError):
        release_bounded(acc._gate, [stream], _Compute([1.0]), PER_PERSON, None, ("events", None))
