"""The "renyi" rule: Rényi filters at orders fixed when the budget is created, united with basic
composition for pure steps; and ``plan_order``, which picks the one order for a declared workload.

Invariant: admitted only while (every step so far pure and Σε_i ≤ ε_B) or (for some order α_j,
Σ_t ρ_t(α_j) ≤ B_j); the orders, their δ shares and their budgets B_j are fixed at construction
and recorded with every debit (a changed order would re-price what is spent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from accountant import _numeric, _validate, rdp
from accountant.budget import Budget
from accountant.charge import Charge
from accountant.composition.base import CompositionRule, State, sum_up
from accountant.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["RenyiComposition", "plan_order"]


class RenyiComposition(CompositionRule):
    """Rényi-DP filters (Feldman–Zrnic 2021) at fixed orders, for Gaussian, subsampled-Gaussian
    and pure-DP steps; valid when every step is chosen after seeing earlier answers.

    **Costs.** Step t costs ρ_t(α) at each watched order α: its declared curve (the
    Poisson-subsampled Gaussian, float Laplace), αρ for a zCDP cost (Gaussian family; Bun–Steinke
    2016, Def. 1.1), or the tight pure-DP bound for a pure ε step (Bun–Steinke 2016, Prop. 3.3) —
    the least that applies (:func:`accountant.rdp.charge_rdp`). A step with δ_t > 0 and none of
    these (PTR, smooth sensitivity, a pipeline's allocation) has no Rényi bound: it is refused
    with ``MechanismNotAllowedError`` (use "advanced", which keeps a δ allowance for such steps).

    **One order** (``order=α``, or :func:`plan_order` from a declared workload): continuing while
    Σ_t ρ_t(α) ≤ B gives (α, B)-RDP under full adaptivity (Feldman–Zrnic 2021, "Individual
    Privacy Accounting via a Rényi Filter", Thm 4.3), hence (ε_B, δ_B)-DP with
    B = ε_B − log((α−1)/α) + (log δ_B + log α)/(α−1) (Canonne–Kamath–Steinke 2020, Prop. 12;
    Balle et al. 2020, Thm 21), rounded down (:func:`accountant.rdp.budget`).

    **Several orders** (the default, six of them from :func:`accountant.rdp.default_orders`):
    order α_j gets the share δ_j = δ_B/k and budget B_j at δ_j; a step is admitted while *some*
    order still fits. Proof that this is (ε_B, δ_B)-DP, with the same argument as the "advanced"
    rule's union. Let Y be the transcript, T its length, and τ_j the last step at which order j's
    sum is within B_j (sums only grow, so order j fits exactly up to τ_j); T = max_j τ_j. Run
    alone against the same analyst, the filter of order j would release exactly Y_{1:τ_j} (the
    analyst's choices depend only on the past; halting is a valid filter's choice ρ = 0), so the
    privacy loss L_j of that prefix obeys E[(1 − e^{ε_B − L_j})_+] ≤ δ_j (the filter theorem
    and the conversion). Partition the outcomes by the j with T = τ_j (ties to the lowest j); on
    that part L(Y) = L_j(Y_{1:τ_j}). So the hockey-stick divergence
    E[(1 − e^{ε_B − L(Y)})_+] ≤ Σ_j E[(1 − e^{ε_B − L_j})_+] ≤ Σ_j δ_j = δ_B, and the same for the
    neighbours swapped. The basic branch joins the union as one more part: on it every step is
    pure and |L(Y)| ≤ Σε_i ≤ ε_B, which adds 0 (as in ``AdvancedComposition``). So "renyi" never
    admits fewer pure-DP steps than "basic". The proof is in docs/theory.md §4b too.

    **State** (O(1) in the steps, one number per order): ``epsilon``/``delta`` the basic sums and
    ``r0``, ``r1``, ... the Rényi sums Σ_t ρ_t(α_j). **spent** is the smaller of the basic
    statement (while every step is pure) and the best order's conversion at δ_B, at most ε_B.

    Args:
        limit: (ε_B, δ_B) with δ_B > 0; ``None`` for no limit (spend still tracked).
        per_query: an optional cap on any single step's (ε, δ).
        order: one order α in [1.1, 4096] fixed now; ``None`` for the default orders.
        orders: several orders fixed now, each with an equal share of δ_B (instead of ``order``).

    Raises:
        InvalidArgumentError: δ_B = 0 (no Rényi budget converts to pure DP: use "basic"), or an
            order at which the limit leaves no positive budget.

    >>> rule = RenyiComposition(Budget(3.0, 1e-5), order=7.0)
    >>> rule.max_steps(rule.initial_state(), Charge(0.5, 1e-6, rho=0.005))
    44
    """

    name = "renyi"
    state_params = ("orders",)

    def __init__(self, limit: Budget | None, per_query: Budget | None = None, *,
                 order: float | None = None, orders: Sequence[float] | None = None) -> None:
        super().__init__(limit, per_query)
        if order is not None and orders is not None:
            raise InvalidArgumentError("order", order, "given alone (not with orders)")
        chosen = _valid_orders(orders) if orders is not None else (
            None if order is None else (_valid_order(order),))
        if self.limit is None:
            self.orders: tuple[float, ...] = chosen or ()
            self.deltas: tuple[float, ...] = tuple(0.0 for _ in self.orders)
            self.budgets: tuple[float, ...] = tuple(math.inf for _ in self.orders)
        else:
            eps, delta = self.limit.epsilon, self.limit.delta
            if delta == 0.0:
                raise InvalidArgumentError(
                    "limit", limit, "a budget with delta > 0 for the 'renyi' composition rule",
                    "A Rényi budget converts to (epsilon, delta) only with delta > 0; for "
                    "pure-DP steps use 'basic'")
            self.orders = chosen or rdp.default_orders(eps, delta)
            k = len(self.orders)
            share = delta if k == 1 else math.nextafter(delta / k, 0.0)
            self.deltas = tuple(share for _ in self.orders)
            self.budgets = tuple(rdp.budget(eps, share, a) for a in self.orders)
            if chosen is not None and not any(b > 0.0 for b in self.budgets):
                floor = 1.0 + math.log(1.0 / delta) / eps
                raise InvalidArgumentError(
                    "order", order, f"an order at which this limit leaves a positive Rényi "
                    f"budget (above about {floor:.3g} for {self.limit})")
        self._keys = tuple(f"r{j}" for j in range(len(self.orders)))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "RenyiComposition":
        rule = super().from_config(config)
        return cls(rule.limit, rule.per_query, orders=config.get("orders") or None)

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(), "orders": list(self.orders),
                "order_deltas": list(self.deltas),
                "budgets": [None if math.isinf(b) else b for b in self.budgets]}

    def initial_state(self) -> State:
        state = {"epsilon": 0.0, "delta": 0.0}
        state.update((key, 0.0) for key in self._keys)
        return state

    def _admit(self, charge: Charge) -> None:
        if rdp.charge_rdp(charge, 2.0) is None:
            raise self._not_allowed(
                charge, "it has delta > 0 and neither a zCDP cost nor a Renyi curve, so no "
                "Renyi bound; compose it under 'advanced' (with conversion_share < 1, which "
                "keeps a delta allowance for such steps) or 'basic'")
        super()._admit(charge)

    def _step(self, state: State, charge: Charge, n: int) -> State:
        new = {"epsilon": sum_up(state["epsilon"], charge.epsilon, n),
               "delta": sum_up(state["delta"], charge.delta, n)}
        for key, alpha in zip(self._keys, self.orders):
            new[key] = sum_up(state[key], rdp.charge_rdp(charge, alpha) or 0.0, n)
        return new

    def _fits(self, state: State) -> bool:
        within = _numeric.within
        if state["delta"] == 0.0 and within(state["epsilon"], self.bound.epsilon):
            return True
        return any(b > 0.0 and within(state[key], b) for key, b in zip(self._keys, self.budgets))

    def _refusal(self) -> str:
        shown = ", ".join(f"{a:g}" for a in self.orders)
        return (f"renyi composition: the step would exceed the Renyi budget at every order "
                f"({shown}), and the basic branch (pure steps, sum of epsilon <= epsilon_B) "
                f"does not admit it")

    def _candidates(self, state: State) -> list[tuple[float, float]]:
        out = []
        if state["delta"] == 0.0:
            out.append((state["epsilon"], 0.0))
        limit = self.bound
        best = min((rdp.epsilon(state[key], a, limit.delta)
                    for key, a in zip(self._keys, self.orders) if state[key] > 0.0),
                   default=None)
        if best is not None:
            # An admitted state converts within ε_B at the order that fits; a state over the
            # limit (a limit lowered since, a forged state) must read as over it.
            out.append((min(best, limit.epsilon) if self._fits(state) else best, limit.delta))
        return out or [(state["epsilon"], state["delta"])]


def _valid_order(order: Any) -> float:
    alpha = _validate.real("order", order)
    if not rdp.MIN_ORDER <= alpha <= rdp.MAX_ORDER:
        raise InvalidArgumentError("order", order,
                                   f"a Renyi order in [{rdp.MIN_ORDER}, {rdp.MAX_ORDER:g}]")
    return alpha


def _valid_orders(orders: Any) -> tuple[float, ...]:
    if isinstance(orders, (str, bytes)) or not isinstance(orders, Sequence) or not orders:
        raise InvalidTypeError("orders", orders, "a non-empty sequence of Renyi orders")
    out = tuple(_valid_order(a) for a in orders)
    if len(set(out)) != len(out) or len(out) > 64:
        raise InvalidArgumentError("orders", orders, "at most 64 distinct orders")
    return out


def _candidate_orders(limit: Budget) -> list[float]:
    """Orders a plan considers: 0.01 apart up to 10, 0.1 apart up to 100, then 1% apart, as far
    as orders can matter for this limit (16 times the scale of :func:`rdp.default_orders`)."""
    top = min(rdp.MAX_ORDER, max(256.0, 16.0 * (1.0 + math.log(1.0 / limit.delta)
                                                 / limit.epsilon)))
    out = [round(1.1 + 0.01 * i, 2) for i in range(890)]
    out += [round(10.0 + 0.1 * i, 1) for i in range(900)]
    a = 100.0
    while a <= top:
        out.append(float(round(a)))
        a *= 1.01
    return out


def plan_order(limit: Budget, workload: Any, steps: int | None = None) -> float:
    """The one order at which a ``renyi`` budget ``limit`` suits a declared workload best: with
    ``steps``, the order at which that many steps of ``workload`` (a mechanism, or its
    ``Charge``) reach the smallest ε at δ_B; without, the order that admits the most steps.

    The order must be fixed before any release (the filter theorem needs it); planning from a
    workload declared in advance keeps it so. Pass it as ``order=`` to the accountant.

    Raises:
        InvalidArgumentError: δ_B = 0, a non-positive ``steps``, or a workload with no Rényi
            bound.

    >>> from accountant.charge import Charge
    >>> plan_order(Budget(3.0, 1e-5), Charge(0.5, 1e-6, rho=0.005))
    7.51
    """
    if not isinstance(limit, Budget):
        raise InvalidTypeError("limit", limit, "a Budget")
    if limit.delta == 0.0 or limit.is_unlimited:
        raise InvalidArgumentError("limit", limit, "a finite budget with delta > 0")
    charge = getattr(workload, "charge", workload)
    if not isinstance(charge, Charge):
        raise InvalidTypeError("workload", workload, "a mechanism or a Charge")
    if rdp.charge_rdp(charge, 2.0) is None:
        raise InvalidArgumentError("workload", charge.mechanism or "the step",
                                   "a step with a Renyi bound (zCDP, a curve, or pure DP)")
    if steps is not None:
        n = _validate.positive_int("steps", steps)

        def score(alpha: float) -> float:
            value = _numeric.mul_up(float(n), rdp.charge_rdp(charge, alpha) or 0.0)
            return -rdp.epsilon(value, alpha, limit.delta)
    else:
        def score(alpha: float) -> float:
            # Steps first; among orders admitting as many, the one with the most budget left.
            b = rdp.budget(limit.epsilon, limit.delta, alpha)
            cost = rdp.charge_rdp(charge, alpha) or 0.0
            if not b > 0:
                return -1.0
            return math.inf if cost == 0 else math.floor(b / cost) + (b / cost % 1.0) / 2

    return max(_candidate_orders(limit), key=lambda a: (score(a), -a))
