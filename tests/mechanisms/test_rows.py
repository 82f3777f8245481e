"""Validation of a column of rows and of a public clamping range (``mechanisms.rows``): pandas is
an accepted input wherever a numpy array is (a Series or DataFrame column through the numeric
mechanisms and the helpers, as the array of its values); NaN, non-numbers and bad bounds are
refused, typed, naming the argument and never showing the data."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.values.errors import InvalidDataError, InvalidDataTypeError
from dpbudget.mechanisms import AnalyticGaussian, Laplace, Median, noisy_mean
from dpbudget.mechanisms.queries import true_clamped_sum
from dpbudget.mechanisms.rows import clamp_range, row_values


@pytest.fixture
def pd() -> Any:
    """pandas (an optional dependency): only the tests that take it are skipped without it."""
    return pytest.importorskip("pandas")


@pytest.mark.parametrize("make", [lambda: Laplace(0.5, sensitivity=1.0), lambda: AnalyticGaussian(0.5, delta=1e-6, sensitivity=1.0)])
def test_numeric_mechanisms_take_a_series_and_a_frame(make: object, pd: Any) -> None:
    acc = Accountant(Budget(10.0, 1e-3), rng=0)
    series = pd.Series([1.0, 2.0, 3.0], index=["a", "b", "c"])
    out = acc.release(make(), series)  # type: ignore[operator]
    assert isinstance(out, np.ndarray) and out.shape == (3,)
    frame = pd.DataFrame({"x": [1.0, 2.0], "y": [3, 4]})
    assert acc.release(make(), frame).shape == (2, 2)  # type: ignore[operator]


def test_pandas_bad_values_are_typed_and_hidden(pd: Any) -> None:
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(InvalidDataTypeError):
        acc.release(Laplace(0.1, sensitivity=1.0), pd.Series(["secret-a", "secret-b"]))
    with pytest.raises(InvalidDataError) as caught:
        acc.release(Laplace(0.1, sensitivity=1.0), pd.Series([424242.0, math.nan]))
    assert "424242" not in str(caught.value)
    assert acc.spent() == Budget(0.0)


def test_helpers_and_selection_take_a_column(pd: Any) -> None:
    frame = pd.DataFrame({"age": np.arange(20.0, 80.0)})
    acc = Accountant(Budget(3.0), rng=1)
    assert true_clamped_sum(frame["age"], 0, 100).value == float(np.arange(20.0, 80.0).sum())
    assert 0 <= noisy_mean(acc, frame["age"], 0, 100, epsilon=1.0) <= 100
    assert 0 <= acc.release(Median(1.0, lower=0.0, upper=100.0), frame["age"]) <= 100


@pytest.mark.parametrize("make", [lambda: Median(1.0, lower=0.0, upper=1.0),
                                  lambda: __import__("dpbudget.mechanisms").mechanisms.SmoothSensitivity(
                                      1.0, delta=1e-6, lower=0.0, upper=1.0)])
def test_a_complex_column_is_refused_not_truncated(make: object) -> None:
    """numpy would cast complex to float by dropping the imaginary part (a different value than
    the caller's): refused, typed, before anything is debited."""
    acc = Accountant(Budget(1.0, 1e-5), rng=0)
    with pytest.raises(InvalidDataTypeError):
        acc.release(make(), np.array([1 + 2j, 3 + 0j]))  # type: ignore[operator]
    with pytest.raises(InvalidDataTypeError):
        true_clamped_sum(np.array([1 + 2j]), 0, 1)
    assert acc.spent() == Budget(0.0)


def test_nan_data_is_refused_naming_its_row():
    with pytest.raises(InvalidArgumentError, match=r"data\[1\] is nan"):
        true_clamped_sum([1.0, float("nan")], 0, 1)


@pytest.mark.parametrize("bad", [["x", "y"], [[1.0], [2.0]], [True, False]])
def test_non_numeric_data_is_a_type_error(bad):
    with pytest.raises(InvalidTypeError):
        true_clamped_sum(bad, 0, 1)


@pytest.mark.parametrize("lower,upper", [(1, 1), (2, 1), (float("nan"), 1), (0, float("inf"))])
def test_bad_bounds(lower, upper):
    with pytest.raises(InvalidArgumentError):
        true_clamped_sum([1.0], lower, upper)


def test_row_values_and_clamp_range_keep_their_documented_contract() -> None:
    """``row_values``: a new float64 array (never the caller's, which clamping must not touch),
    ±inf kept for clamping to bound, NaN refused naming its index and not its neighbours' values.
    ``clamp_range``: a range whose width overflows is refused, where the float subtraction alone
    (the negative control) gives inf and would scale the noise to it."""
    data = np.array([1.5, -np.inf, np.inf, 2.0])
    rows = row_values(data)
    assert rows.dtype == np.float64 and not np.shares_memory(rows, data)
    assert list(rows) == [1.5, -np.inf, np.inf, 2.0]
    with pytest.raises(InvalidDataError, match=r"rows\[2\] is nan") as info:
        row_values([123456.75, 2.0, math.nan], name="rows")
    assert "123456" not in str(info.value)
    assert clamp_range(-1.0, 2) == (-1.0, 2.0)
    assert math.isinf(1e308 - (-1e308))
    with pytest.raises(InvalidArgumentError, match="upper − lower must be a finite double"):
        clamp_range(-1e308, 1e308)
