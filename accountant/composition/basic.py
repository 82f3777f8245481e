"""Basic composition, valid for fully adaptive privacy parameters."""

from __future__ import annotations

from accountant import _numeric
from accountant.budget import Budget
from accountant.composition import bounds
from accountant.composition.base import Charge, CompositionRule, Refused, State, clip_delta, sum_up

__all__ = ["BasicComposition"]


class BasicComposition(CompositionRule):
    """Continue while Σε_i ≤ ε_B and Σδ_i ≤ δ_B.

    Valid when every ε_i, δ_i is chosen after seeing earlier answers: this is the filter form of
    basic composition (Rogers, Roth, Ullman, Vadhan 2016, "Privacy Odometers and Filters", Thm 3.6;
    the non-adaptive statement is Dwork–Roth 2014, Thm 3.16). Sums round up; a step within a relative
    1e-9 of exactly what remains is admitted (see ``accountant._numeric``).

    State: ``{"epsilon": Σε_i, "delta": Σδ_i}``, two running sums, O(1) per step.
    ``spent`` is the two sums; ``remaining`` is the limit minus them (rounded down).

    A batch (``Accountant.release_many``) is one step whose items were fixed in advance, so a
    non-adaptive theorem applies to it: it is charged its basic total (Σε, Σδ) when that fits;
    otherwise the tightest non-adaptive bound at the δ still left — Kairouz–Oh–Viswanath 2015
    Thm 3.3 (exact) when all items cost the same, else their Thm 3.5 — if that ε fits.

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

    def _step(self, state: State, charge: Charge, n: int) -> State:
        return {"epsilon": sum_up(state["epsilon"], charge.epsilon, n),
                "delta": sum_up(state["delta"], charge.delta, n)}

    def _fits(self, state: State) -> bool:
        limit = self.limit
        return (_numeric.within(state["epsilon"], limit.epsilon)
                and _numeric.within(state["delta"], limit.delta))

    def _refusal(self) -> str:
        return "basic composition: Σε or Σδ would exceed the limit"

    def debit(self, state: State, charge: Charge) -> State:
        try:
            return super().debit(state, charge)
        except Refused:
            if not charge.parts or self.limit is None:
                raise
            return self._batch_bound(state, charge)

    def _batch_bound(self, state: State, batch: Charge) -> State:
        """A refused batch retried at its tightest non-adaptive (ε, δ): all the δ still left is
        offered as the composition slack (KOV 2015, Thm 3.3 homogeneous / Thm 3.5)."""
        parts = batch.parts
        for part in parts:
            self._admit(part)  # a per-query refusal is final
        left = _numeric.sub_down(self.limit.delta, state["delta"])
        if not left > 0.0:
            raise Refused(self._refusal())
        first = parts[0]
        if all(p.epsilon == first.epsilon and p.delta == first.delta for p in parts):
            eps = bounds.kov_epsilon(len(parts), first.epsilon, left, first.delta)
        else:
            slack = _numeric.sub_down(left, sum(p.delta for p in parts) * (1.0 + 1e-12))
            if not slack > 0.0:
                raise Refused(self._refusal())
            eps = bounds.kov_heterogeneous_epsilon([p.epsilon for p in parts], slack)
        new = {"epsilon": _numeric.add_up(state["epsilon"], eps),
               "delta": _numeric.add_up(state["delta"], left)}
        if not self._fits(new):
            raise Refused(self._refusal() + " (also at the batch's non-adaptive KOV bound)")
        return new

    def spent(self, state: State) -> Budget:
        return Budget(state["epsilon"], clip_delta(state["delta"]))
