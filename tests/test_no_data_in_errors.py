"""No data in any error, repr or log line: a canary value is fed through every path where a true
value, a score, a category or a row can be refused, and must never come back out — not in the
message, the repr, the arguments or the attributes of the error, not in the log, not in the ledger.

Parameters (ε, δ, bounds, names) may be shown; data values may not. Errors describe the data
instead: its type, shape, dtype and where the problem is (``value[1] is not finite``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, PrivacyError
from dpbudget.mechanisms import (
    AboveThreshold,
    AnalyticGaussian,
    DiscreteGaussian,
    DiscreteLaplace,
    Exponential,
    Gaussian,
    Laplace,
    Median,
    NumericSparse,
    PermuteAndFlip,
    ProposeTestRelease,
    Quantile,
    RandomizedResponse,
    ReportNoisyMax,
    SampleAndAggregate,
    SmoothSensitivity,
    Sparse,
    group_by,
    noisy_mean,
    noisy_quantiles,
)
from dpbudget.accountant.tables.builder import table
from dpbudget.mechanisms.queries import true_clamped_sum, true_count, true_histogram
from dpbudget.policies.limits import DatasetLimit

CANARY = 987654.321
TEXT = "CANARY-7f3a"
MARKS = ("987654", TEXT)  # any rendering of the canary float contains its leading digits
NAN, INF = float("nan"), float("inf")
HUGE = int("987654" * 60)  # beyond float range: its digits are the canary too

NUMERIC_BAD = [[CANARY, NAN], np.array([CANARY, INF]), np.array([[CANARY, 1.0], [NAN, 2.0]]),
               TEXT, [TEXT], [[CANARY], [1.0, 2.0]], {"k": CANARY}, [CANARY, None],
               complex(CANARY, 1.0), HUGE, [HUGE, 1.0], {CANARY, 1.0}, np.array([TEXT]),
               [TEXT, CANARY]]
SCORES_BAD = [[CANARY, NAN], [CANARY], TEXT, [[CANARY], [1.0, 2.0]], np.array([CANARY] * 3),
              [TEXT, CANARY], [CANARY, INF], [CANARY, None]]


def _cases() -> list[Any]:
    cases: list[Any] = []
    for mech in (Laplace(1.0, sensitivity=1.0), Gaussian(0.5, delta=1e-6, sensitivity=1.0), AnalyticGaussian(1.0, delta=1e-6, sensitivity=1.0)):
        for i, bad in enumerate(NUMERIC_BAD):
            cases.append(pytest.param(lambda acc, m=mech, v=bad: acc.release(m, v),
                                      id=f"{mech.name}-{i}"))
    integer_bad = [CANARY, [CANARY, 1], np.array([CANARY]), TEXT, [TEXT], True, [[1], [1, 2]],
                   np.array([987654 * 10 ** 13]), [987654 * 10 ** 13, 1], [HUGE]]
    for mech in (DiscreteLaplace(1.0, sensitivity=1), DiscreteGaussian(1.0, delta=1e-6, sensitivity=1)):
        for i, bad in enumerate(integer_bad):
            cases.append(pytest.param(lambda acc, m=mech, v=bad: acc.release(m, v),
                                      id=f"{mech.name}-{i}"))
    # Values beyond the noise grid of a tiny scale: refused, never shown.
    tiny = 1e-290
    cases.append(pytest.param(lambda acc: acc.release(Laplace(1.0, sensitivity=tiny), CANARY * 1e290),
                              id="laplace-off-grid"))
    cases.append(pytest.param(lambda acc: acc.release(
        ReportNoisyMax(1.0, candidates=["a", "b"], sensitivity=tiny), [CANARY * 1e290, 0.0]),
        id="rnm-off-grid"))

    def off_grid(acc: Accountant) -> Any:
        with acc.session(Sparse(epsilon=0.5, threshold=0.0, max_positives=1,
                                sensitivity=tiny)) as s:
            return s.test(CANARY * 1e290)
    cases.append(pytest.param(off_grid, id="sparse-off-grid"))
    for cls in (Exponential, ReportNoisyMax, PermuteAndFlip):
        for i, bad in enumerate(SCORES_BAD):
            cases.append(pytest.param(
                lambda acc, c=cls, v=bad: acc.release(c(1.0, candidates=["a", "b"],
                                                        sensitivity=1.0), v),
                id=f"{cls.__name__}-{i}"))
    # Mechanisms over rows (issue 13): a list of rows with a NaN, text, nesting or a scalar.
    rows_bad = [[CANARY, NAN], TEXT, [TEXT, CANARY], [[CANARY], [1.0, 2.0]], CANARY,
                np.array([CANARY, NAN]), [CANARY, None], complex(CANARY, 1.0)]
    row_mechanisms: list[Callable[[], Any]] = [
        lambda: Median(1.0, lower=0.0, upper=1e6), lambda: Quantile(1.0, q=0.9, lower=0.0, upper=1e6),
        lambda: ProposeTestRelease(1.0, delta=1e-6, bound=1.0, statistic="median", lower=0.0, upper=1e6),
        lambda: ProposeTestRelease(1.0, delta=1e-6, bound=1.0, statistic="mean", lower=0.0, upper=1e6),
        lambda: SmoothSensitivity(1.0, delta=1e-6, lower=0.0, upper=1e6)]
    for j, make in enumerate(row_mechanisms):
        for i, bad in enumerate(rows_bad):
            cases.append(pytest.param(lambda acc, mk=make, v=bad: acc.release(mk(), v),
                                      id=f"rows-{j}-{i}"))
    for i, bad in enumerate([TEXT, CANARY, complex(CANARY, 1.0), np.float64(CANARY)]):
        # Rows of any content go to the user's function (its failures are contained); only
        # what is not rows at all is refused.
        cases.append(pytest.param(lambda acc, v=bad: acc.release(
            SampleAndAggregate(1.0, function=np.mean, chunks=3, lower=0.0, upper=1e6), v), id=f"sample-aggregate-{i}"))
    for i, bad in enumerate(rows_bad[:4]):
        cases.append(pytest.param(lambda acc, v=bad: noisy_quantiles(
            acc, v, [0.5], 0.0, 1e6, epsilon=0.5), id=f"quantiles-{i}"))
        cases.append(pytest.param(lambda acc, v=bad: group_by(
            acc, ["a", "b"], ["a", "b"], values=v, statistic="sum", lower=0.0, upper=1e6,
            epsilon=0.5), id=f"group-by-{i}"))
    for i, bad in enumerate([TEXT, [CANARY], CANARY, {TEXT}]):
        cases.append(pytest.param(
            lambda acc, v=bad: acc.release(RandomizedResponse(1.0, categories=["a", "b"]), v), id=f"rr-{i}"))

    def session(cls: Callable[..., Any], value: Any, numeric: bool = False) -> Callable[..., Any]:
        def run(acc: Accountant) -> Any:
            with acc.session(cls(epsilon=0.5, threshold=0.0, sensitivity=1.0,
                                 **({} if cls is AboveThreshold
                                    else {"max_positives": 1}))) as s:
                return s.query(value) if numeric else s.test(value)
        return run

    for i, bad in enumerate([TEXT, [CANARY], complex(CANARY, 1), HUGE, None]):
        cases.append(pytest.param(session(AboveThreshold, bad), id=f"svt-test-{i}"))
        cases.append(pytest.param(session(Sparse, bad), id=f"sparse-test-{i}"))
        cases.append(pytest.param(session(NumericSparse, bad, True), id=f"numeric-query-{i}"))
    helpers: list[Callable[[Accountant], Any]] = [
        lambda acc: true_clamped_sum([CANARY, NAN], 0.0, 1.0),
        lambda acc: true_clamped_sum(TEXT, 0.0, 1.0),
        lambda acc: true_clamped_sum([[CANARY], [1.0, 2.0]], 0.0, 1.0),
        lambda acc: true_clamped_sum(np.array([[CANARY, 1.0]]), 0.0, 1.0),
        lambda acc: true_histogram([TEXT, "a"], ["a", "b"]),
        lambda acc: true_histogram([CANARY], [1.0, 2.0]),
        lambda acc: true_count(CANARY),
        lambda acc: noisy_mean(acc, [CANARY, NAN], 0.0, 1.0, epsilon=0.5),
        lambda acc: acc.release_many([(Laplace(0.1, sensitivity=1.0), CANARY, TEXT)]),
        lambda acc: acc.release_many([(Laplace(0.1, sensitivity=1.0), [CANARY, NAN])]),
        lambda acc: acc.release_many(TEXT),
        lambda acc: acc.release(Laplace(5.0, sensitivity=1.0), CANARY),  # refused: over the budget
        lambda acc: acc.release(Laplace(0.1, sensitivity=1.0), CANARY, dataset="unknown"),
        # Data passed where a name belongs (arguments swapped): described, never shown, and
        # never written to the refusal log.
        lambda acc: acc.release(Laplace(0.1, sensitivity=1.0), "default", dataset=CANARY),
        lambda acc: acc.release(Laplace(0.1, sensitivity=1.0), 1.0, analyst=CANARY),
        lambda acc: acc.release(Laplace(0.1, sensitivity=1.0), 1.0, label=CANARY),
        lambda acc: acc.release(Laplace(0.1, sensitivity=1.0), 1.0, label=TEXT * 40),
        lambda acc: acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=["default", CANARY]),
        lambda acc: acc.pipeline("p", dataset=CANARY, budget=Budget(0.1)),
        lambda acc: acc.session(Sparse(0.5, threshold=CANARY * 0 + 1.0, max_positives=1, sensitivity=1.0),
                                dataset=np.array([CANARY])),
    ]
    for i, call in enumerate(helpers):
        cases.append(pytest.param(call, id=f"helper-{i}"))
    # Containers where a frame or a filter's values belong (issue 33, second review): their repr
    # prints their cells; the error shows their type and size only.
    for i, bad in enumerate(_containers()):
        cases.append(pytest.param(lambda acc, v=bad: table(acc, v, dataset="default"),
                                  id=f"table-frame-{i}"))
        cases.append(pytest.param(lambda acc, v=bad: _unit_table().filter("u", "in", v).count(
            epsilon=0.5, max_rows_per_unit=1), id=f"table-in-{i}"))
        cases.append(pytest.param(lambda acc, v=bad: table(v, acc, dataset="default"),
                                  id=f"table-swapped-{i}"))
    return cases


def _containers() -> list[Any]:
    import pandas as pd
    import pyarrow as pa
    return [pd.Series([TEXT, CANARY]), pa.table({"x": [TEXT]}), [TEXT, CANARY],
            np.rec.fromrecords([(TEXT, CANARY)]), np.array([TEXT]), {TEXT: CANARY}]


def _unit_table() -> Any:
    import pandas as pd
    acc = Accountant(limits={"t": DatasetLimit(limit=Budget(1.0), privacy_unit="u")}, rng=0)
    return table(acc, pd.DataFrame({"u": [1]}), dataset="t")


def _leaks(text: str) -> bool:
    return any(mark in text for mark in MARKS)


@pytest.mark.parametrize("call", _cases())
def test_the_canary_never_leaks(call: Callable[[Accountant], Any],
                                caplog: pytest.LogCaptureFixture) -> None:
    acc = Accountant(limits={"default": Budget(1.0, 1e-6)}, rng=0)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(PrivacyError) as info:
            call(acc)
    err = info.value
    rendered = [str(err), repr(err), *map(repr, err.args),
                *(repr(v) for v in vars(err).values())]
    assert not any(_leaks(r) for r in rendered), rendered
    assert not _leaks(caplog.text)
    assert not any(_leaks(e.text) for e in acc.ledger.entries())


def test_the_canary_test_can_fail() -> None:
    """Negative control: an error that does show its value is caught by the same check."""
    from dpbudget.accountant import InvalidArgumentError

    err = InvalidArgumentError("value", CANARY, "anything")  # the parameter form shows values
    assert _leaks(str(err))


def test_a_containers_repr_shows_its_cells() -> None:
    """Negative control for the container cases: the repr an error once printed holds the
    canary, for each of them."""
    assert all(_leaks(repr(c)) for c in _containers())


def test_errors_still_say_where_the_problem_is() -> None:
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(PrivacyError, match=r"value\[1\] is not finite") as info:
        acc.release(Laplace(0.5, sensitivity=1.0), [CANARY, NAN])
    assert "a list of length 2" in str(info.value)
    with pytest.raises(PrivacyError, match=r"shape \(2, 2\) and dtype float64"):
        acc.release(Laplace(0.5, sensitivity=1.0), np.array([[CANARY, 1.0], [NAN, 2.0]]))
