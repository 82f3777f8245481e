"""The contract battery every issue-13 mechanism passes: declared cost, public parameters the
ledger can store and that hold no data, immutability, a documented runnable example citing its
source, exported by name, and the refusal/bad-value paths that draw and debit nothing."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpbudget import mechanisms
from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.values.errors import InvalidDataError
from dpbudget.accountant.ledger.record import canonical
from dpbudget.mechanisms import (
    Median,
    ProposeTestRelease,
    Quantile,
    SampleAndAggregate,
    SmoothSensitivity,
)
from tests.contracts import assert_immutable

SECRET = 918273.645
ROWS = [SECRET, 1.0, 2.0, 3.0, 4.0]
INSTANCES: list[Any] = [
    Quantile(0.5, q=0.25, lower=0.0, upper=1e6), Median(0.5, lower=0.0, upper=1e6),
    ProposeTestRelease(0.5, delta=1e-6, bound=1.0, statistic="median", lower=0.0, upper=1e6),
    ProposeTestRelease(0.5, delta=1e-6, bound=1.0, statistic="mean", lower=0.0, upper=1e6),
    SmoothSensitivity(0.5, delta=1e-6, lower=0.0, upper=1e6), SampleAndAggregate(0.5, function=np.mean, chunks=2, lower=0.0, upper=1e6),
]
IDS = [f"{type(m).__name__}-{i}" for i, m in enumerate(INSTANCES)]


@pytest.mark.parametrize("m", INSTANCES, ids=IDS)
def test_contract(m: Any) -> None:
    assert m.cost.epsilon == 0.5 and m.charge.epsilon == 0.5
    assert m.charge.delta == m.cost.delta
    canonical(m.params())  # JSON without NaN: the ledger can store it
    assert type(m).__name__ in repr(m)
    assert_immutable(m, ["epsilon"])
    doc = type(m).__doc__ or ""
    assert ">>>" in doc and ("20" in doc or "Thm" in doc)  # cites a source, runnable example
    assert type(m).__name__ in mechanisms.__all__
    assert m.noise == "exact"


@pytest.mark.parametrize("m", INSTANCES, ids=IDS)
def test_the_ledger_debits_the_declared_cost_and_holds_no_data(m: Any) -> None:
    acc = Accountant(Budget(0.5, 1e-5), rng=0)
    acc.release(m, ROWS, dataset="d")
    assert acc.spent("d") == m.cost
    record = [e for e in acc.ledger.entries() if e.record["kind"] == "release"][0]
    assert record.record["cost"]["epsilon"] == 0.5
    assert record.record["cost"]["delta"] == m.cost.delta
    assert "918273" not in record.text


@pytest.mark.parametrize("m", INSTANCES, ids=IDS)
def test_a_refusal_and_a_bad_value_draw_and_debit_nothing(m: Any) -> None:
    rng = np.random.default_rng(3)
    acc = Accountant(Budget(0.4, 1e-5), rng=rng)
    state = rng.bit_generator.state
    with pytest.raises(BudgetExceededError):
        acc.release(m, ROWS)
    if not isinstance(m, SampleAndAggregate):  # (its rows go to the function: no NaN check)
        roomy = Accountant(Budget(1.0, 1e-5), rng=rng)
        with pytest.raises(InvalidDataError) as caught:
            roomy.release(m, [SECRET, math.nan])
        assert "918273" not in str(caught.value)
        assert roomy.spent() == Budget(0.0)
    assert rng.bit_generator.state == state and acc.spent() == Budget(0.0)
