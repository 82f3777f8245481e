"""Validation of a column of rows and of a public clamping range, shared by the query helpers
and every mechanism that takes rows (quantiles, PTR, smooth sensitivity, sample-and-aggregate,
group-by). Errors name the argument and describe the data, never show it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError, InvalidDataTypeError

__all__ = ["clamp_range", "row_values"]


def row_values(data: Any, name: str = "data") -> np.ndarray:
    """A one-dimensional sequence of real numbers (a list, array or pandas Series) as a new
    ``float64`` array; ±inf is kept (clamping bounds it), NaN refused naming its index.

    Raises:
        InvalidDataTypeError: not one-dimensional, or not real numbers (strings, booleans,
            complex numbers, ragged nesting).
        InvalidDataError: a NaN entry.
    """
    if isinstance(data, (str, bytes)) or not hasattr(data, "__len__"):
        raise InvalidDataTypeError(name, data, "a one-dimensional sequence of numbers")
    try:
        arr = np.asarray(data)
    except Exception:  # ragged (or an object whose conversion fails)
        raise InvalidDataTypeError(name, data, "a one-dimensional sequence of numbers") from None
    if (arr.ndim != 1 or arr.dtype == bool or not np.issubdtype(arr.dtype, np.number)
            or np.issubdtype(arr.dtype, np.complexfloating)):
        raise InvalidDataTypeError(name, data, "a one-dimensional sequence of real numbers")
    arr = arr.astype(np.float64)
    nan = np.flatnonzero(np.isnan(arr))
    if nan.size:
        raise InvalidDataError(name, data, "free of NaN", f"; {name}[{int(nan[0])}] is nan")
    return arr


def clamp_range(lower: Any, upper: Any) -> tuple[float, float]:
    """A public clamping range: finite, ``lower < upper``, and ``upper − lower`` a finite double.

    Raises:
        InvalidArgumentError, InvalidTypeError: naming ``lower`` or ``upper``.
    """
    lo = _validate.finite("lower", lower)
    hi = _validate.finite("upper", upper)
    if not lo < hi:
        raise InvalidArgumentError("upper", upper, f"greater than lower={lo!r}")
    if not math.isfinite(hi - lo):
        raise InvalidArgumentError("upper", upper, f"within a finite distance of lower={lo!r} "
                                   "(upper − lower must be a finite double)")
    return lo, hi
