"""Argument checks shared by every public constructor, written so that NaN fails.

Each check returns the value as a plain Python ``float`` (so that numpy scalars and ``Fraction``
behave like floats downstream) or raises a typed error naming the argument. A ``Decimal`` is not a
``numbers.Real`` and is refused like any other non-real type.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
    as_value_error,
)


def real(name: str, value: Any) -> float:
    """A real number (not a bool, not a string); may still be NaN or infinite."""
    if type(value) is float:  # the common case, without the (slow) numbers.Real ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(name, value, "a real number")
    try:
        return float(value)
    except OverflowError:  # an int beyond the largest double
        raise InvalidArgumentError(name, value, "a finite number within float range") from None


def finite(name: str, value: Any) -> float:
    x = real(name, value)
    if not math.isfinite(x):
        raise InvalidArgumentError(name, value, "a finite number")
    return x


def positive(name: str, value: Any) -> float:
    """A finite number > 0."""
    x = real(name, value)
    if not (0.0 < x < math.inf):
        raise InvalidArgumentError(name, value, "a finite number > 0")
    return x


def non_negative(name: str, value: Any) -> float:
    """A finite number >= 0."""
    x = real(name, value)
    if not (0.0 <= x < math.inf):
        raise InvalidArgumentError(name, value, "a finite number >= 0")
    return x


def probability(name: str, value: Any, *, low_open: bool = False) -> float:
    """A number in [0, 1) (or (0, 1) when ``low_open``)."""
    x = real(name, value)
    ok = (0.0 < x < 1.0) if low_open else (0.0 <= x < 1.0)
    if not ok:
        raise InvalidArgumentError(name, value, "a number in (0, 1)" if low_open else
                                   "a number in [0, 1)")
    return x


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(name, value, "an integer")
    if value < 1:
        raise InvalidArgumentError(name, value, "an integer >= 1")
    return int(value)


def text(name: str, value: Any, *, optional: bool = False) -> str | None:
    """A non-empty string (or None when ``optional``).

    A name that is not one (a dataset name, an analyst, a label) is often data passed in the
    wrong place — ``release(m, "adult", dataset=value)`` — so the complaint describes it and
    never shows it."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidDataTypeError(name, value, "a string" + (" or None" if optional else ""))
    if not value.strip() or len(value) > 256:
        raise InvalidDataError(name, value, "a non-empty string of at most 256 characters")
    return value


def in_model(check: Callable[..., T], *args: Any) -> T:
    """``check(*args)`` called from a pydantic validator: a wrong type is re-raised as an
    ``InvalidArgumentError`` (a ``ValueError``) with the same message, because pydantic reports
    a ``ValueError`` with the key's location but lets a ``TypeError`` escape without it."""
    try:
        return check(*args)
    except InvalidTypeError as exc:
        raise as_value_error(exc) from None
