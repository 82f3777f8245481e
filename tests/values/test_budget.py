"""``Budget``: validated on construction with typed errors, immutable, a partial order, and addition
that rounds up; also when nested in another pydantic model."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from dpbudget.accountant import Budget, InvalidArgumentError, InvalidTypeError, PrivacyError
from dpbudget.policies import DatasetLimit
from tests.contracts import assert_names

NAN, INF = float("nan"), float("inf")


# -- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("epsilon", "delta", "argument"), [
    (NAN, 0.0, "epsilon"),
    (np.float64("nan"), 0.0, "epsilon"),
    (-1.0, 0.0, "epsilon"),
    (-1e-300, 0.0, "epsilon"),
    (-INF, 0.0, "epsilon"),
    (INF, 1e-6, "delta"),  # "no limit" with a δ is meaningless
    (1.0, NAN, "delta"),
    (1.0, -1e-12, "delta"),
    (1.0, 1.0, "delta"),
    (1.0, 1.5, "delta"),
    (1.0, INF, "delta"),
    (1.0, -INF, "delta"),
    # too large for a double: a typed error, not OverflowError
    pytest.param(10 ** 400, 0.0, "epsilon", id="huge-int"),
])
def test_bad_values_rejected(epsilon: Any, delta: Any, argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Budget(epsilon, delta)
    assert isinstance(info.value, PrivacyError) and isinstance(info.value, ValueError)
    assert_names(info.value, argument, epsilon if argument == "epsilon" else delta)


@pytest.mark.parametrize(("epsilon", "delta", "argument", "value"), [
    ("1.0", 0.0, "epsilon", "1.0"),
    (b"1", 0.0, "epsilon", b"1"),
    (True, 0.0, "epsilon", True),
    (False, 0.0, "epsilon", False),
    (np.bool_(True), 0.0, "epsilon", None),
    ([1.0], 0.0, "epsilon", [1.0]),
    (1 + 0j, 0.0, "epsilon", 1 + 0j),
    (1.0, "0", "delta", "0"),
    (1.0, True, "delta", True),
    (1.0, None, "delta", None),
    (1.0, [1e-6], "delta", [1e-6]),
])
def test_wrong_types_rejected(epsilon: Any, delta: Any, argument: str, value: Any) -> None:
    with pytest.raises(InvalidTypeError) as info:
        Budget(epsilon, delta)
    assert isinstance(info.value, PrivacyError) and isinstance(info.value, TypeError)
    assert info.value.argument == argument
    assert repr(argument) in str(info.value)
    if value is not None or argument == "delta":
        assert repr(value) in str(info.value)


def test_keyword_construction_and_errors() -> None:
    assert Budget(epsilon=1.0, delta=1e-6) == Budget(1.0, 1e-6)
    with pytest.raises(InvalidArgumentError) as info:
        Budget(epsilon=NAN)
    assert info.value.argument == "epsilon"
    with pytest.raises(InvalidArgumentError) as info:
        Budget()  # epsilon is required
    assert info.value.argument == "epsilon"
    with pytest.raises(InvalidArgumentError) as info:
        Budget(1.0, rho=0.5)  # extra="forbid"
    assert "rho" in str(info.value)


@pytest.mark.parametrize("value", [0, 0.0, 1, 2.5, np.float64(0.1), np.float32(0.5), np.int64(3),
                                   Fraction(1, 10), 1e300])
def test_real_numbers_accepted_as_floats(value: Any) -> None:
    b = Budget(value, Fraction(1, 10 ** 6))
    assert type(b.epsilon) is float and type(b.delta) is float
    assert b.epsilon == float(value) and b.delta == 1e-6


def test_edges_accepted() -> None:
    assert Budget(0.0).epsilon == 0.0
    assert Budget(1.0, 0.0).delta == 0.0
    assert Budget(1.0, math.nextafter(1.0, 0.0)).delta < 1.0
    assert Budget(INF).is_unlimited and Budget.unlimited() == Budget(INF, 0.0)
    assert not Budget(1e308).is_unlimited
    assert Budget(5e-324, 5e-324).delta == 5e-324


def test_decimal_is_not_silently_accepted_as_float() -> None:
    # Decimal is not a numbers.Real; it is refused with a typed error rather than coerced.
    with pytest.raises(InvalidTypeError):
        Budget(Decimal("0.1"))


# -- immutability, equality, hashing ---------------------------------------------------------------

def test_immutable() -> None:
    b = Budget(1.0, 1e-6)
    with pytest.raises((ValidationError, AttributeError, TypeError)):
        b.epsilon = 2.0  # type: ignore[misc]
    with pytest.raises((ValidationError, AttributeError, TypeError)):
        b.delta = 0.5  # type: ignore[misc]
    with pytest.raises((ValidationError, AttributeError, TypeError)):
        b.rho = 1.0  # type: ignore[attr-defined]
    assert b == Budget(1.0, 1e-6)


def test_equality_hash_repr_and_serialisation() -> None:
    a, b = Budget(0.5, 1e-7), Budget(0.5, 1e-7)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Budget(0.5, 2e-7) and a != Budget(0.6, 1e-7)
    assert repr(a) == "Budget(epsilon=0.5, delta=1e-07)" == str(a)
    assert eval(repr(a), {"Budget": Budget}) == a
    assert a.model_dump() == {"epsilon": 0.5, "delta": 1e-7}
    assert Budget.model_validate_json(a.model_dump_json()) == a
    assert json.loads(a.model_dump_json()) == {"epsilon": 0.5, "delta": 1e-7}


@pytest.mark.parametrize("payload", [
    '{"epsilon": NaN}', '{"epsilon": -1}', '{"epsilon": 1, "delta": 1}', '{"epsilon": "1"}',
    '{"epsilon": 1, "extra": 0}', '{"delta": 0.1}', '{"epsilon": Infinity, "delta": 0.1}',
])
def test_model_validate_json_rejects(payload: str) -> None:
    with pytest.raises((ValidationError, PrivacyError)):
        Budget.model_validate_json(payload)


# -- partial order --------------------------------------------------------------------------------

def test_partial_order() -> None:
    small, big = Budget(0.1, 1e-7), Budget(1.0, 1e-6)
    assert small <= big and big >= small
    assert not big <= small and not small >= big
    assert small <= small and small >= small
    # incomparable: more ε but less δ
    a, b = Budget(1.0, 0.0), Budget(0.5, 1e-6)
    assert not a <= b and not b <= a and not a >= b and not b >= a
    # the unlimited budget is the top element
    assert Budget(1e300, 0.9) <= Budget.unlimited()
    assert not Budget.unlimited() <= Budget(1e300, 0.9)
    assert Budget.unlimited() <= Budget.unlimited()


def test_comparison_with_non_budget_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Budget(1.0) <= 1.0  # noqa: B015
    with pytest.raises(TypeError):
        Budget(1.0) >= (1.0, 0.0)  # noqa: B015


budgets = st.builds(Budget, st.floats(0.0, 1e6), st.floats(0.0, 0.999))


@settings(max_examples=150, deadline=None)
@given(a=budgets, b=budgets, c=budgets)
def test_partial_order_laws(a: Budget, b: Budget, c: Budget) -> None:
    assert a <= a
    if a <= b and b <= a:
        assert a == b
    if a <= b and b <= c:
        assert a <= c
    assert (a <= b) == (b >= a)
    assert (a <= b) == (a.epsilon <= b.epsilon and a.delta <= b.delta)


# -- addition -------------------------------------------------------------------------------------

@settings(max_examples=250, deadline=None)
@given(a=budgets, b=budgets)
def test_addition_rounds_up(a: Budget, b: Budget) -> None:
    s = a + b
    assert isinstance(s, Budget)
    assert Fraction(s.epsilon) >= Fraction(a.epsilon) + Fraction(b.epsilon)
    exact_delta = Fraction(a.delta) + Fraction(b.delta)
    if exact_delta < 1:
        assert Fraction(s.delta) >= exact_delta
    assert s.delta < 1.0
    assert a <= s and b <= s
    assert s == b + a


def test_addition_examples() -> None:
    assert Budget(0.5) + Budget(0.25, 1e-7) == Budget(0.75, 1e-7)
    s = Budget(0.1) + Budget(0.2)
    assert Fraction(s.epsilon) >= Fraction(0.1) + Fraction(0.2)
    total = Budget(0.0)
    for _ in range(100):
        total = total + Budget(0.01, 1e-8)
    assert Fraction(total.epsilon) >= 100 * Fraction(0.01)
    assert Fraction(total.delta) >= 100 * Fraction(1e-8)
    with pytest.raises(TypeError):
        Budget(1.0) + 1.0  # type: ignore[operator]


def test_adding_to_unlimited_stays_unlimited() -> None:
    """Unlimited plus any cost is unlimited; ``__add__`` must not build an invalid
    ``Budget(inf, δ > 0)`` and raise an error about an argument the caller never passed."""
    assert (Budget.unlimited() + Budget(1.0, 1e-6)).is_unlimited
    assert (Budget(1.0, 1e-6) + Budget.unlimited()).is_unlimited


# -- nested in other models -----------------------------------------------------------------------

class Policy(BaseModel):
    limit: Budget
    per_query: Budget | None = None


def test_nested_valid() -> None:
    p = Policy(limit={"epsilon": 1.0, "delta": 1e-6}, per_query=Budget(0.1))
    assert p.limit == Budget(1.0, 1e-6) and isinstance(p.limit, Budget)
    assert p.per_query == Budget(0.1)
    assert Policy.model_validate_json('{"limit": {"epsilon": 2}}').limit == Budget(2.0)


@pytest.mark.parametrize(("payload", "needle"), [
    ({"epsilon": NAN}, "nan"),
    ({"epsilon": -1.0}, "-1.0"),
    ({"epsilon": 1.0, "delta": 1.0}, "delta"),
    ({"epsilon": INF, "delta": 0.5}, "delta"),
    ({"epsilon": 1.0, "rho": 0.1}, "rho"),
    ({"epsilon": "1"}, "epsilon"),
    ({"epsilon": True}, "epsilon"),
    ({"delta": 0.1}, "epsilon"),
])
def test_nested_invalid(payload: dict[str, Any], needle: str) -> None:
    with pytest.raises((ValidationError, PrivacyError)) as info:
        Policy(limit=payload)
    assert needle in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))


def test_nested_invalid_from_json() -> None:
    with pytest.raises((ValidationError, PrivacyError)) as info:
        Policy.model_validate_json('{"limit": {"epsilon": NaN}}')
    assert "epsilon" in str(info.value) and "nan" in str(info.value)


def test_nested_in_dataset_limit_gives_typed_error_with_path() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        DatasetLimit(limit={"epsilon": NAN})
    assert "limit" in str(info.value) and "epsilon" in str(info.value) and "nan" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        DatasetLimit(limit=Budget(1.0), composition="fancy")
    assert "composition" in str(info.value) and "fancy" in str(info.value)
    with pytest.raises(PrivacyError):
        DatasetLimit(limit={"epsilon": "x"})
    with pytest.raises(InvalidArgumentError):
        DatasetLimit(limit=Budget(1.0), bogus=1)
    limit = DatasetLimit(limit={"epsilon": 1.0, "delta": 1e-6})
    assert limit.limit == Budget(1.0, 1e-6) and limit.composition == "basic"
    with pytest.raises((ValidationError, AttributeError, TypeError)):
        limit.composition = "other"  # type: ignore[misc]
