"""The "renyi" rule: a Rényi filter at one order fixed before the first release (given, or chosen
from the account's first step), or at several given orders, united with basic composition for pure
steps; and ``plan_order``, which picks the one order for a declared workload.

Invariant: admitted only while (every step so far pure and Σε_i ≤ ε_B) or (for some order α_j,
Σ_t ρ_t(α_j) ≤ B_j). Given orders, their δ shares and budgets are fixed at construction and
recorded with every debit; a chosen order is fixed by the account's first step, before its noise
is drawn, and recorded in the account's state (``order``) from that debit on, so a reopened ledger
and the audit's replay use it (a changed order would re-price what is spent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from dpbudget.accountant.values import _numeric, _validate, rdp
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition.base import CompositionRule, State, check_charge, sum_up
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["RenyiComposition", "plan_order"]


class RenyiComposition(CompositionRule):
    """Rényi-DP filters (Feldman–Zrnic 2021) for Gaussian, subsampled-Gaussian and pure-DP steps;
    valid when every step is chosen after seeing earlier answers.

    **Costs.** Step t costs ρ_t(α) at each watched order α: its declared curve (the
    Poisson-subsampled Gaussian, float Laplace), αρ for a zCDP cost (Gaussian family; Bun–Steinke
    2016, Def. 1.1), or the tight pure-DP bound for a pure ε step (Bun–Steinke 2016, Prop. 3.3) —
    the least that applies (:func:`dpbudget.accountant.values.rdp.charge_rdp`). A step with δ_t > 0 and none of
    these (PTR, smooth sensitivity, a pipeline's allocation) has no Rényi bound: it is refused
    with ``MechanismNotAllowedError`` (use "advanced", which keeps a δ allowance for such steps).

    **One order** (``order=α``, or :func:`plan_order` from a declared workload): continuing while
    Σ_t ρ_t(α) ≤ B gives (α, B)-RDP under full adaptivity (Feldman–Zrnic 2021, "Individual
    Privacy Accounting via a Rényi Filter", Thm 4.3), hence (ε_B, δ_B)-DP with
    B = ε_B − log((α−1)/α) + (log δ_B + log α)/(α−1) (Canonne–Kamath–Steinke 2020, Prop. 12;
    Balle et al. 2020, Thm 21), rounded down (:func:`dpbudget.accountant.values.rdp.budget`).

    **The default: one order chosen from the first step.** Without ``order``/``orders``, the
    account's first step fixes the order: the one at which that step, repeated, admits the most
    steps (:func:`plan_order`'s search), with all of δ_B. Valid because the theorem needs α fixed
    before the interaction, and this α is a function of the limit and of the first step's
    *declared* cost only — public parameters the analyst chose before any noise was drawn, so
    before any data-dependent output. For a deterministic analyst the first step, hence α, is
    fixed outright; a randomised one's transcript law is, on both neighbours, the same mixture
    over its first choice, and a hockey-stick divergence of two mixtures with equal weights is at
    most the weighted average of the parts' (each ≤ δ_B at ε_B). (An account opened after other
    releases — a new window, an analyst's quota — gets α fixed given what came before it, the
    guarantee such accounts give anyway: docs/theory.md §4b.) The order is recorded in the
    state (``order``) by that first debit; a refused first step records nothing (the next first
    step chooses). A state charged before it had an order (spent under no limit) keeps order 0:
    its Rényi sum does not cover those steps, so only the basic branch can admit it. On a mixed
    workload whose first step is unlike the rest, plan instead (``order=plan_order(...)``).

    **Several orders** (``orders=``): order α_j gets the share δ_j = δ_B/k and budget B_j at δ_j;
    a step is admitted while *some* order still fits. Proof that this is (ε_B, δ_B)-DP, with the
    same argument as the "advanced" rule's union. Let Y be the transcript, T its length, and τ_j
    the last step at which order j's sum is within B_j (sums only grow, so order j fits exactly
    up to τ_j); T = max_j τ_j. Run alone against the same analyst, the filter of order j would
    release exactly Y_{1:τ_j} (the analyst's choices depend only on the past; halting is a valid
    filter's choice ρ = 0), so the privacy loss L_j of that prefix obeys
    E[(1 − e^{ε_B − L_j})_+] ≤ δ_j (the filter theorem and the conversion). Partition the
    outcomes by the j with T = τ_j (ties to the lowest j); on that part L(Y) = L_j(Y_{1:τ_j}). So
    the hockey-stick divergence E[(1 − e^{ε_B − L(Y)})_+] ≤ Σ_j E[(1 − e^{ε_B − L_j})_+] ≤
    Σ_j δ_j = δ_B, and the same for the neighbours swapped. The basic branch joins the union as
    one more part: on it every step is pure and |L(Y)| ≤ Σε_i ≤ ε_B, which adds 0 (as in
    ``AdvancedComposition``). So "renyi" never admits fewer pure-DP steps than "basic". The proof
    is in docs/theory.md §4b too.

    **State** (O(1) in the steps): ``epsilon``/``delta`` the basic sums and ``r0``, ``r1``, ...
    the Rényi sums Σ_t ρ_t(α_j) (the default: ``order`` and ``r0``). **spent** is the smaller of
    the basic statement (while every step is pure) and the least ε_j at which the filter would
    still admit the state: each order's conversion at its own share δ_j (the ε whose budget
    B_j(ε) at δ_j its sum reaches), paired with δ_B; at most ε_B.

    Args:
        limit: (ε_B, δ_B) with δ_B > 0; ``None`` for no limit (spend still tracked).
        per_query: an optional cap on any single step's (ε, δ).
        order: one order α in [1.1, 4096] fixed now; ``None``: chosen from the first step.
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
        self.first_step = chosen is None  # the order is chosen from the first step's cost
        self.orders: tuple[float, ...] = chosen or ()
        self._memo = (0.0, -math.inf)  # the chosen order and its budget, computed once
        if self.limit is None:
            self.deltas: tuple[float, ...] = tuple(0.0 for _ in self.orders)
            self.budgets: tuple[float, ...] = tuple(math.inf for _ in self.orders)
        else:
            eps, delta = self.limit.epsilon, self.limit.delta
            if delta == 0.0:
                raise InvalidArgumentError(
                    "limit", limit, "a budget with delta > 0 for the 'renyi' composition rule",
                    "A Rényi budget converts to (epsilon, delta) only with delta > 0; for "
                    "pure-DP steps use 'basic'")
            k = len(self.orders)
            share = delta if k <= 1 else math.nextafter(delta / k, 0.0)
            self.deltas = tuple(share for _ in self.orders)
            self.budgets = tuple(rdp.budget(eps, share, a) for a in self.orders)
            if chosen is not None and not any(b > 0.0 for b in self.budgets):
                floor = 1.0 + math.log(1.0 / delta) / eps
                raise InvalidArgumentError(
                    "order", order, f"an order at which this limit leaves a positive Rényi "
                    f"budget (above about {floor:.3g} for {self.limit})")
        self._keys = ("r0",) if self.first_step else tuple(f"r{j}" for j in range(len(self.orders)))

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
        if self.first_step:
            state["order"] = 0.0
        state.update((key, 0.0) for key in self._keys)
        return state

    def debit(self, state: State, charge: Charge) -> State:
        return super().debit(self._opened(state, charge), charge)

    def max_steps(self, state: State, charge: Charge) -> int:
        return super().max_steps(self._opened(state, charge), charge)

    def _opened(self, state: State, charge: Charge) -> State:
        """``state``, with the order of the first step set when it is this one: a state nothing
        has been charged to, under a limit (the plan needs its δ_B), in the default mode. A
        state stored without an order (under no limit, before issue 29) gets order 0."""
        if not self.first_step:
            return state
        if "order" not in state:
            state = {"order": 0.0, "r0": 0.0, **state}
        # A free step (0-DP: it reveals nothing) fixes nothing: planned on, it would pick the
        # smallest order and leave later steps a poor one (found by review).
        if (not state["order"] and self.limit is not None and (charge.epsilon or charge.delta)
                and not (state["epsilon"] or state["delta"] or state["r0"])):
            return {**state, "order": self._first_order(charge)}
        return state

    def _first_order(self, charge: Charge) -> float:
        """The order at which ``charge`` (a batch: all its parts) repeated admits the most steps
        at δ_B; 0.0 (no Rényi branch) for a step without a Rényi bound, which ``debit`` then
        refuses."""
        check_charge(charge)
        return _first_step_order(self.bound.epsilon, self.bound.delta, charge.parts or (charge,))

    def _budget_at(self, alpha: float) -> float:
        memo = self._memo
        if memo[0] != alpha:
            valid = rdp.MIN_ORDER <= alpha <= rdp.MAX_ORDER  # (a forged order has no budget)
            memo = self._memo = (alpha, rdp.budget(self.bound.epsilon, self.bound.delta, alpha)
                                 if valid else -math.inf)
        return memo[1]

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
        if self.first_step:
            alpha = new["order"] = state["order"]
            # No order yet (0), or a forged one outside the curves' domain: nothing to sum.
            new["r0"] = sum_up(state["r0"], rdp.charge_rdp(charge, alpha) or 0.0, n) \
                if rdp.MIN_ORDER <= alpha <= rdp.MAX_ORDER else state["r0"]
            return new
        for key, alpha in zip(self._keys, self.orders):
            new[key] = sum_up(state[key], rdp.charge_rdp(charge, alpha) or 0.0, n)
        return new

    def _fits(self, state: State) -> bool:
        within = _numeric.within
        if state["delta"] == 0.0 and within(state["epsilon"], self.bound.epsilon):
            return True
        if self.first_step:
            alpha = state.get("order", 0.0)
            b = self._budget_at(alpha) if alpha else -math.inf
            return b > 0.0 and within(state["r0"], b)
        return any(b > 0.0 and within(state[key], b) for key, b in zip(self._keys, self.budgets))

    def _refusal(self) -> str:
        where = ("at the order its first step fixed" if self.first_step else
                 "at every order (" + ", ".join(f"{a:g}" for a in self.orders) + ")")
        return (f"renyi composition: the step would exceed the Renyi budget {where}, and the "
                f"basic branch (pure steps, sum of epsilon <= epsilon_B) does not admit it")

    def _watched(self, state: State) -> list[tuple[str, float, float]]:
        """(key, order, δ share) of each order the state is summed at."""
        if self.first_step:
            alpha = state.get("order", 0.0)
            valid = rdp.MIN_ORDER <= alpha <= rdp.MAX_ORDER
            return [("r0", alpha, self.bound.delta)] if valid else []
        return list(zip(self._keys, self.orders, self.deltas))

    def _candidates(self, state: State) -> list[tuple[float, float]]:
        out = []
        if state["delta"] == 0.0:
            out.append((state["epsilon"], 0.0))
        limit = self.bound
        # Each order converts at its own share δ_j, the one its budget was set at: the least ε
        # at which this filter would still admit the state (at δ_B it would read lower than
        # what is guaranteed, issue 29).
        best = min((rdp.epsilon(state[key], a, d) for key, a, d in self._watched(state)
                    if state[key] > 0.0), default=None)
        if best is not None:
            # An admitted state converts within ε_B at the order that fits; a state over the
            # limit (a limit lowered since, a forged state) must read as over it.
            out.append((min(best, limit.epsilon) if self._fits(state) else best, limit.delta))
        return out or [(state["epsilon"], state["delta"])]


@lru_cache(maxsize=256)
def _first_step_order(eps: float, delta: float, parts: tuple[Charge, ...]) -> float:
    """:meth:`RenyiComposition._first_order` for a limit (ε, δ): a pure function of public
    numbers, kept for the accounts that open with the same step (each window of a windowed
    limit, each analyst's account), so that only the first of them pays the search (~20 ms)."""
    if any(rdp.charge_rdp(p, 2.0) is None for p in parts):
        return 0.0
    return _most_steps(Budget(eps, delta), lambda a: math.fsum(rdp.charge_rdp(p, a) or 0.0
                                                               for p in parts))[0]


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
    as orders can matter for this limit: 16 times the scale 1 + ln(1/δ)/ε of a Gaussian
    workload's best order (about 1 + 2 ln(1/δ)/ε), and at least 256."""
    top = min(rdp.MAX_ORDER, max(256.0, 16.0 * (1.0 + math.log(1.0 / limit.delta)
                                                 / limit.epsilon)))
    out = [round(1.1 + 0.01 * i, 2) for i in range(890)]
    out += [round(10.0 + 0.1 * i, 1) for i in range(900)]
    a = 100.0
    while a <= top:
        out.append(float(round(a)))
        a *= 1.01
    return out


def _steps(limit: Budget, alpha: float, cost: float) -> float:
    """How many steps of Rényi cost ``cost`` at order ``alpha`` fit this limit's budget there
    (``inf`` for a free step; 0 where there is no budget)."""
    b = rdp.budget(limit.epsilon, limit.delta, alpha)
    if not b > 0.0 or cost > b:
        return 0.0
    ratio = math.inf if cost == 0.0 else b / cost  # (may overflow to inf: a near-free step)
    return ratio if math.isinf(ratio) else float(math.floor(ratio))


def _most_steps(limit: Budget, cost: Callable[[float], float]) -> tuple[float, float]:
    """The order (and its count) at which steps of Rényi curve ``cost`` fit most often; among
    orders admitting as many, the one with the most budget left, then the smallest."""
    def score(alpha: float) -> tuple[float, float, float]:
        c = cost(alpha)
        n = _steps(limit, alpha, c)
        b = rdp.budget(limit.epsilon, limit.delta, alpha)
        left = 0.0 if n == 0.0 or math.isinf(n) else b / c - n
        return n, left, -alpha

    best = max(_candidate_orders(limit), key=score)
    return best, score(best)[0]


def plan_order(limit: Budget, workload: Any, steps: int | None = None) -> float:
    """The one order at which a ``renyi`` budget ``limit`` suits a declared workload best: with
    ``steps``, the order at which that many steps of ``workload`` (a mechanism, or its
    ``Charge``) reach the smallest ε at δ_B, among the orders that admit at least one step;
    without, the order that admits the most steps. Never an order admitting no step.

    The order must be fixed before any release (the filter theorem needs it); planning from a
    workload declared in advance keeps it so. Pass it as ``order=`` to the accountant (without
    one, the accountant plans from its first step: the same order as ``steps=None``).

    Raises:
        InvalidArgumentError: δ_B = 0, a non-positive ``steps``, a workload with no Rényi
            bound, or one not one step of which fits the Rényi budget at any order.

    >>> from dpbudget.accountant.values.charge import Charge
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

    def cost(alpha: float) -> float:
        return rdp.charge_rdp(charge, alpha) or 0.0

    n = None if steps is None else _validate.positive_int("steps", steps)
    best, count = _most_steps(limit, cost)
    if count == 0.0:
        raise InvalidArgumentError("workload", charge.mechanism or "the step",
                                   f"a step that fits the Renyi budget of {limit} at some order "
                                   f"(none does; a pure-DP step may still fit under 'basic')")
    if n is None:
        return best

    def score(alpha: float) -> tuple[float, float]:
        value = _numeric.mul_up(float(n), cost(alpha))
        return -rdp.epsilon(value, alpha, limit.delta), -alpha

    return max((a for a in _candidate_orders(limit) if _steps(limit, a, cost(a)) >= 1.0),
               key=score)
