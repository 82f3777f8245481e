"""Basic composition, valid for fully adaptive privacy parameters."""

from __future__ import annotations

import math

from dpbudget.accountant.values import _numeric
from dpbudget.accountant.values.budget import Budget  # noqa: F401 (doctest)
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import bounds
from dpbudget.accountant.composition.base import CompositionRule, Refused, State, sum_up

__all__ = ["BasicComposition"]


class BasicComposition(CompositionRule):
    """Continue while Σε_i ≤ ε_B and Σδ_i ≤ δ_B.

    Valid when every ε_i, δ_i is chosen after seeing earlier answers: this is the filter form of
    basic composition (Rogers, Roth, Ullman, Vadhan 2016, "Privacy Odometers and Filters", Thm 3.6;
    the non-adaptive statement is Dwork–Roth 2014, Thm 3.16). Sums round up; a step within a relative
    1e-9 of exactly what remains is admitted (see ``dpbudget.accountant.values._numeric``).

    State: ``{"epsilon": Σε_i, "delta": Σδ_i}``, two running sums, O(1) per step.
    ``spent`` is the two sums; ``remaining`` is the limit minus them (rounded down).

    A batch (``Accountant.release_many``) is one step whose items' mechanisms and costs are fixed
    in advance (their inputs may be chosen adaptively, from earlier answers: the table path's sums
    on privately selected keys), so a theorem for k-fold adaptive composition at fixed parameters
    applies to it — KOV 2015's is stated for adaptive composition, as is zCDP's (Bun–Steinke 2016,
    Lemma 2.3): it is charged its basic total (Σε, Σδ) when that fits;
    otherwise the tightest bound at the δ still left (all of it is offered as slack), if that ε
    fits: the smaller of Kairouz–Oh–Viswanath 2015 Thm 3.3 (exact) when all items cost the same,
    else their Thm 3.5, and — when every item has a zCDP cost (pure or Gaussian family) — the
    Canonne–Kamath–Steinke conversion of the items' summed ρ (Bun–Steinke 2016, Lemma 2.3),
    which is tighter for many heterogeneous pure items and for Gaussian items.

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
        limit = self.bound
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
        """A refused batch retried at its tightest fixed-parameter (ε, δ): all the δ still left is
        offered as the composition slack (KOV 2015, Thm 3.3 homogeneous / Thm 3.5)."""
        parts = batch.parts
        for part in parts:
            self._admit(part)  # a per-query refusal is final
        left = _numeric.sub_down(self.bound.delta, state["delta"])
        if not left > 0.0:
            raise Refused(self._refusal())
        first = parts[0]
        candidates = [math.inf]
        if all(p.epsilon == first.epsilon and p.delta == first.delta for p in parts):
            candidates.append(bounds.kov_epsilon(len(parts), first.epsilon, left, first.delta))
        else:
            slack = _numeric.sub_down(left, math.fsum(p.delta for p in parts) * (1.0 + 1e-12))
            if slack > 0.0:
                candidates.append(bounds.kov_heterogeneous_epsilon([p.epsilon for p in parts],
                                                                   slack))
        rho = _zcdp_total(parts)
        if rho is not None:
            candidates.append(bounds.cks_epsilon(rho, left))
        eps = min(candidates)
        new = {"epsilon": _numeric.add_up(state["epsilon"], eps),
               "delta": _numeric.add_up(state["delta"], left)}
        if not self._fits(new):
            raise Refused(self._refusal() + " (also at the batch's non-adaptive KOV bound)")
        return new


def _zcdp_total(parts: tuple[Charge, ...]) -> float | None:
    """Σρ_i of a batch whose items all have a zCDP cost — declared (Gaussian family, Bun–Steinke
    Prop. 1.6) or ε²/2 for a pure step (Prop. 1.4) — rounded up; None if any item has neither."""
    total = 0.0
    for p in parts:
        if p.rho is not None:
            total = _numeric.add_up(total, p.rho)
        elif p.delta == 0.0:
            total = _numeric.add_up(total, 0.5 * _numeric.mul_up(p.epsilon, p.epsilon))
        else:
            return None
    return total
