"""How a mechanism's sensitivity is stated: never by default (issue 30). A Laplace- or
Gaussian-family mechanism states Δ, or takes it from the ``Query`` it releases
(``dpbudget.mechanisms.queries.bind``); a plain number without one is refused; a rational Δ is
never rounded below itself; and a plan (``can_afford``, ``max_releases``) is priced at the
charge its release would debit.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["priced", "rounded_up", "stated_sensitivity", "unstated_sensitivity"]


def stated_sensitivity(value: Any, check: Any) -> Any:
    """``sensitivity`` as given to a ``query_norm`` mechanism: None (not stated: it comes from the
    ``Query`` released, and a plain number is refused) or ``check("sensitivity", value)``, never
    below ``value`` (``rounded_up``)."""
    return None if value is None else rounded_up(value, check("sensitivity", value))


def priced(mechanism: Any) -> Any:
    """``mechanism``, if its charge is the one its release would debit (``can_afford``,
    ``max_releases``). A Gaussian-family mechanism whose sensitivity is not stated is charged at
    Δ = 1 until a ``Query`` binds it, and the bound charge can differ: on DiscreteGaussian's
    integer lattice by more than rounding (147 releases planned where 146 fit), on the others in
    the last bits.

    Raises:
        InvalidArgumentError: such a mechanism, unbound (``sensitivity`` names what to state).
    """
    if getattr(type(mechanism), "query_norm", None) == "l2" and \
            getattr(mechanism, "sensitivity", 0.0) is None:
        raise InvalidArgumentError(
            "sensitivity", None, f"stated to plan with {type(mechanism).__name__} (its cost "
            "depends on Δ): pass sensitivity=query.l2_sensitivity", "Nothing was debited")
    return mechanism


def rounded_up(exact: Any, converted: Any) -> Any:
    """``converted`` (a float or int made from ``exact``), moved up one double where the
    conversion rounded an exact rational below itself: a sensitivity of ``Fraction(1, 3)`` or
    ``2**53 + 1`` must not calibrate noise to a smaller Δ than it states."""
    if isinstance(converted, float) and isinstance(exact, numbers.Rational) \
            and not isinstance(exact, bool) and Fraction(converted) < exact:
        return math.nextafter(converted, math.inf)
    return converted


def unstated_sensitivity(mechanism: Any) -> InvalidArgumentError:
    """The refusal of a plain number by a mechanism whose sensitivity was not stated.

    There is no default Δ: a default of 1 calibrates the noise of a sum of incomes to a count's
    (issue 30), silently. The sensitivity is stated, or comes from a ``Query`` that knows it.
    """
    name = type(mechanism).__name__
    return InvalidArgumentError(
        "sensitivity", None, f"stated to release a plain number or array: {name}(ε, "
        f"sensitivity=Δ, ...), or release a dp.queries Query instead "
        f"(acc.release({name}(ε, ...), dp.queries.true_count(rows))), which carries its own",
        "There is no default sensitivity; nothing was drawn or debited")
