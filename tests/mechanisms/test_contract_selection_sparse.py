"""The contract battery every issue-4 mechanism passes: declared (ε, 0) cost, public parameters
that the ledger can store, immutability, a documented runnable example, exported by name."""

from __future__ import annotations

import pytest

from dpbudget import accountant
from dpbudget import mechanisms
from dpbudget.accountant import Accountant, Budget, InvalidArgumentError
from dpbudget.accountant.ledger.record import canonical
from dpbudget.mechanisms import (
    AboveThreshold,
    Exponential,
    NumericSparse,
    PermuteAndFlip,
    RandomizedResponse,
    ReportNoisyMax,
    Sparse,
)

INSTANCES = [
    AboveThreshold(0.5, threshold=10.0, sensitivity=1.0), Sparse(0.5, threshold=10.0, max_positives=3, sensitivity=1.0), Sparse(0.5, threshold=10.0, max_positives=3, monotonic=True, sensitivity=1.0),
    NumericSparse(0.5, threshold=10.0, max_positives=3, sensitivity=1.0), Exponential(0.5, candidates=["a", "b"], sensitivity=1.0), ReportNoisyMax(0.5, candidates=["a", "b"], sensitivity=1.0),
    PermuteAndFlip(0.5, candidates=["a", "b"], sensitivity=1.0), RandomizedResponse(0.5, categories=["a", "b", "c"]),
]


@pytest.mark.parametrize("m", INSTANCES, ids=lambda m: type(m).__name__)
def test_contract(m):
    assert m.cost == Budget(0.5, 0.0)
    assert m.charge.epsilon == 0.5 and m.charge.delta == 0.0
    canonical(m.params())  # JSON without NaN: the ledger can store it
    assert type(m).__name__ in repr(m)
    with pytest.raises(AttributeError):
        m.epsilon = 0.01
    doc = type(m).__doc__
    assert ">>>" in doc and ("Thm" in doc or "20" in doc)  # cites a source, runnable example
    assert type(m).__name__ in mechanisms.__all__
    acc = Accountant(Budget(0.5), rng=0)
    assert acc.can_afford(m) and not acc.can_afford(type(m)(0.6, **_bigger(m)))


def _bigger(m):
    params = m.params()
    if isinstance(m, AboveThreshold):
        return {"threshold": params["threshold"], "sensitivity": m.sensitivity}
    if isinstance(m, Sparse):
        return {"threshold": params["threshold"], "max_positives": params["max_positives"],
                "sensitivity": m.sensitivity}
    if isinstance(m, RandomizedResponse):
        return {"categories": m.categories}
    return {"candidates": m.candidates, "sensitivity": m.sensitivity}


def test_huge_integer_query_is_a_typed_error():
    acc = Accountant(Budget(1.0), rng=0)
    with acc.session(AboveThreshold(0.5, threshold=0.0, sensitivity=1.0)) as s:
        with pytest.raises(InvalidArgumentError):
            s.test(10 ** 400)
        assert s.answered == 0


def test_errors_module_exports():
    from dpbudget.accountant.values import errors
    assert "MechanismExhaustedError" in errors.__all__
    assert issubclass(accountant.MechanismExhaustedError, accountant.PrivacyError)
