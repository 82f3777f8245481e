"""The "pld" rule: a fixed DP-SGD step declared with the budget, composed by its privacy-loss
distribution.

Invariant: every admitted release is charged exactly the declared step (the Poisson-subsampled
Gaussian at rate q, noise multiplier z); at most k_max releases are admitted, k_max fixed once at
construction from the pessimistic PLD (:mod:`dpbudget.accountant.composition.privacy_loss`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from dpbudget.accountant.values import _validate, rdp
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import privacy_loss
from dpbudget.accountant.composition.base import CompositionRule, State, _budget, check_charge
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["PLDComposition"]


class PLDComposition(CompositionRule):
    """k-fold composition of one declared Poisson-subsampled Gaussian step, by its PLD.

    The budget declares the step, ``step=(q, z)``: every release is the sampled Gaussian
    mechanism at rate q and noise multiplier z (``SubsampledGaussian(z, sampling_rate=q, noise="float")``), or
    one it dominates (rate ≤ q, multiplier ≥ z: a mixture with the null output and added noise,
    both post-processing of the declared pair, so the declared pair dominates it; Zhu–Dong–Wang
    2022, dominating pairs, and joint convexity of the hockey-stick divergence), charged as a full step. Any
    other mechanism is refused with ``MechanismNotAllowedError``. k_max, the largest k whose
    k-fold composition is (ε_B, δ_B)-DP by the pessimistic PLD (the worse of the add and remove
    directions), is computed once, here.

    **Why a PLD is valid here, where a PLD filter is not.** Composition theorems for PLDs (and
    f-DP) hold for adaptively chosen *queries and data* with each step's dominating pair fixed in
    advance (Zhu–Dong–Wang 2022, their adaptive composition theorem for dominating pairs); with adaptively chosen *parameters* they fail, and PLD
    or f-DP filters are invalid (docs/theory.md §4b). Declaring the step with the budget makes the
    sequence of dominating pairs non-adaptive: the k_max-fold product of one pair. Stopping early
    is post-processing of k_max releases. Exact (discrete Gaussian) noise has no proven PLD
    here: it is refused (use ``noise="float"``, or the "renyi" rule).

    **State** (O(1)): ``count``, the releases admitted so far. **spent** is the Rényi conversion
    of ``count`` steps at δ_B (valid, cheap, informative; at most ε_B while admitted);
    ``max_releases`` is exactly k_max − count.

    Args:
        limit: (ε_B, δ_B) with δ_B > 0; required.
        per_query: an optional cap on any single step's (ε, δ).
        step: (q, z): the sampling rate in (0, 1] and the noise multiplier z in [0.5, 50] (a
            documented cap: below, the loss grid grows too large; above, k_max reaches its cap).

    Raises:
        InvalidArgumentError: no limit, δ_B = 0, or ``step`` missing or out of range.

    >>> PLDComposition(Budget(3.0, 1e-5), step=(0.01, 1.0)).k_max
    2666
    """

    name = "pld"
    state_params = ("step",)

    def __init__(self, limit: Budget | None, per_query: Budget | None = None, *,
                 step: Any = None) -> None:
        super().__init__(limit, per_query)
        if self.limit is None or not self.limit.delta > 0.0:
            raise InvalidArgumentError(
                "limit", limit, "a finite budget with delta > 0 for the 'pld' composition rule",
                "The Gaussian's privacy loss is unbounded: no finite number of steps is pure DP")
        self.step = _valid_step(step)
        q, z = self.step
        self.k_max = _k_max(q, z, self.limit.epsilon, self.limit.delta)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "PLDComposition":
        step = config.get("step")
        return cls(_budget(config.get("limit")), _budget(config.get("per_query")),
                   step=tuple(step) if isinstance(step, list) else step)

    def _describe(self) -> dict[str, Any]:
        return {**super()._describe(), "step": list(self.step), "k_max": self.k_max}

    def initial_state(self) -> State:
        return {"count": 0}

    def _admit(self, charge: Charge) -> None:
        curve = charge.rdp
        q, z = self.step
        if not (curve is not None and curve[0] == "poisson-gaussian" and curve[1] <= q
                and curve[2] >= z):
            raise self._not_allowed(
                charge, f"this budget was declared for the Poisson-subsampled Gaussian step "
                f"(q={q!r}, z={z!r}) with float noise, and admits only that step or one with a "
                "lower rate and a higher noise multiplier")
        super()._admit(charge)

    def _step(self, state: State, charge: Charge, n: int) -> State:
        return {"count": int(state["count"]) + n}

    def _fits(self, state: State) -> bool:
        return state["count"] <= self.k_max

    def _refusal(self) -> str:
        return (f"pld composition: all k_max = {self.k_max} steps at (q, z) = {self.step} have "
                "been used")

    def max_steps(self, state: State, charge: Charge) -> int:
        check_charge(charge)
        self._admit(charge)
        return max(0, self.k_max - int(state["count"]))

    def _candidates(self, state: State) -> list[tuple[float, float]]:
        k = float(state["count"])
        q, z = self.step
        limit = self.bound
        best = min(rdp.epsilon(k * rdp.poisson_gaussian(q, z, a), a, limit.delta)
                   for a in _ORDERS)
        return [(min(best, limit.epsilon) if self._fits(state) else max(best, limit.epsilon),
                 limit.delta)]


# The orders spent() converts at: k fixed steps are RDP at every order at once (a fixed
# composition), so the least ε over any set of orders is valid; this one spans the orders where
# a DP-SGD workload's conversion is least.
_ORDERS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0)


@lru_cache(maxsize=64)
def _k_max(q: float, z: float, eps: float, delta: float) -> int:
    """k_max for one (step, limit): about 0.3 s of FFTs, and the rule is rebuilt on every ledger
    open and audit replay, so computed once per process (a pure function of its arguments)."""
    return privacy_loss.max_steps(q, z, eps, delta)


def _valid_step(step: Any) -> tuple[float, float]:
    if step is None:
        raise InvalidArgumentError(
            "step", step, "the fixed step (q, z) for the 'pld' composition rule",
            "Declare it, e.g. Accountant(Budget(3.0, 1e-5), composition='pld', "
            "step=(0.01, 1.0))")
    if isinstance(step, (str, bytes)) or not isinstance(step, (tuple, list)) or len(step) != 2:
        raise InvalidTypeError("step", step, "a pair (q, z)")
    q = _validate.real("step[0]", step[0])
    z = _validate.real("step[1]", step[1])
    if not 0.0 < q <= 1.0:
        raise InvalidArgumentError("step[0]", step[0], "a sampling rate q in (0, 1]")
    if not 0.5 <= z <= 50.0:  # a documented cap: the loss grid's size grows like 1/z²
        raise InvalidArgumentError("step[1]", step[1], "a noise multiplier z in [0.5, 50]")
    return (q, z)
