"""Basic composition, valid for fully adaptive privacy parameters."""

from __future__ import annotations

import math

from accountant import _numeric
from accountant.budget import Budget
from accountant.composition.base import Charge, CompositionRule, Refused, State

__all__ = ["BasicComposition"]


class BasicComposition(CompositionRule):
    """Continue while Σε_i ≤ ε_B and Σδ_i ≤ δ_B.

    Valid when every ε_i, δ_i is chosen after seeing earlier answers: this is the filter form of
    basic composition (Rogers, Roth, Ullman, Vadhan 2016, "Privacy Odometers and Filters", Thm 3.6;
    the non-adaptive statement is Dwork–Roth 2014, Thm 3.16). Sums round up; a step within a relative
    1e-9 of exactly what remains is admitted (see ``accountant._numeric``).

    State: ``{"epsilon": Σε_i, "delta": Σδ_i}``, two running sums, O(1) per step.

    >>> rule = BasicComposition(Budget(1.0))
    >>> state = rule.initial_state()
    >>> for _ in range(100):
    ...     state = rule.debit(state, Charge(0.01, 0.0))
    >>> rule.remaining(state)
    Budget(epsilon=0.0, delta=0.0)
    """

    name = "basic"

    def initial_state(self) -> State:
        return {"epsilon": 0.0, "delta": 0.0}

    def debit(self, state: State, charge: Charge) -> State:
        self._check_per_query(charge)
        eps = _numeric.add_up(state["epsilon"], charge.epsilon)
        dlt = _numeric.add_up(state["delta"], charge.delta)
        limit = self.limit
        if limit is not None and not (_numeric.within(eps, limit.epsilon)
                                      and _numeric.within(dlt, limit.delta)):
            raise Refused("basic composition: Σε or Σδ would exceed the limit")
        return {"epsilon": eps, "delta": dlt}

    def spent(self, state: State) -> Budget:
        return Budget(state["epsilon"], min(state["delta"], math.nextafter(1.0, 0.0)))

    def remaining(self, state: State) -> Budget:
        if self.limit is None:
            return Budget.unlimited()
        return Budget(max(0.0, _numeric.sub_down(self.limit.epsilon, state["epsilon"])),
                      max(0.0, _numeric.sub_down(self.limit.delta, state["delta"])))
