"""Floating-point arithmetic on the safe side of privacy, in one place.

Spent budget and noise scales round *up*; what remains of a limit rounds *down*; limits themselves
are never rounded. The one deliberate slack is ``RELATIVE_TOLERANCE``: a request within a relative
1e-9 of exactly what remains is admitted, so that 100 releases at ε = 0.01 fit a budget of 1.0
(``0.01`` is stored as a double slightly above 1/100). The guarantee therefore holds for the limit
times ``1 + 1e-9`` at most, and the ledger records the exact rounded-up sums that were admitted.

The sums use Knuth's TwoSum to find the exact rounding error of ``a + b`` (Knuth, TAOCP vol. 2,
§4.2.2, Thm B), so a sum is bumped by one ulp only when rounding actually lost something, and long
running sums do not drift upward needlessly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

RELATIVE_TOLERANCE = 1e-9


def add_up(a: float, b: float) -> float:
    """``a + b`` rounded towards +inf (never below the exact sum)."""
    s = a + b
    if math.isinf(s):
        return s
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return math.nextafter(s, math.inf) if err > 0 else s


def sub_down(a: float, b: float) -> float:
    """``a - b`` rounded towards -inf (never above the exact difference)."""
    return -add_up(-a, b)


def div_up(a: float, b: float) -> float:
    """``a / b`` for positive operands, rounded up by one ulp (a noise scale is never too small)."""
    return math.nextafter(a / b, math.inf)


def mul_up(a: float, b: float) -> float:
    """``a * b`` for non-negative operands, rounded up by one ulp."""
    p = a * b
    if p == 0.0:  # exact only when an operand is zero; otherwise the product underflowed
        return 0.0 if a == 0.0 or b == 0.0 else math.nextafter(0.0, math.inf)
    return math.nextafter(p, math.inf)


def bisect(pred: Callable[[float], bool], lo: float, hi: float, *,
           geometric: bool = False) -> tuple[float, float]:
    """Shrink [lo, hi], where ``pred(lo)`` is False and ``pred(hi)`` True for a monotone ``pred``,
    until the ends are adjacent doubles; returns (lo, hi), so a caller picks its safe side.

    ``geometric`` bisects at sqrt(lo·hi) (for positive scale parameters spanning many orders of
    magnitude), otherwise at the midpoint.
    """
    for _ in range(2100):  # enough to reach adjacent doubles from any finite bracket
        # sqrt(lo)·sqrt(hi), not sqrt(lo·hi): the product under- or overflows beyond 1e±154.
        mid = math.sqrt(lo) * math.sqrt(hi) if geometric else 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if pred(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi


def within(total: float, limit: float) -> bool:
    """True when ``total`` fits under ``limit`` with the library's relative tolerance."""
    return total <= limit + limit * RELATIVE_TOLERANCE


def within_budget(spent: Any, limit: Any) -> bool:
    """``within`` for both components of an (ε, δ) pair (objects with ``epsilon`` and
    ``delta``): what spend is held to wherever a limit is reported or audited."""
    return within(spent.epsilon, limit.epsilon) and within(spent.delta, limit.delta)
