"""The argument checks every public constructor shares (``dpbudget.accountant.values._validate``):
NaN fails every range check, bools and strings are not numbers, and a name that is not a string is
described, never shown (it is often data passed in the wrong place)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("check", [_validate.finite, _validate.positive, _validate.non_negative,
                                   _validate.probability])
@pytest.mark.parametrize("value", [NAN, np.float64("nan"), INF, -INF])
def test_nan_and_infinity_fail_every_range_check(check, value) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check("epsilon", value)
    assert info.value.argument == "epsilon"


@pytest.mark.parametrize("value", [True, "1.0", None, [1.0], 1j, Decimal("0.25")])
def test_a_bool_a_string_or_a_decimal_is_not_a_real_number(value) -> None:
    with pytest.raises(InvalidTypeError):
        _validate.real("epsilon", value)


@pytest.mark.parametrize("value", [0.25, np.float32(0.25), Fraction(1, 4), np.int64(1)])
def test_numbers_of_every_kind_come_back_as_plain_floats(value) -> None:
    x = _validate.positive("epsilon", value)
    assert type(x) is float and x == float(value)


@pytest.mark.parametrize(("check", "ok", "bad"), [
    (_validate.positive, 1e-300, 0.0),
    (_validate.non_negative, 0.0, -1e-300),
    (_validate.probability, 0.0, 1.0),
])
def test_each_range_check_admits_its_edge_and_refuses_the_next(check, ok, bad) -> None:
    assert check("x", ok) == ok
    with pytest.raises(InvalidArgumentError):
        check("x", bad)


def test_an_open_probability_refuses_zero() -> None:
    with pytest.raises(InvalidArgumentError, match=r"\(0, 1\)"):
        _validate.probability("delta", 0.0, low_open=True)


def test_an_int_beyond_float_range_is_an_argument_error_not_an_overflow() -> None:
    with pytest.raises(InvalidArgumentError, match="float range"):
        _validate.real("sensitivity", 10 ** 400)


def test_positive_int_refuses_bools_floats_and_zero() -> None:
    assert _validate.positive_int("n", np.int64(3)) == 3
    for value, error in ((True, InvalidTypeError), (2.0, InvalidTypeError), (0, InvalidArgumentError)):
        with pytest.raises(error):
            _validate.positive_int("n", value)


@pytest.mark.parametrize("value", [7351911.25, np.array([7351911.25]), "", " ", "x" * 257])
def test_a_name_that_is_not_one_is_described_never_shown(value) -> None:
    with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
        _validate.text("dataset", value)
    assert "7351911" not in str(info.value) and "xxxx" not in str(info.value)
    assert _validate.text("dataset", None, optional=True) is None


def test_in_model_turns_a_type_error_into_a_value_error() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        _validate.in_model(_validate.real, "epsilon", "x")
    assert isinstance(info.value, ValueError) and not math.isnan(_validate.in_model(_validate.real, "e", 1.0))
