"""The "gaussian" rule: a Gaussian-DP filter for Gaussian-family steps.

Invariant: admitted only while Σμ_i² ≤ μ_B², μ_B fixed once at construction; a step without a GDP
parameter (charge.mu is None) is refused with ``MechanismNotAllowedError``.
"""

from __future__ import annotations

import math
from typing import Any, cast

from dpbudget.accountant.values import _numeric
from dpbudget.accountant.values.budget import Budget  # noqa: F401 (doctest)
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import bounds
from dpbudget.accountant.composition.base import CompositionRule, State, sum_up
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["GaussianComposition"]


class GaussianComposition(CompositionRule):
    """Gaussian differential privacy, composed exactly, for Gaussian-family steps only.

    Step i is μ_i-GDP with μ_i = Δ_i/σ_i; composition is sqrt(Σμ_i²)-GDP (Dong, Roth, Su 2019,
    "Gaussian Differential Privacy", Cor. 3.3), and this holds as a filter when each μ_i is
    chosen after seeing earlier answers: continuing while Σμ_i² ≤ μ_B² gives μ_B-GDP (Smith and
    Thakurta 2022, "Fully Adaptive Composition for Gaussian Differential Privacy"). μ_B is the
    largest μ with δ_μ(ε_B) ≤ δ_B, δ_μ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong–Roth–Su
    Cor. 2.13; :func:`~accountant.composition.bounds.gdp_mu`), computed once, rounded down.

    A step whose mechanism has no GDP parameter (Laplace, DiscreteGaussian, and the Gaussians with
    their default exact noise, which declare ρ but no μ: docs/exact-noise.md) is refused with
    ``MechanismNotAllowedError``: GDP of such a step would have to go through a lossy
    conversion, which the "advanced" rule does better.

    **State** (O(1)): ``mu2`` Σμ_i², and the basic sums ``epsilon``, ``delta`` of the declared costs.
    **spent** is (min(ε_GDP(sqrt(Σμ_i²)) at δ_B, Σε_i while Σδ_i ≤ δ_B), δ_B): the smaller ε of
    the exact GDP statement and the basic one, at the limit's δ (with no limit: the basic sums);
    **remaining** is the limit minus that, rounded down (informative; ``max_releases`` answers
    what fits).

    Raises:
        InvalidArgumentError: a limit with δ_B = 0 (no μ > 0 is (ε, 0)-DP).

    >>> rule = GaussianComposition(Budget(1.0, 1e-6))
    >>> round(rule.mu_budget, 6)
    0.236704
    """

    name = "gaussian"

    def __init__(self, limit: Budget | None, per_query: Budget | None = None) -> None:
        super().__init__(limit, per_query)
        if self.limit is None:
            self.mu_budget = self.mu2_budget = math.inf
        else:
            if self.limit.delta == 0.0:
                raise InvalidArgumentError("limit", limit, "a budget with delta > 0 for the "
                                           "'gaussian' composition rule")
            self.mu_budget = bounds.gdp_mu(self.limit.epsilon, self.limit.delta)
            self.mu2_budget = math.nextafter(self.mu_budget * self.mu_budget, 0.0)

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(),
                "mu_budget": None if math.isinf(self.mu_budget) else self.mu_budget}

    def initial_state(self) -> State:
        return {"mu2": 0.0, "epsilon": 0.0, "delta": 0.0}

    def _admit(self, charge: Charge) -> None:
        if charge.mu is None:
            raise self._not_allowed(charge, "it has no Gaussian-DP parameter mu (only "
                                    "Gaussian-family mechanisms with noise='float' compose "
                                    "under this rule; exact-noise Gaussians declare zCDP rho: "
                                    "use the 'advanced' rule)")
        super()._admit(charge)

    def _step(self, state: State, charge: Charge, n: int) -> State:
        mu = cast(float, charge.mu)  # _admit refused a step without one
        return {"mu2": sum_up(state["mu2"], _numeric.mul_up(mu, mu), n),
                "epsilon": sum_up(state["epsilon"], charge.epsilon, n),
                "delta": sum_up(state["delta"], charge.delta, n)}

    def _fits(self, state: State) -> bool:
        return _numeric.within(state["mu2"], self.mu2_budget)

    def _refusal(self) -> str:
        return f"gaussian composition: Σμ² would exceed μ_B² (μ_B = {self.mu_budget!r})"

    def _candidates(self, state: State) -> list[tuple[float, float]]:
        mu = math.nextafter(math.sqrt(state["mu2"]), math.inf)
        return [(state["epsilon"], state["delta"]),
                (bounds.gdp_epsilon(mu, self.bound.delta), self.bound.delta)]
