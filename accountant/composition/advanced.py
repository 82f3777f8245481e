"""The "advanced" rule: a zCDP filter, united with basic composition for pure-DP steps.

Invariant: admitted only while (every step so far pure and Σε_i ≤ ε_B) or (Σρ_i ≤ ρ_B and the
Σδ_i of approximate non-Gaussian steps ≤ the δ allowance); ρ_B is fixed once, at construction.
"""

from __future__ import annotations

import math
from typing import Any

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import bounds
from dpbudget.accountant.composition.base import CompositionRule, State, sum_up
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["AdvancedComposition"]


class AdvancedComposition(CompositionRule):
    """A zCDP privacy filter with a CKS-converted budget, plus basic composition for pure steps.

    Valid when every step is chosen after seeing earlier answers (docs/theory.md §2, "advanced").

    **Costs.** A pure ε-DP step costs ρ = ε²/2 (Bun–Steinke 2016, Prop. 1.4); a Gaussian-family
    step costs its declared ρ = Δ²/(2σ²) (Bun–Steinke Prop. 1.6); any other step with δ_i > 0 costs
    ρ = ε_i²/2 *and* adds δ_i to a separately tracked Σδ_i (an (ε, δ)-DP mechanism is δ-approximately
    ε²/2-zCDP, Bun–Steinke Prop. 1.4). A sparse-vector session's fixed cost is one pure step.

    **Filter.** Σρ_i ≤ ρ_B with Σδ_i ≤ δ_allow gives δ_allow-approximate ρ_B-zCDP under full
    adaptivity (Whitehouse, Ramdas, Rogers, Wu, ICML 2023, "Fully-Adaptive Composition in DP",
    Thm 1; Feldman–Zrnic NeurIPS 2021 for the Rényi filter), hence (ε_B, δ_conv + δ_allow)-DP by
    the Canonne–Kamath–Steinke 2020 conversion (Prop. 12/Cor. 13). ρ_B is the largest ρ whose
    conversion at δ_conv is ≤ ε_B (:func:`~accountant.composition.bounds.cks_rho_budget`), computed
    once. δ_conv = ``conversion_share`` × δ_B (default all of it); δ_allow = δ_B − δ_conv. Because
    CKS is tighter than ρ + 2sqrt(ρ ln(1/δ)), this filter admits at least as many steps as the
    WRRW advanced-composition filter ½Σε_i² + sqrt(2 ln(1/δ) Σε_i²) ≤ ε_B.

    **Union with basic composition (pure steps only).** A step is admitted if the zCDP filter
    admits it, *or* if every step so far, this one included, is pure (δ_i = 0) and Σε_i ≤ ε_B.
    Proof that the union is still (ε_B, δ_conv)-DP. Let Y be the whole transcript, T its length,
    E_t = Σ_{i≤t} ε_i and R_t = Σ_{i≤t} ρ_i; both are non-decreasing in t. Let τ be the last t with
    R_t ≤ ρ_B. The prefix Y_{1:τ} is exactly the transcript of the zCDP filter run against the same
    analyst, stopped at a stopping time (stopping is allowed in a filter: it is choosing ρ_i = 0
    from then on), so it is ρ_B-zCDP and its privacy loss L' satisfies
    E[(1 − e^{ε_B − L'})_+] ≤ δ_conv. Every step after τ has R_t > ρ_B, so it was admitted by the
    basic branch, which needs E_t ≤ ε_B; as E is non-decreasing, T > τ implies E_T ≤ ε_B.
    Split on the event A = {E_T ≤ ε_B}. On A all steps are pure and pure steps bound the privacy
    loss pointwise, |L(Y)| ≤ Σε_i = E_T ≤ ε_B, so (1 − e^{ε_B − L(Y)})_+ = 0 there. Off A, T = τ
    and L(Y) = L'(Y_{1:τ}). Hence the hockey-stick divergence
    E[(1 − e^{ε_B − L(Y)})_+] = E[(1 − e^{ε_B − L'})_+ ; not A] ≤ E[(1 − e^{ε_B − L'})_+] ≤ δ_conv.
    Once one approximate step (δ_i > 0, Gaussian or not) is admitted, the basic branch is closed
    for good (the argument needs the pointwise bound; it is not extended to δ_i > 0).
    So "advanced" never admits fewer steps than "basic" on a pure-DP sequence.

    **State** (O(1)): ``epsilon`` Σε_i and ``delta`` Σδ_i over all steps (basic sums), ``rho`` Σρ_i,
    ``approx`` Σδ_i of non-Gaussian approximate steps.

    **spent** combines the two statements the state supports — while every step is pure, the
    basic (Σε_i, 0); once Σρ_i > 0, the CKS conversion (ε_CKS(Σρ_i), δ_conv + Σδ_approx) — as
    (the smaller ε, the larger δ), so both components only grow (e.g. after 3 × Laplace(0.1)
    under (1, 1e-6): (0.3, 1e-6): the advanced rule is an approximate-DP filter). With no limit it
    is the basic sums. **remaining** is the limit minus ``spent``, rounded down — informative
    only: a zCDP budget does not subtract linearly, so use ``max_releases``.

    Args:
        limit: (ε_B, δ_B); ``None`` for no limit (spend still tracked).
        per_query: an optional cap on any single step's (ε, δ).
        conversion_share: the fraction of δ_B used for the zCDP → (ε, δ) conversion, in (0, 1].

    >>> rule = AdvancedComposition(Budget(1.0, 1e-6))
    >>> state = rule.initial_state()
    >>> rule.max_steps(state, Charge(0.01, 0.0))
    487
    """

    name = "advanced"
    #: ρ_B and the δ allowance are derived from it: a share changed mid-stream (after seeing
    #: results) would re-price everything already spent, which no proof covers.
    state_params = ("conversion_share",)

    def __init__(self, limit: Budget | None, per_query: Budget | None = None, *,
                 conversion_share: float = 1.0) -> None:
        super().__init__(limit, per_query)
        share = _validate_share(conversion_share)
        self.conversion_share = share
        if self.limit is None:
            self.delta_conv = self.delta_allow = 0.0
            self.rho_budget = math.inf
        else:
            d = self.limit.delta
            self.delta_conv = d if share == 1.0 else math.nextafter(d * share, 0.0)
            self.delta_allow = max(0.0, _numeric.sub_down(d, self.delta_conv))
            self.rho_budget = bounds.cks_rho_budget(self.limit.epsilon, self.delta_conv)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AdvancedComposition":
        rule = super().from_config(config)
        return cls(rule.limit, rule.per_query,
                   conversion_share=config.get("conversion_share", 1.0))

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(), "conversion_share": self.conversion_share,
                "conversion_delta": self.delta_conv, "delta_allowance": self.delta_allow,
                "rho_budget": None if math.isinf(self.rho_budget) else self.rho_budget}

    def initial_state(self) -> State:
        return {"epsilon": 0.0, "delta": 0.0, "rho": 0.0, "approx": 0.0}

    def _admit(self, charge: Charge) -> None:
        if (charge.rho is None and charge.delta > 0.0 and self.limit is not None
                and self.delta_allow == 0.0):
            raise self._not_allowed(
                charge, "it has delta > 0 and no zCDP cost, so it is charged to the rule's delta "
                "allowance, and this limit keeps none (conversion_share = "
                f"{self.conversion_share!r} gives all of delta to the zCDP conversion); set "
                "conversion_share below 1 (e.g. 0.5) to keep an allowance, or use 'basic'")
        super()._admit(charge)

    def _refusal_for(self, charge: Charge) -> str:
        big = [p for p in charge.parts or (charge,) if p.rho is not None and p.rho > self.rho_budget]
        if big:
            return (f"{self._refusal()}: one step alone costs rho = {big[0].rho!r}, more than "
                    f"the whole rho_B; the 'advanced' rule charges subsampled steps no "
                    f"amplification — compose DP-SGD under 'renyi'")
        return self._refusal()

    def _step(self, state: State, charge: Charge, n: int) -> State:
        rho = charge.rho
        approx = 0.0
        if rho is None:
            rho = 0.5 * _numeric.mul_up(charge.epsilon, charge.epsilon)
            approx = charge.delta
        return {"epsilon": sum_up(state["epsilon"], charge.epsilon, n),
                "delta": sum_up(state["delta"], charge.delta, n),
                "rho": sum_up(state["rho"], rho, n),
                "approx": sum_up(state["approx"], approx, n)}

    def _fits(self, state: State) -> bool:
        within = _numeric.within
        return ((state["delta"] == 0.0 and within(state["epsilon"], self.bound.epsilon))
                or (within(state["rho"], self.rho_budget)
                    and within(state["approx"], self.delta_allow)))

    def _refusal(self) -> str:
        return (f"advanced composition: Σρ would exceed ρ_B = {self.rho_budget!r} (or the δ "
                f"allowance) and the basic branch (pure steps, Σε ≤ ε_B) does not admit it")

    def _candidates(self, state: State) -> list[tuple[float, float]]:
        out = []
        if state["delta"] == 0.0:  # all steps pure: the basic statement (Σε_i, 0)
            out.append((state["epsilon"], 0.0))
        if state["rho"] > 0.0 and self.delta_conv > 0.0:
            out.append((bounds.cks_epsilon(state["rho"], self.delta_conv),
                        _numeric.add_up(self.delta_conv, state["approx"])))
        return out or [(state["epsilon"], state["delta"])]


def _validate_share(share: Any) -> float:
    x = _validate.real("conversion_share", share)
    if not 0.0 < x <= 1.0:
        raise InvalidArgumentError("conversion_share", share, "a number in (0, 1]")
    return x
