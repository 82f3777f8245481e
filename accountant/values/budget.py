"""The ``Budget`` value type: an (ε, δ) pair, immutable and validated on construction.

Invariant: a ``Budget`` that exists is valid. ε is a finite number >= 0, or ``inf`` to mean "no
limit" (in which case δ must be 0); 0 <= δ < 1; NaN is always rejected, with a typed error that
names the argument and the value.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["Budget"]


class Budget(BaseModel):
    """A privacy budget or cost: (ε, δ)-differential privacy.

    Budgets are compared as a partial order (every component ≤), like Tumult's ``ApproxDP.compare``:
    ``a <= b`` means a mechanism that costs ``a`` fits in a limit of ``b``. Adding budgets is basic
    composition (Dwork–Roth, Thm 3.16), rounded up.

    Args:
        epsilon: ε >= 0, finite, or ``math.inf`` for "no limit".
        delta: 0 <= δ < 1. Must be 0 when ε is infinite.

    Raises:
        InvalidArgumentError: a value out of range (NaN, negative, δ >= 1).
        InvalidTypeError: not a real number.

    >>> b = Budget(1.0, 1e-6)
    >>> b.epsilon, b.delta
    (1.0, 1e-06)
    >>> Budget(0.1) <= b
    True
    >>> Budget(0.5) + Budget(0.25, 1e-7)
    Budget(epsilon=0.75, delta=1e-07)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # How a larger value grants more, for a policy change (policies.stored.raised).
    epsilon: float = Field(json_schema_extra={"grants": "higher"})
    delta: float = Field(0.0, json_schema_extra={"grants": "higher"})

    def __init__(self, epsilon: Any = None, delta: Any = 0.0, **data: Any) -> None:
        # Checked here first so that direct construction (positional or by keyword) raises our
        # typed errors (``InvalidTypeError`` is a ``TypeError``, which pydantic would not catch);
        # the field validators below repeat the checks for budgets nested in other models
        # (policies), which pydantic builds without calling __init__, so that its error
        # locations name the exact key (``datasets.adult.limit.epsilon``).
        eps, dlt = _checked(data.pop("epsilon", epsilon), data.pop("delta", delta), data)
        # The values are checked: set them as pydantic's model_construct does, instead of
        # validating a second time (a Budget is built for every mechanism, on the release path).
        object.__setattr__(self, "__dict__", {"epsilon": eps, "delta": dlt})
        object.__setattr__(self, "__pydantic_fields_set__", {"epsilon", "delta"})
        object.__setattr__(self, "__pydantic_extra__", None)
        object.__setattr__(self, "__pydantic_private__", None)

    # Tell pydantic this __init__ adds nothing to validation (it only accepts positional
    # arguments and raises typed errors first), so a Budget nested in another model is validated
    # field by field, and errors carry the field's location. pydantic's RootModel does the same.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @field_validator("epsilon", mode="before")
    @classmethod
    def _valid_epsilon(cls, value: Any) -> float:
        return _validate.in_model(_epsilon, value)

    @field_validator("delta", mode="before")
    @classmethod
    def _valid_delta(cls, value: Any, info: ValidationInfo) -> float:
        return _validate.in_model(_delta, value, info.data.get("epsilon", 0.0))

    @classmethod
    def unlimited(cls) -> "Budget":
        """The budget that places no limit: ``Budget(inf)``."""
        return cls(math.inf)

    @property
    def is_unlimited(self) -> bool:
        return math.isinf(self.epsilon)

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Budget):
            return NotImplemented
        return other.is_unlimited or (self.epsilon <= other.epsilon and self.delta <= other.delta)

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Budget):
            return NotImplemented
        return other <= self

    def __add__(self, other: object) -> "Budget":
        if not isinstance(other, Budget):
            return NotImplemented
        if self.is_unlimited or other.is_unlimited:
            return Budget.unlimited()
        return Budget(_numeric.add_up(self.epsilon, other.epsilon),
                      min(_numeric.add_up(self.delta, other.delta), math.nextafter(1.0, 0.0)))

    def __repr__(self) -> str:
        return f"Budget(epsilon={self.epsilon!r}, delta={self.delta!r})"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        """A one-row table in a notebook."""
        from dpbudget.accountant.values._html import table

        return table(("ε", "δ"), [("∞ (no limit)" if self.is_unlimited else self.epsilon,
                                   self.delta)])

    def __hash__(self) -> int:
        return hash((self.epsilon, self.delta))


def _checked(epsilon: Any, delta: Any, extra: dict[str, Any]) -> tuple[float, float]:
    if extra:
        raise InvalidArgumentError("Budget", sorted(extra), "given only 'epsilon' and 'delta'")
    if epsilon is None:
        raise InvalidArgumentError("epsilon", epsilon, "given (a finite number >= 0)")
    eps = _epsilon(epsilon)
    return eps, _delta(delta, eps)


def _epsilon(epsilon: Any) -> float:
    eps = _validate.real("epsilon", epsilon)
    if not eps >= 0.0:
        raise InvalidArgumentError("epsilon", epsilon, "a finite number >= 0 (or inf for no limit)")
    return eps + 0.0  # -0.0 is stored as 0.0: one zero, whatever the sign bit


def _delta(delta: Any, epsilon: float) -> float:
    dlt = _validate.probability("delta", delta) + 0.0  # -0.0 as 0.0
    if math.isinf(epsilon) and dlt != 0.0:
        raise InvalidArgumentError(
            "delta", delta, "0 when epsilon is infinite",
            "An infinite epsilon means no limit at all; a delta would be meaningless.")
    return dlt
