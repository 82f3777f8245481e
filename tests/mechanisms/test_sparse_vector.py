"""Sparse vector: docs/theory.md §3 vectors, the broken variants being impossible, and the session
contract (one debit, no further debit, cutoff, close record, bad input changes nothing)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError, MechanismExhaustedError
from dpbudget.mechanisms import (
    AboveThreshold,
    Laplace,
    NumericSparse,
    Sparse,
    StreamMechanism,
    above_threshold_accuracy,
)
from tests.support import records

REL = 1e-9


def snapshot(acc: Accountant, rng: np.random.Generator) -> tuple:
    return ([e.hash for e in acc.ledger.entries()], json.dumps(rng.bit_generator.state))


# -- docs/theory.md vectors ----------------------------------------------------------------------------

def test_accuracy_vector_dwork_roth_3_24():
    assert above_threshold_accuracy(1000, 0.05, 1.0) == pytest.approx(84.77307786, rel=REL)
    assert above_threshold_accuracy(1000, 0.05, 0.5, 2.0) == pytest.approx(4 * 84.77307786, rel=REL)


@pytest.mark.parametrize("eps, delta", [(1.0, 1.0), (0.5, 1.0), (0.1, 3.0)])
def test_above_threshold_scales(eps, delta):
    m = AboveThreshold(epsilon=eps, threshold=0.0, sensitivity=delta)
    assert m.threshold_scale == pytest.approx(2 * delta / eps, rel=REL)
    assert m.query_scale == pytest.approx(4 * delta / eps, rel=REL)
    assert m.threshold_scale >= 2 * delta / eps and m.query_scale >= 4 * delta / eps  # round up
    assert m.cost == Budget(eps) and m.max_positives == 1


@pytest.mark.parametrize("c", [1, 2, 3, 10, 100])
@pytest.mark.parametrize("monotonic", [False, True])
def test_default_split_lyu_su_li(c, monotonic):
    m = Sparse(epsilon=1.0, threshold=5.0, max_positives=c, monotonic=monotonic, sensitivity=1.0)
    ratio = (c if monotonic else 2 * c) ** (2 / 3)
    assert m.epsilon_queries / m.epsilon_threshold == pytest.approx(ratio, rel=REL)
    assert m.epsilon_threshold + m.epsilon_queries <= 1.0
    assert m.epsilon_threshold + m.epsilon_queries == pytest.approx(1.0, rel=REL)
    assert m.threshold_scale == pytest.approx(1 / m.epsilon_threshold, rel=REL)
    per_query = c if monotonic else 2 * c
    assert m.query_scale == pytest.approx(per_query / m.epsilon_queries, rel=REL)
    assert m.cost == Budget(1.0)


def test_explicit_split_and_numeric_shares():
    m = Sparse(epsilon=0.9, threshold=0.0, max_positives=4, sensitivity=2.0, split=(1, 2))
    assert m.epsilon_threshold == pytest.approx(0.3, rel=REL)
    assert m.epsilon_queries == pytest.approx(0.6, rel=REL)
    assert m.query_scale == pytest.approx(2 * 4 * 2.0 / 0.6, rel=REL)
    n = NumericSparse(epsilon=1.0, threshold=0.0, max_positives=3, sensitivity=1.0)
    assert n.epsilon_answers == pytest.approx(0.5, rel=REL)
    assert n.epsilon_queries / n.epsilon_threshold == pytest.approx(6 ** (2 / 3), rel=REL)
    assert n.epsilon_threshold + n.epsilon_queries + n.epsilon_answers <= 1.0
    assert n.answer_scale == pytest.approx(3 / n.epsilon_answers, rel=REL)


def test_shares_never_sum_above_epsilon():
    for eps in (0.1, 0.3, 1 / 3, 0.7, 1.1, 2.9):
        for split in ((1, 1), (1, 3), (0.1, 0.7), (1, 2 ** (2 / 3))):
            m = Sparse(eps, threshold=0.0, max_positives=1, split=split, sensitivity=1.0)
            from fractions import Fraction
            assert Fraction(m.epsilon_threshold) + Fraction(m.epsilon_queries) <= Fraction(eps)


def test_sparse_accuracy_bound():
    at = AboveThreshold(epsilon=1.0, threshold=0.0, sensitivity=1.0)
    alpha = at.accuracy(1000, 0.05)
    assert alpha == pytest.approx((6 * math.log(40) + 4 * math.log(1000)), rel=REL)
    assert alpha <= above_threshold_accuracy(1000, 0.05, 1.0)
    sp = Sparse(epsilon=1.0, threshold=0.0, max_positives=5, sensitivity=1.0)
    assert sp.accuracy(100, 0.1) == pytest.approx(
        sp.threshold_scale * math.log(20) + sp.query_scale * math.log(2000), rel=REL)


# -- the broken variants cannot be built ----------------------------------------------------------

@pytest.mark.parametrize("bad", [None, 0, -1, 1.5, math.inf, math.nan, True, "3"])
def test_no_cutoff_is_impossible(bad):
    with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
        Sparse(epsilon=1.0, threshold=0.0, max_positives=bad, sensitivity=1.0)
    assert info.value.argument == "max_positives"


def test_query_noise_always_carries_c_and_cannot_be_changed():
    m = Sparse(epsilon=1.0, threshold=0.0, max_positives=7, split=(1, 1), sensitivity=1.0)
    assert m.query_scale == pytest.approx(2 * 7 / 0.5, rel=REL)
    with pytest.raises(TypeError):
        Sparse(epsilon=1.0, threshold=0.0, max_positives=7, query_scale=4.0, sensitivity=1.0)  # no such knob
    for attr in ("query_scale", "max_positives", "threshold_scale", "epsilon"):
        with pytest.raises(AttributeError):
            setattr(m, attr, 1.0)


@pytest.mark.parametrize("kwargs, argument", [
    (dict(epsilon=math.nan, threshold=0.0, max_positives=1), "epsilon"),
    (dict(epsilon=0.0, threshold=0.0, max_positives=1), "epsilon"),
    (dict(epsilon=1.0, threshold=math.nan, max_positives=1), "threshold"),
    (dict(epsilon=1.0, threshold=math.inf, max_positives=1), "threshold"),
    (dict(epsilon=1.0, threshold="10", max_positives=1), "threshold"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, sensitivity=-1.0), "sensitivity"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, monotonic=1), "monotonic"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, split=(1.0,)), "split"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, split=(1.0, 0.0)), "split[1]"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, split=(1.0, math.nan)), "split[1]"),
])
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
        Sparse(**{"sensitivity": 1.0, **kwargs})
    assert info.value.argument == argument
    assert repr(kwargs.get(argument.split("[")[0])) in str(info.value) or "[" in argument


# -- sessions -------------------------------------------------------------------------------------


def test_cutoff_after_c_positives_and_after_close():
    acc = Accountant(Budget(1.0), rng=3)
    svt = acc.session(Sparse(epsilon=0.5, threshold=0.0, max_positives=2, sensitivity=1.0))
    assert svt.test(1e6) and svt.test(-1e6) is False and svt.test(1e6)
    with pytest.raises(MechanismExhaustedError, match="cutoff of 2") as info:
        svt.test(1e6)
    assert (info.value.answered, info.value.positives) == (3, 2)
    assert not svt.closed
    svt.close()
    svt.close()  # idempotent: one close record
    assert [r["kind"] for r in records(acc)] == ["session", "session-close"]
    with pytest.raises(MechanismExhaustedError, match="closed"):
        svt.test(0.0)
    assert acc.spent() == Budget(0.5)


def test_error_in_block_still_closes_and_records():
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(ZeroDivisionError):
        with acc.session(AboveThreshold(epsilon=0.5, threshold=1e9, sensitivity=1.0)) as svt:
            svt.test(1.0)
            1 / 0
    assert svt.closed and records(acc)[-1]["answered"] == 1


def test_accepts_real_numbers_of_any_type():
    acc = Accountant(Budget(1.0), rng=0)
    with acc.session(Sparse(epsilon=1.0, threshold=-1e9, max_positives=10, sensitivity=1.0)) as s:
        assert all(s.test(v) for v in (1, 2.5, np.float32(3), np.int64(4)))


def test_refusals_change_nothing():
    rng = np.random.default_rng(5)
    acc = Accountant(Budget(1.0), rng=rng)
    acc.session(AboveThreshold(epsilon=0.5, threshold=0.0, sensitivity=1.0)).close()
    before = snapshot(acc, rng)
    with pytest.raises(InvalidTypeError):
        acc.release(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), 3.0)  # not a one-shot mechanism
    with pytest.raises(InvalidTypeError):
        acc.session(Laplace(epsilon=0.1, sensitivity=1.0))
    with pytest.raises(InvalidTypeError):
        acc.session("AboveThreshold")
    with pytest.raises(BudgetExceededError):
        acc.session(AboveThreshold(epsilon=0.6, threshold=0.0, sensitivity=1.0))
    with pytest.raises(InvalidTypeError):
        acc.session(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), dataset=3)
    with pytest.raises(InvalidArgumentError):
        acc.session(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), label="")
    assert snapshot(acc, rng) == before
    assert acc.spent() == Budget(0.5)


def test_unknown_dataset_is_refused_before_anything():
    acc = Accountant(limits={"adult": Budget(1.0)}, rng=0)
    with pytest.raises(InvalidArgumentError):
        acc.session(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), dataset="census")
    assert records(acc) == []


def test_no_true_value_in_the_ledger():
    acc = Accountant(Budget(1.0), rng=0)
    secret = 123456.789
    with acc.session(NumericSparse(epsilon=1.0, threshold=-1e9, max_positives=1, sensitivity=1.0)) as s:
        s.query(secret)
    assert "123456" not in "".join(e.text for e in acc.ledger.entries())


def test_stream_mechanisms_are_exported_and_documented():
    from dpbudget import accountant
    from dpbudget import mechanisms
    for name in ("AboveThreshold", "Sparse", "NumericSparse", "StreamMechanism",
                 "above_threshold_accuracy", "Exponential", "ReportNoisyMax", "PermuteAndFlip",
                 "RandomizedResponse"):
        assert name in mechanisms.__all__ and getattr(mechanisms, name).__doc__
    for name in ("MechanismExhaustedError", "Session", "NumericSession"):
        assert name in accountant.__all__ and getattr(accountant, name).__doc__
    assert issubclass(Sparse, StreamMechanism)


