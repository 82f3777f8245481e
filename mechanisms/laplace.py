"""The Laplace mechanism."""

from __future__ import annotations

from typing import Any

from accountant import _numeric, _validate
from accountant.budget import Budget
from mechanisms.base import NumericMechanism
from mechanisms.sampling import Sampler

__all__ = ["Laplace"]


class Laplace(NumericMechanism):
    """Adds Laplace(0, Δ₁/ε) noise to each entry: (ε, 0)-DP.

    Dwork, McSherry, Nissim, Smith 2006 ("Calibrating Noise to Sensitivity", Prop. 1); Dwork–Roth
    2014, Thm 3.6. For a vector value, ``sensitivity`` is the L1 sensitivity of the whole vector.
    The scale is rounded up.

    Args:
        epsilon: ε > 0, finite.
        sensitivity: the query's L1 sensitivity Δ₁ > 0 under the neighbour relation in use.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad ε or Δ₁.

    >>> m = Laplace(epsilon=0.5, sensitivity=2.0)
    >>> m.cost
    Budget(epsilon=0.5, delta=0.0)
    >>> round(m.scale, 12)
    4.0
    """

    def __init__(self, epsilon: float, sensitivity: float = 1.0) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.sensitivity = _validate.positive("sensitivity", sensitivity)
        self.scale = _numeric.div_up(self.sensitivity, self.epsilon)
        self._cost = Budget(self.epsilon)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "sensitivity": self.sensitivity, "scale": self.scale}

    def _release(self, value: Any, sampler: Sampler) -> Any:
        if isinstance(value, float):
            return value + sampler.laplace(self.scale)
        return value + sampler.laplace(self.scale, size=value.shape)
