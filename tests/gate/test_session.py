"""``Session`` (``dpbudget.accountant.gate.session``): a sparse-vector session is debited its one fixed cost
when it opens; answering never touches the ledger; a refused or abandoned session keeps its cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpbudget.accountant import (Accountant, Budget, BudgetExceededError, InvalidArgumentError,
                                 InvalidTypeError, MechanismExhaustedError, NumericSession, Session)
from dpbudget.mechanisms import AboveThreshold, NumericSparse, Sparse
from tests.support import records


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
