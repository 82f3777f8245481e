"""``dpbudget.accountant.values._numeric``: every rounding is on the safe side, checked exactly with
``Fraction``."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpbudget.accountant.values._numeric import RELATIVE_TOLERANCE, add_up, div_up, mul_up, sub_down, within

finite = st.floats(allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=5e-324, allow_infinity=False, allow_nan=False)
ULP_FACTOR = Fraction(1, 2 ** 51)  # two ulps, relative


@settings(max_examples=600, deadline=None)
@given(a=finite, b=finite)
def test_add_up_never_below_exact_sum(a: float, b: float) -> None:
    s = add_up(a, b)
    exact = Fraction(a) + Fraction(b)
    if math.isinf(s):  # overflow: +inf is above any finite sum; -inf only if exact is below -max
        assert s > 0 or exact < -Fraction(sys.float_info.max)
        return
    assert Fraction(s) >= exact
    # ... and tight: nearest-rounding plus at most one ulp.
    assert s == a + b or s == math.nextafter(a + b, math.inf)
    assert add_up(a, b) == add_up(b, a)


@settings(max_examples=600, deadline=None)
@given(a=finite, b=finite)
def test_sub_down_never_above_exact_difference(a: float, b: float) -> None:
    d = sub_down(a, b)
    exact = Fraction(a) - Fraction(b)
    if math.isinf(d):
        assert d < 0 or exact > Fraction(sys.float_info.max)
        return
    assert Fraction(d) <= exact
    assert d == a - b or d == math.nextafter(a - b, -math.inf)


@pytest.mark.parametrize(("a", "b"), [
    (0.1, 0.2), (1.0, 1e-17), (1e16, 1.0), (0.01, 0.01), (-0.1, 0.3), (5e-324, 5e-324),
    (1.0, -1.0), (0.0, 0.0), (-0.0, 0.0),
])
def test_add_up_and_sub_down_examples(a: float, b: float) -> None:
    assert Fraction(add_up(a, b)) >= Fraction(a) + Fraction(b)
    assert Fraction(sub_down(a, b)) <= Fraction(a) - Fraction(b)


def test_add_up_bumps_only_when_rounding_lost_something() -> None:
    assert add_up(0.5, 0.25) == 0.75  # exact: no bump
    assert add_up(1.0, 1e-17) == math.nextafter(1.0, 2.0)  # 1 + tiny rounds to 1: bumped
    assert add_up(math.inf, 1.0) == math.inf
    assert add_up(sys.float_info.max, sys.float_info.max) == math.inf


def test_running_sum_of_hundredths_stays_within_tolerance() -> None:
    total = 0.0
    for _ in range(100):
        total = add_up(total, 0.01)
    assert Fraction(total) >= 100 * Fraction(0.01)  # never below the exact sum
    assert within(total, 1.0)  # ... and within the documented slack of 1.0
    assert total - 1.0 < 1e-14


@settings(max_examples=400, deadline=None)
@given(a=positive, b=positive)
def test_div_up_never_below_exact(a: float, b: float) -> None:
    q = div_up(a, b)
    assert q == math.inf or Fraction(q) >= Fraction(a) / Fraction(b)


@settings(max_examples=400, deadline=None)
@given(a=st.floats(min_value=0.0, allow_infinity=False, allow_nan=False),
       b=st.floats(min_value=0.0, allow_infinity=False, allow_nan=False))
def test_mul_up_never_below_exact(a: float, b: float) -> None:
    p = mul_up(a, b)
    assert p == math.inf or Fraction(p) >= Fraction(a) * Fraction(b)


def test_mul_up_underflow_is_not_rounded_to_zero() -> None:
    """A product of positive numbers that underflows must round up to the smallest subnormal, not
    down to 0 (the docstring promises "rounded up")."""
    assert mul_up(1e-200, 1e-200) > 0.0
    assert mul_up(0.0, 1e-200) == 0.0


def test_within_tolerance() -> None:
    assert RELATIVE_TOLERANCE == 1e-9
    assert within(1.0, 1.0)
    assert within(0.5, 1.0)
    assert within(1.0 + 0.9e-9, 1.0)
    assert not within(1.0 + 1.1e-9, 1.0)
    assert within(0.0, 0.0)
    assert not within(1e-300, 0.0)  # a zero limit admits nothing at all
    assert within(1e-6 * (1 + 0.5e-9), 1e-6)
    assert not within(1e-6 * (1 + 2e-9), 1e-6)
    assert not within(math.nan, 1.0)
