"""Sparse vector: docs/theory.md §3 vectors, the broken variants being impossible, and the session
contract (one debit, no further debit, cutoff, close record, bad input changes nothing)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
    MechanismExhaustedError,
    NumericSession,
    Session,
)
from dpbudget.mechanisms import (
    AboveThreshold,
    Laplace,
    NumericSparse,
    Sparse,
    StreamMechanism,
    above_threshold_accuracy,
)

REL = 1e-9


def records(acc: Accountant) -> list[dict]:
    return [e.record for e in acc.ledger.entries()]


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


def test_non_numeric_session_cannot_release_a_value():
    acc = Accountant(Budget(1.0), rng=0)
    with acc.session(Sparse(epsilon=0.5, threshold=-1e9, max_positives=3, sensitivity=1.0)) as s:
        assert type(s) is Session and not hasattr(s, "query")
        assert s.test(1.0) is True
        assert not hasattr(s._stream, "query")
    with acc.session(NumericSparse(epsilon=0.5, threshold=-1e9, max_positives=3, sensitivity=1.0)) as n:
        assert isinstance(n, NumericSession)
        value = n.query(1.0)
        assert isinstance(value, float)


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

def test_session_debits_once_however_many_queries():
    acc = Accountant(Budget(1.0), rng=0)
    with acc.session(AboveThreshold(epsilon=0.25, threshold=1e9, sensitivity=1.0), dataset="adult",
                     analyst="ann", label="bounds") as svt:
        assert acc.spent("adult") == Budget(0.25)
        assert [r["kind"] for r in records(acc)] == ["session"]
        for i in range(10_000):
            assert svt.test(float(i % 7)) is False
        assert acc.spent("adult") == Budget(0.25)
        assert len(records(acc)) == 1
    opened, closed = records(acc)
    assert opened["cost"]["epsilon"] == 0.25 and opened["mechanism"]["name"] == "AboveThreshold"
    assert (opened["analyst"], opened["label"]) == ("ann", "bounds")
    assert closed["kind"] == "session-close" and closed["session"] == opened["seq"]
    assert (closed["answered"], closed["positives"]) == (10_000, 0)
    assert closed["cost"]["epsilon"] == 0.0 and closed["accounts"] == {}
    assert acc.spent("adult") == Budget(0.25)
    assert svt.receipt.seq == opened["seq"] and svt.receipt.cost == Budget(0.25)


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


def test_abandoned_session_keeps_its_cost():
    acc = Accountant(Budget(1.0), rng=0)
    svt = acc.session(AboveThreshold(epsilon=0.75, threshold=0.0, sensitivity=1.0))
    del svt
    assert acc.spent() == Budget(0.75)
    with pytest.raises(BudgetExceededError):
        acc.session(AboveThreshold(epsilon=0.5, threshold=0.0, sensitivity=1.0))
    assert [r["kind"] for r in records(acc)] == ["session"]


def test_nan_query_is_refused_and_the_session_does_not_advance():
    queries = [0.5, 3.0, -2.0, 8.0, 1.0, 4.0, 2.5, 9.0]

    def run(inject):
        acc = Accountant(Budget(1.0), rng=11)
        out = []
        with acc.session(Sparse(epsilon=1.0, threshold=4.0, max_positives=8, sensitivity=1.0)) as s:
            for i, q in enumerate(queries):
                if inject and i == 3:
                    for bad in (math.nan, math.inf, -math.inf, np.float64("nan")):
                        with pytest.raises(InvalidArgumentError) as info:
                            s.test(bad)
                        assert info.value.argument == "value"
                    for bad in ("1", None, True, [1.0], 1j):
                        with pytest.raises(InvalidTypeError):
                            s.test(bad)
                    assert s.answered == 3
                out.append(s.test(q))
            answered = s.answered
        return out, answered

    clean, injected = run(False), run(True)
    assert clean == injected and clean[1] == len(queries)


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


def test_can_afford_a_session():
    acc = Accountant(Budget(1.0), rng=0)
    assert acc.can_afford(AboveThreshold(epsilon=1.0, threshold=0.0, sensitivity=1.0))
    assert not acc.can_afford(AboveThreshold(epsilon=1.5, threshold=0.0, sensitivity=1.0))


def test_numeric_session_releases_fresh_noisy_values():
    acc = Accountant(Budget(2.0), rng=2)
    m = NumericSparse(epsilon=1.0, threshold=100.0, max_positives=2, sensitivity=1.0)
    with acc.session(m) as s:
        assert s.query(-1e6) is None
        v = s.query(1e6)
        assert v is not None and abs(v - 1e6) < 60 * m.answer_scale
        assert s.test(1e6) is True
        with pytest.raises(MechanismExhaustedError):
            s.query(1e6)
    assert records(acc)[-1]["positives"] == 2 and acc.spent() == Budget(1.0)


def test_session_on_sqlite_ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    with Accountant(Budget(1.0), ledger=url, rng=0, simulation=True) as acc:
        with acc.session(AboveThreshold(epsilon=0.4, threshold=1e9, sensitivity=1.0)) as s:
            s.test(1.0)
    with Accountant(Budget(1.0), ledger=url, rng=0, simulation=True) as again:
        assert again.spent() == Budget(0.4)
        assert [r["kind"] for r in records(again)] == ["policy", "session", "session-close"]


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


@pytest.mark.parametrize("kind", ["Sparse", "NumericSparse"])
def test_threads_racing_one_session_never_pass_the_cutoff(kind: str) -> None:
    """8 threads hammer one session whose every query is ⊤: exactly max_positives ⊤ answers in
    all, every other call a MechanismExhaustedError, and no other error."""
    import threading

    from dpbudget.accountant import Accountant, Budget, MechanismExhaustedError
    from dpbudget.mechanisms import NumericSparse, Sparse

    cls = Sparse if kind == "Sparse" else NumericSparse
    acc = Accountant(Budget(1.0), rng=3)
    tops, exhausted, other = [], [], []
    with acc.session(cls(epsilon=1.0, threshold=0.0, max_positives=2, sensitivity=1.0),
                     dataset="d") as s:
        ask = s.test if kind == "Sparse" else s.query

        def worker() -> None:
            for _ in range(2000):
                try:
                    if ask(1e12) not in (False, None):
                        tops.append(1)
                except MechanismExhaustedError:
                    exhausted.append(1)
                except BaseException as exc:  # noqa: BLE001 - the test counts any other error
                    other.append(exc)

        import sys

        threads = [threading.Thread(target=worker) for _ in range(8)]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show at once
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
    assert other == []
    assert len(tops) == 2 and len(exhausted) == 8 * 2000 - 2
    assert s.positives == 2
