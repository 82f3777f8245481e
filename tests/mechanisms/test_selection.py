"""Selection mechanisms: declared cost, validation before any debit, only the choice released."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.mechanisms import Exponential, PermuteAndFlip, RandomizedResponse, ReportNoisyMax

SELECTORS = [Exponential, ReportNoisyMax, PermuteAndFlip]


def snapshot(acc, rng):
    return ([e.hash for e in acc.ledger.entries()], json.dumps(rng.bit_generator.state))


@pytest.mark.parametrize("cls", SELECTORS)
def test_cost_scale_and_choice(cls):
    m = cls(epsilon=0.5, candidates=["lo", "mid", "hi"], sensitivity=2.0)
    assert m.cost == Budget(0.5)
    assert m.scale == pytest.approx(8.0, rel=1e-9) and m.scale >= 8.0
    assert cls(0.5, candidates=["a"], sensitivity=2.0, monotonic=True).scale == pytest.approx(4.0, rel=1e-9)
    acc = Accountant(Budget(1.0), rng=0)
    assert acc.release(m, [0.0, 0.0, 1e4]) == "hi"
    assert acc.spent() == Budget(0.5)
    rec = [e.record for e in acc.ledger.entries()][0]
    assert rec["mechanism"]["params"]["candidates"] == 3 and "scores" not in json.dumps(rec)


@pytest.mark.parametrize("cls", SELECTORS)
@pytest.mark.parametrize("candidates, argument", [
    ([], "candidates"), ((), "candidates"), ("abc", "candidates"), (5, "candidates"),
    (["a", "b", "a"], "candidates[2]"), ([1.0, math.nan], "candidates[1]"),
    ([[1], [2]], "candidates[0]"),
])
def test_bad_candidates(cls, candidates, argument):
    with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
        cls(epsilon=1.0, candidates=candidates, sensitivity=1.0)
    assert info.value.argument == argument


@pytest.mark.parametrize("cls", SELECTORS)
@pytest.mark.parametrize("scores, error", [
    ([1.0, math.nan, 2.0], InvalidArgumentError), ([1.0, math.inf, 2.0], InvalidArgumentError),
    ([1.0, 2.0], InvalidArgumentError), ([[1.0, 2.0, 3.0]], InvalidArgumentError),
    ([1.0, 2.0, 3.0, 4.0], InvalidArgumentError), (["a", "b", "c"], InvalidTypeError),
    ([True, False, True], InvalidTypeError), (3.0, InvalidTypeError), ("abc", InvalidTypeError),
    (None, InvalidTypeError),
])
def test_bad_scores_change_nothing(cls, scores, error):
    rng = np.random.default_rng(1)
    acc = Accountant(Budget(1.0), rng=rng)
    acc.release(cls(0.1, candidates=["x", "y", "z"], sensitivity=1.0), [1, 2, 3])
    before = snapshot(acc, rng)
    with pytest.raises(error) as info:
        acc.release(cls(0.1, candidates=["x", "y", "z"], sensitivity=1.0), scores)
    assert info.value.argument == "scores"
    assert snapshot(acc, rng) == before and acc.spent() == Budget(0.1)


@pytest.mark.parametrize("cls", SELECTORS)
def test_bad_epsilon_and_sensitivity(cls):
    for kwargs, argument in ((dict(epsilon=math.nan), "epsilon"), (dict(epsilon=-1), "epsilon"),
                             (dict(epsilon=1, sensitivity=0), "sensitivity"),
                             (dict(epsilon=1, monotonic="yes"), "monotonic")):
        with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
            cls(candidates=["a", "b"], **{"sensitivity": 1.0, **kwargs})
        assert info.value.argument == argument


def test_selection_is_immutable():
    m = Exponential(1.0, candidates=["a", "b"], sensitivity=1.0)
    with pytest.raises(AttributeError):
        m.scale = 0.01
    assert isinstance(m.candidates, tuple)


@pytest.mark.parametrize("k", [2, 3, 10])
def test_randomized_response_p(k):
    m = RandomizedResponse(epsilon=1.0, categories=list(range(k)))
    assert m.p == pytest.approx(math.e / (math.e + k - 1), rel=1e-12)
    assert m.p <= math.e / (math.e + k - 1)
    assert m.cost == Budget(1.0)


def test_randomized_response_validation_changes_nothing():
    rng = np.random.default_rng(2)
    acc = Accountant(Budget(1.0), rng=rng)
    m = RandomizedResponse(epsilon=0.5, categories=("yes", "no"))
    assert acc.release(m, "yes") in ("yes", "no")
    before = snapshot(acc, rng)
    for bad, error in (("maybe", InvalidArgumentError), (["yes"], InvalidTypeError),
                       (None, InvalidArgumentError)):
        with pytest.raises(error) as info:
            acc.release(m, bad)
        assert info.value.argument == "value"
    assert snapshot(acc, rng) == before
    for cats, argument in (([], "categories"), (["a"], "categories"), (["a", "a"], "categories[1]"),
                           ("ab", "categories")):
        with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
            RandomizedResponse(1.0, categories=cats)
        assert info.value.argument == argument


def test_unordered_candidates_are_refused() -> None:
    """Scores are matched to candidates by position: a set (or dict view) has no stable order."""
    from dpbudget.accountant import InvalidTypeError
    from dpbudget.mechanisms import Exponential, RandomizedResponse

    for bad in ({"a", "b"}, frozenset({"a", "b"}), {"a": 1, "b": 2}, {"a": 1, "b": 2}.keys()):
        with pytest.raises(InvalidTypeError) as info:
            Exponential(1.0, candidates=bad, sensitivity=1.0)
        assert info.value.argument == "candidates"
        with pytest.raises(InvalidTypeError):
            RandomizedResponse(1.0, categories=bad)


def test_negative_zero_is_stored_as_zero() -> None:
    from dpbudget.accountant import Budget

    b = Budget(-0.0, -0.0)
    assert str(b.epsilon) == "0.0" and str(b.delta) == "0.0"
