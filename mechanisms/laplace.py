"""The Laplace mechanism."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidDataError
from dpbudget.mechanisms.base import NumericMechanism, noise_kind
from dpbudget.mechanisms.sensitivity import stated_sensitivity, unstated_sensitivity
from dpbudget.mechanisms.grid import LaplaceGrid
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.sums import rational_value, within

__all__ = ["Laplace"]


class Laplace(NumericMechanism):
    """Adds Laplace(0, Δ₁/ε) noise to each entry: (ε, 0)-DP.

    Dwork, McSherry, Nissim, Smith 2006 ("Calibrating Noise to Sensitivity", Prop. 1); Dwork–Roth
    2014, Thm 3.6. For a vector value, ``sensitivity`` is the L1 sensitivity of the whole vector.
    The scale is rounded up.

    The noise is exact by default: the value is rounded to a grid of 2^k ≈ scale/2^40 (2^6 finer
    for vectors of 64 entries or more) and exact
    discrete Laplace noise is added in grid steps, with the sensitivity widened by the rounding so
    that the cost is still exactly (ε, 0) (``dpbudget.mechanisms.grid``; Mironov, CCS 2012, for why textbook
    float noise leaks; Canonne–Kamath–Steinke 2020 for the sampler). Values beyond
    ``grid.limit_for(n)`` in magnitude are refused. ``noise="float"`` keeps the textbook float sampler.

    An exact rational value — a ``fractions.Fraction``, or a numpy array of them (dtype object),
    as the sum helpers return (``dpbudget.mechanisms.sums``) — is rounded to the grid exactly, so the
    sensitivity holds for the value as given; with ``noise="float"`` it is first rounded to the
    nearest double.

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: ε > 0, finite.
        sensitivity: the query's L1 sensitivity Δ₁ > 0 under the neighbour relation in use. No
            default: left out (None), it is taken from the ``Query`` released
            (``dp.queries``: its ``l1_sensitivity``), and a plain number is refused.
        noise: ``"exact"`` (default) or ``"float"`` (an explicit, recorded opt-out).

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad ε or Δ₁.

    >>> m = Laplace(epsilon=0.5, sensitivity=2.0)
    >>> m.cost
    Budget(epsilon=0.5, delta=0.0)
    >>> round(m.scale, 12)
    4.0
    """

    query_norm = "l1"

    def __init__(self, epsilon: float, *, sensitivity: float | None = None,
                 noise: str = "exact") -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.sensitivity = stated_sensitivity(sensitivity, _validate.positive)
        self._noise = noise_kind(noise)
        # Not stated: no scale and no grid until a Query binds it (``dpbudget.mechanisms.queries.bind``);
        # the cost, (ε, 0), does not depend on Δ.
        self.scale = None if self.sensitivity is None else \
            _numeric.div_up(self.sensitivity, self.epsilon)
        self.grid = _grid(self.epsilon, self.sensitivity) \
            if self._noise == "exact" and self.sensitivity is not None else None
        self.declare(Budget(self.epsilon), noise=self._noise)

    @property
    def rdp(self) -> tuple[Any, ...] | None:
        """Mironov 2017, Prop. 6, for the continuous Laplace (``noise="float"``). None with exact
        noise: the discrete Laplace on a grid leaks slightly more than the continuous one at the
        same ε (the continuous Laplace is a post-processing of it: an exponential's integer and
        fractional parts are independent), so it is charged the pure-DP bound
        (``dpbudget.accountant.values.rdp.pure``), valid for every ε-DP mechanism."""
        return ("laplace", self.epsilon) if self._noise == "float" else None

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "sensitivity": self.sensitivity, "scale": self.scale,
                "noise": self._noise}

    def prepare(self, value: Any) -> Any:
        if self.sensitivity is None:
            raise unstated_sensitivity(self)
        if type(value) is float and math.isfinite(value):  # the common case, checked cheaply
            x: Any = value  # (an isinstance check against Fraction, an ABC, costs ~0.3 µs)
        else:
            x = rational_value(value, exact=self.grid is not None)
            if x is None:
                x = super().prepare(value)
        # A scalar's limit is the grid's own, computed once when the grid was built.
        grid = self.grid
        limit = None if grid is None else (grid.limit_for(x.size) if isinstance(x, np.ndarray)
                                           else grid.limit)
        if limit is not None and not (-limit <= x <= limit if type(x) is float
                                      else within(x, limit)):
            raise InvalidDataError("value", value, f"at most {limit:.6g} in magnitude "
                                   "(the noise grid of this scale cannot represent more)")
        return x

    def draw(self, value: Any, sampler: Sampler) -> Any:
        if self.grid is not None:
            return self.grid.release(sampler.bits, value)
        if isinstance(value, float):
            return value + sampler.laplace(self.scale)  # type: ignore[arg-type]
        return value + sampler.laplace(self.scale, size=value.shape)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=1024)
def _grid(epsilon: float, sensitivity: float) -> LaplaceGrid:
    """Grids are immutable and costly to build (exact rationals): one per parameter pair, shared
    by every mechanism built with it (a new ``Laplace`` per release is the common usage)."""
    return LaplaceGrid(epsilon, sensitivity)
