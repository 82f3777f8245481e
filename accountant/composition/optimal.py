"""The "optimal" rule: a fixed per-query cost, composed with Kairouz–Oh–Viswanath's exact theorem.

Invariant: every admitted release is charged exactly the declared per-query cost (ε₀, δ₀); at most
k_max releases are admitted, k_max a function of the limit and (ε₀, δ₀) alone. It is computed when
first needed (a debit, a read, the account's description), once per process and parameters, never
when a rule is built: opening a ledger whose policy declares an "optimal" limit at a tiny ε₀ (k_max
~ 10^10, seconds of work) costs nothing until that account is used.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from dpbudget.accountant.values import _numeric
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import bounds
from dpbudget.accountant.composition.base import CompositionRule, State, check_charge, clip_delta
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["OptimalComposition"]


class OptimalComposition(CompositionRule):
    """Optimal homogeneous composition for a fixed per-query cost.

    Kairouz, Oh, Viswanath 2015, "The Composition Theorem for Differential Privacy", Thm 3.3
    (tight): k-fold (adaptive) composition of (ε₀, δ₀)-DP mechanisms is (ε, δ)-DP iff
    1 − (1−δ₀)^k (1 − δ_RR(ε)) ≤ δ (:func:`~accountant.composition.bounds.kov_delta`). The theorem
    holds for mechanisms chosen adaptively when each one's cost is fixed in advance, which this rule
    enforces: every release is charged exactly ``per_query`` (a cheaper mechanism still uses one of
    the k_max slots), and a mechanism costlier than ``per_query`` is refused with
    ``MechanismNotAllowedError`` (not ``BudgetExceededError``: no amount of remaining budget would
    admit it; the budget was declared for a different per-query cost). Stopping early is covered:
    it is post-processing of k_max releases. k_max, the largest k with the composition
    (ε_B, δ_B)-DP, is computed on first use, in log space
    (:func:`~accountant.composition.bounds.kov_max_steps`), once per process and parameters.

    **State** (O(1)): ``count``, the releases admitted so far. **spent** is
    (min(kε₀ while kδ₀ ≤ δ_B, the KOV Thm 3.3 ε for k at δ_B), δ_B); **remaining** is the limit
    minus that, rounded down (informative); ``max_releases`` is exactly k_max − count.

    Args:
        limit: (ε_B, δ_B); ``None`` for no limit (count still tracked, ``spent`` is the basic sum).
        per_query: the fixed per-query cost (ε₀ > 0, δ₀); required.

    Raises:
        InvalidArgumentError: ``per_query`` missing or with ε₀ = 0.

    >>> OptimalComposition(Budget(1.0, 1e-6), Budget(0.01)).k_max
    562
    """

    name = "optimal"
    state_params = ("per_query",)

    def __init__(self, limit: Budget | None, per_query: Budget | None = None) -> None:
        super().__init__(limit, per_query)
        if per_query is None or not per_query.epsilon > 0.0 or per_query.is_unlimited:
            raise InvalidArgumentError(
                "per_query", per_query, "a Budget with a finite epsilon > 0 for the 'optimal' "
                "composition rule", "Declare the fixed per-query cost, e.g. "
                "Accountant(Budget(1.0, 1e-6), composition='optimal', per_query=Budget(0.01))")

    @functools.cached_property
    def k_max(self) -> int:
        """The most releases the limit admits (``sys.maxsize`` without a limit)."""
        if self.limit is None:
            return sys.maxsize
        e0 = self.cost0
        return _k_max(self.limit.epsilon, self.limit.delta, e0.epsilon, e0.delta)

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(), "k_max": None if self.limit is None else self.k_max}

    def initial_state(self) -> State:
        return {"count": 0}

    @property
    def cost0(self) -> Budget:
        """The fixed per-query cost (ε_0, δ_0) every release is charged (set at construction)."""
        if self.per_query is None:  # pragma: no cover - __init__ refuses it
            raise RuntimeError("the 'optimal' rule needs per_query")
        return self.per_query

    def _admit(self, charge: Charge) -> None:
        cap = self.cost0
        if charge.epsilon > cap.epsilon or charge.delta > cap.delta:
            raise self._not_allowed(charge, f"it costs more than the fixed per-query cost {cap} "
                                    "this budget was declared with")

    def _step(self, state: State, charge: Charge, n: int) -> State:
        return {"count": int(state["count"]) + n}

    def _fits(self, state: State) -> bool:
        return state["count"] <= self.k_max

    def _refusal(self) -> str:
        return (f"optimal composition: all k_max = {self.k_max} releases at {self.per_query} "
                "have been used")

    def max_steps(self, state: State, charge: Charge) -> int:
        check_charge(charge)
        self._admit(charge)
        return max(0, self.k_max - int(state["count"]))

    def spent(self, state: State) -> Budget:
        if self.limit is None:  # the basic sums (kε₀, kδ₀)
            k = float(state["count"])
            e0, d0 = self.cost0.epsilon, self.cost0.delta
            return Budget(_numeric.mul_up(k, e0), clip_delta(_numeric.mul_up(k, d0)))
        return super().spent(state)

    def _candidates(self, state: State) -> list[tuple[float, float]]:
        k = int(state["count"])
        e0, d0 = self.cost0.epsilon, self.cost0.delta
        out = [(_numeric.mul_up(float(k), e0), _numeric.mul_up(float(k), d0))]
        if self.bound.delta > 0.0:
            out.append((bounds.kov_epsilon(k, e0, self.bound.delta, d0), self.bound.delta))
        return out


@functools.lru_cache(maxsize=64)
def _k_max(epsilon: float, delta: float, eps0: float, delta0: float) -> int:
    # A pure function of four floats: every rule built on the same parameters (each open of a
    # ledger, each accountant) shares one computation, which is O(k_max^½ log k_max).
    return bounds.kov_max_steps(epsilon, delta, eps0, delta0)
