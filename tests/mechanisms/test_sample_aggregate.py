"""``SampleAndAggregate``: the chunks are a disjoint random cover of the rows, drawn only after
the debit; the noise is Laplace((upper − lower)/(kε)) (KS, α = 1e-6, with the power check and a
broken variant — noise not divided by k — as negative control); a function that fails or answers
nonsense never escapes after the debit; bad input is typed and changes nothing."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.values.errors import InvalidDataTypeError
from dpbudget.mechanisms.sample_aggregate import SampleAndAggregate
from dpbudget.mechanisms.sampling import Sampler
from tests.mechanisms.stat_checks import ALPHA, ks_with_power, laplace_cdf


def test_chunks_are_a_disjoint_cover_of_the_rows() -> None:
    seen: list[np.ndarray] = []

    def spy(rows: np.ndarray) -> float:
        seen.append(np.array(rows))
        return 1.0

    acc = Accountant(Budget(1.0), rng=0)
    acc.release(SampleAndAggregate(1.0, function=spy, chunks=7, lower=0.0, upper=10.0), np.arange(1000))
    assert len(seen) == 7
    together = np.sort(np.concatenate(seen))
    assert np.array_equal(together, np.arange(1000))  # every row once, in exactly one chunk
    sizes = [len(c) for c in seen]
    # Independent uniform assignment: the sizes are multinomial(1000, 1/7) — neither too uneven
    # nor too even (a fixed split into equal chunks would pass the first check).
    assert ALPHA < stats.chisquare(sizes).pvalue < 1 - ALPHA


def test_each_row_lands_in_a_uniform_chunk_whatever_its_position() -> None:
    """Over many releases, the chunk holding the first row, and the one holding the last, is
    uniform on the k chunks (a contiguous split would always put row 0 in chunk 0)."""
    seen: list[list[int]] = []
    m = SampleAndAggregate(1.0, function=lambda rows: seen.append(list(rows)) or 0.5, chunks=5, lower=0.0, upper=1.0)
    first, last = np.zeros(5), np.zeros(5)
    for seed in range(600):
        seen.clear()
        m.draw(m.prepare(list(range(40))), Sampler(seed))
        first[[0 in chunk for chunk in seen].index(True)] += 1
        last[[39 in chunk for chunk in seen].index(True)] += 1
    assert stats.chisquare(first).pvalue > ALPHA and stats.chisquare(last).pvalue > ALPHA
    assert stats.chisquare([600, 0, 0, 0, 0]).pvalue < ALPHA  # power: a fixed chunk is seen


def _noise(m: SampleAndAggregate, n: int, seed: int) -> np.ndarray:
    sampler = Sampler(seed)
    rows = m.prepare(np.zeros(50))
    return np.array([m.draw(rows, sampler) for _ in range(n)]) - 50.0


def test_noise_scale_is_range_over_k_epsilon() -> None:
    """A function that answers 50 on every chunk: the release is 50 + Lap(100/(kε)), clamped to
    [0, 100] (far from the bounds here)."""
    m = SampleAndAggregate(2.0, function=lambda rows: 50.0, chunks=20, lower=0.0, upper=100.0)
    ks_with_power(_noise(m, 20_000, seed=31), laplace_cdf, 100.0 / (20 * 2.0))


def test_negative_control_noise_not_divided_by_k_is_rejected() -> None:
    m = SampleAndAggregate(2.0, function=lambda rows: 50.0, chunks=20, lower=0.0, upper=100.0)
    samples = _noise(m, 20_000, seed=32)
    assert stats.kstest(samples, lambda x: laplace_cdf(x, 100.0 / 2.0)).pvalue < ALPHA


def test_a_failing_function_never_escapes_after_the_debit() -> None:
    calls = []

    def fragile(rows: np.ndarray) -> Any:
        calls.append(len(rows))
        if len(calls) % 3 == 0:
            raise ValueError(f"secret row count {len(rows)}")
        return math.nan if len(calls) % 3 == 1 else "not a number"

    acc = Accountant(Budget(1.0), rng=1)
    answer = acc.release(SampleAndAggregate(1.0, function=fragile, chunks=6, lower=0.0, upper=10.0), list(range(60)))
    assert 0.0 <= answer <= 10.0 and len(calls) == 6
    assert acc.spent() == Budget(1.0)


def test_the_declared_cost_is_debited_and_the_ledger_holds_no_data() -> None:
    acc = Accountant(Budget(1.0), rng=2)
    m = SampleAndAggregate(0.5, function=np.mean, chunks=10, lower=0.0, upper=1e6)
    acc.release(m, np.full(100, 987654.321))
    record = [e for e in acc.ledger.entries() if e.record["kind"] == "release"][0]
    assert record.record["cost"]["epsilon"] == 0.5
    assert record.record["mechanism"]["params"]["function"] == "mean"
    assert "987654" not in record.text


def test_pandas_rows_are_accepted() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"age": np.arange(100.0), "income": np.arange(100.0) * 2})
    m = SampleAndAggregate(1.0, function=lambda rows: rows["income"].mean(), chunks=5, lower=0.0, upper=400.0)
    assert 0.0 <= Accountant(None, rng=3).release(m, frame) <= 400.0


@pytest.mark.parametrize("kwargs, error, argument", [
    ({"function": 3}, InvalidTypeError, "function"),
    ({"chunks": 0}, InvalidArgumentError, "chunks"),
    ({"chunks": True}, InvalidTypeError, "chunks"),
    ({"chunks": 2.0}, InvalidTypeError, "chunks"),
    ({"lower": 1.0, "upper": 0.0}, InvalidArgumentError, "upper"),
    ({"epsilon": -1.0}, InvalidArgumentError, "epsilon"),
])
def test_bad_constructions_are_typed(kwargs: dict[str, Any], error: type, argument: str) -> None:
    params: dict[str, Any] = {"epsilon": 1.0, "function": np.mean, "chunks": 5, "lower": 0.0,
                              "upper": 1.0, **kwargs}
    with pytest.raises(error) as caught:
        SampleAndAggregate(**params)
    assert caught.value.argument == argument


@pytest.mark.parametrize("bad", ["rows", 5, 3.0, None, np.float64(2.0), np.array(4.0)])
def test_bad_rows_are_refused_before_anything(bad: Any) -> None:
    rng = np.random.default_rng(4)
    acc = Accountant(Budget(1.0), rng=rng)
    state = rng.bit_generator.state
    with pytest.raises(InvalidDataTypeError):
        acc.release(SampleAndAggregate(1.0, function=np.mean, chunks=5, lower=0.0, upper=1.0), bad)
    assert rng.bit_generator.state == state and acc.spent() == Budget(0.0)
