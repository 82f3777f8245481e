"""The interface every composition rule implements.

Invariant: a rule is a pure function of (its limit, its O(1) running state, the step's declared
charge). It never rescans history, never draws noise, and never mutates anything: ``debit`` returns a
new state or raises, and the accountant writes that state to the ledger in the same transaction that
checked it. The state is a small JSON-serialisable dict, so any ledger can persist and resume it.
"""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from dpbudget.accountant.values import _numeric, rdp
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.values.errors import InvalidArgumentError, MechanismNotAllowedError

State = dict[str, float]

__all__ = ["Charge", "CompositionRule", "Refused", "State", "check_charge", "clip_delta", "sum_up",
           "tightest"]


class Refused(Exception):
    """Raised by ``CompositionRule.debit`` when the step does not fit; the accountant turns it into
    a ``BudgetExceededError`` that names the dataset."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CompositionRule(ABC):
    """How the costs of successive steps add up against one limit.

    Args:
        limit: the limit this rule enforces; ``None`` means no limit (spend is still tracked).
        per_query: an optional cap on any single step's (ε, δ).
    """

    name: ClassVar[str]
    #: Configuration members the state's meaning depends on: they cannot change once the account
    #: has recorded a debit (the optimal rule's count is a count of releases at one fixed cost).
    state_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self, limit: Budget | None, per_query: Budget | None = None) -> None:
        # One meaning of "no limit" inside the library: None (``Budget.unlimited()`` is accepted).
        self.limit = None if limit is None or limit.is_unlimited else limit
        self.per_query = per_query
        self._description: dict[str, Any] | None = None
        self._spent_cache: tuple[tuple[float, ...], Budget] | None = None

    @property
    def bound(self) -> Budget:
        """The limit, in code that only runs when there is one (``_fits``, ``_candidates``)."""
        if self.limit is None:  # pragma: no cover - callers check first
            raise RuntimeError(f"the {self.name!r} rule has no limit to check against")
        return self.limit

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CompositionRule":
        """The rule that ``describe()`` produced ``config`` (as stored in a ledger)."""
        return cls(_budget(config.get("limit")), _budget(config.get("per_query")))

    @abstractmethod
    def initial_state(self) -> State:
        """The state of a limit nothing has been spent from."""

    def debit(self, state: State, charge: Charge) -> State:
        """The state after the step, or ``Refused`` if it does not fit. Must not mutate ``state``.

        A batch (``charge.parts``) is one step: its items are folded into the state and the
        limit is checked once, on the result.

        Raises:
            Refused: the step does not fit what is left of the limit.
            MechanismNotAllowedError: the rule does not admit this kind of step at all.
            InvalidArgumentError: a cost that is not a valid privacy cost (negative, NaN or
                infinite ε, ρ or μ; δ outside [0, 1)) — checked here, where every debit and
                every audit replay passes, not only where costs are built.
        """
        check_charge(charge)
        new = state
        for part in charge.parts or (charge,):
            self._admit(part)
            new = self._step(new, part, 1)
        if self.limit is not None and not self._fits(new):
            raise Refused(self._refusal_for(charge))
        return new

    def max_steps(self, state: State, charge: Charge) -> int:
        """How many more steps of exactly ``charge`` fit, from ``state`` (``sys.maxsize`` when
        nothing limits them). O(log n) evaluations of the closed-form state after n steps; an
        answer up to ``_EXACT_STEPS`` is then settled by replaying the debits themselves, because
        the closed form (n·x rounded up once) and the debits (x added n times, each sum rounded
        up) can disagree by a step where the total lands within a few ulps of the tolerance edge.
        A larger answer is the closed form's, which can still be a step off at that edge.

        Raises:
            MechanismNotAllowedError: the rule does not admit this kind of step at all.
            InvalidArgumentError: an invalid cost (as for ``debit``).
        """
        check_charge(charge)
        try:
            self._admit(charge)
        except Refused:  # above the per-query cap: not one fits
            return 0
        if self.limit is None:
            return sys.maxsize
        if not self._fits(self._step(state, charge, 1)):
            return 0
        lo, hi = 1, 2
        while self._fits(self._step(state, charge, hi)):
            lo, hi = hi, 2 * hi
            if hi >= sys.maxsize:
                return sys.maxsize
        while hi - lo > 1:  # fits(lo) and not fits(hi)
            mid = (lo + hi) // 2
            if self._fits(self._step(state, charge, mid)):
                lo = mid
            else:
                hi = mid
        return self._replayed(state, charge, lo) if lo <= _EXACT_STEPS else lo

    def _replayed(self, state: State, charge: Charge, estimate: int) -> int:
        """The number of ``debit``s of ``charge`` that ``state`` admits, counted one by one (the
        closed-form ``estimate`` is off by a step at most)."""
        n = 0
        while n <= estimate + _EXACT_SLACK:
            try:
                state = self.debit(state, charge)
            except Refused:
                return n
            n += 1
        return n

    def admits(self, state: State) -> bool:
        """Whether ``state`` is within the limit (always, without one): what the audit checks of
        a stored state it could not replay step by step (``dpbudget.accountant.audit.run``)."""
        return self.limit is None or self._fits(state)

    @abstractmethod
    def _step(self, state: State, charge: Charge, n: int) -> State:
        """The state after ``n`` more steps of ``charge`` (sums rounded up), without checking."""

    @abstractmethod
    def _fits(self, state: State) -> bool:
        """Whether ``state`` is within the limit (only called when there is one)."""

    def _refusal(self) -> str:
        return f"{self.name} composition: the step would exceed the limit"

    def _refusal_for(self, charge: Charge) -> str:
        """The refusal of ``charge``: ``_refusal``, with what to change where a rule knows."""
        return self._refusal()

    def _admit(self, charge: Charge) -> None:
        """Refuse a step this rule cannot account at all, or one above the per-query cap."""
        self._check_per_query(charge)

    def spent(self, state: State) -> Budget:
        """How much of the limit the releases so far have used, as (ε, δ), rounded up: with a
        limit, the tightest statement the rule's state converts to (``_candidates``); with no
        limit, the basic-composition totals (Σε_i, Σδ_i). Cached per state.

        What is *guaranteed* is the limit: a filter admits steps while they fit, and the whole
        interaction is then (ε_B, δ_B)-DP however the analyst adapted (docs/theory.md §1). Reading
        the running totals as a guarantee in their own right is an odometer, which adaptive
        choices do not support in general (Rogers–Roth–Ullman–Vadhan 2016); the exception is
        basic composition of pure-DP steps, whose privacy loss is bounded by Σε_i pointwise."""
        key = tuple(state.values())
        cached = self._spent_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        basic = (state.get("epsilon", 0.0), state.get("delta", 0.0))
        if self.limit is None or not any(key):
            result = Budget(basic[0], clip_delta(basic[1]))
        else:
            result = tightest(self._candidates(state), self.limit)
        self._spent_cache = (key, result)
        return result

    def _candidates(self, state: State) -> list[tuple[float, float]]:
        """Valid (ε, δ) statements about the state, each non-decreasing as the state grows."""
        return [(state["epsilon"], state["delta"])]

    def remaining(self, state: State) -> Budget:
        """What is left of the limit: the limit minus ``spent``, component-wise, rounded down
        (``Budget.unlimited()`` when there is none). For rules that do not add up linearly
        (advanced, optimal, gaussian) this is informative, not a promise that a step of that
        cost fits: ``Accountant.can_afford`` and ``max_releases`` answer that."""
        if self.limit is None:
            return Budget.unlimited()
        used = self.spent(state)
        return Budget(max(0.0, _numeric.sub_down(self.limit.epsilon, used.epsilon)),
                      max(0.0, _numeric.sub_down(self.limit.delta, used.delta)))

    def describe(self) -> dict[str, Any]:
        """The rule's public configuration (plain JSON data; the ledger records it with every
        debit of the account, and ``rule_from_config`` rebuilds the rule from it)."""
        if self._description is None:
            self._description = self._describe()
        return self._description

    def conflict(self, recorded: dict[str, Any]) -> str | None:
        """Why this rule cannot continue an account recorded with configuration ``recorded``
        (another rule, or another value of a ``state_params`` member), or None."""
        if recorded.get("rule") != self.name:
            return (f"it was started under the {recorded.get('rule')!r} composition rule and "
                    f"this one is {self.name!r}; a rule cannot change once releases are recorded")
        mine = self.describe()
        for param in self.state_params:
            if recorded.get(param) != mine.get(param):
                return (f"its {param} was {recorded.get(param)} and is now {mine.get(param)}; "
                        f"the {self.name!r} rule's state only means something at one {param}")
        return None

    def _describe(self) -> dict[str, Any]:
        return {
            "rule": self.name,
            "limit": None if self.limit is None else self.limit.model_dump(),
            "per_query": None if self.per_query is None else self.per_query.model_dump(),
        }

    def _not_allowed(self, charge: Charge, why: str) -> MechanismNotAllowedError:
        return MechanismNotAllowedError(
            f"the {self.name!r} composition rule does not admit {charge.mechanism or 'this step'} "
            f"(cost epsilon={charge.epsilon!r}, delta={charge.delta!r}): {why}; nothing was drawn "
            f"and nothing was debited")

    def _check_per_query(self, charge: Charge) -> None:
        cap = self.per_query
        if cap is not None and (charge.epsilon > cap.epsilon or charge.delta > cap.delta):
            raise Refused(f"the step's cost exceeds the per-query cap {cap}")


def _budget(data: dict[str, float] | None) -> Budget | None:
    return None if data is None else Budget(**data)



def check_charge(charge: Charge) -> None:
    """Refuse a charge that is not a valid privacy cost: a negative or NaN cost would hand
    budget back, an infinite one would poison the running sums. Written so that NaN fails."""
    if not charge.parts:  # the common case, on every debit: four comparisons
        rho, mu = charge.rho, charge.mu
        if (0.0 <= charge.epsilon < math.inf and 0.0 <= charge.delta < 1.0
                and (rho is None or 0.0 <= rho < math.inf)
                and (mu is None or 0.0 <= mu < math.inf) and charge.rdp is None):
            return
    for part in charge.parts or (charge,):
        if part.rdp is not None:
            why = rdp.check_curve(part.rdp)
            if why is not None:
                raise InvalidArgumentError("rdp", part.rdp, why, f"declared by "
                                           f"{part.mechanism or 'a step'}; nothing was drawn or "
                                           "debited")
        if not (0.0 <= part.epsilon < math.inf and 0.0 <= part.delta < 1.0
                and (part.rho is None or 0.0 <= part.rho < math.inf)
                and (part.mu is None or 0.0 <= part.mu < math.inf)):
            raise InvalidArgumentError(
                "cost", (part.epsilon, part.delta, part.rho, part.mu),
                "a valid privacy cost: finite epsilon, rho and mu >= 0 and 0 <= delta < 1",
                f"declared by {part.mechanism or 'a step'}; nothing was drawn or debited")
    if charge.parts and not (0.0 <= charge.epsilon < math.inf and 0.0 <= charge.delta):
        raise InvalidArgumentError("cost", (charge.epsilon, charge.delta),
                                   "a valid batch total", "nothing was drawn or debited")


# max_steps counts the debits one by one below this many (about a millisecond of work each 1,000).
_EXACT_STEPS = 4096
_EXACT_SLACK = 16


def sum_up(total: float, x: float, n: int) -> float:
    """``total + n·x`` rounded up (n·x exact for n = 1, else rounded up too)."""
    return _numeric.add_up(total, x if n == 1 else _numeric.mul_up(float(n), x))


def tightest(candidates: list[tuple[float, float]], limit: Budget) -> Budget:
    """One (ε, δ) statement from several valid ones: the smallest ε among those whose δ is within
    the limit's δ, paired with the largest such δ (each (ε_i, δ_i) implies (ε_i, max δ)). Rules
    offer candidates whose ε and δ only grow with the state, and a candidate only ever leaves the
    set when another with a δ at least as large remains, so the result is monotone in both
    components (checked by the property tests)."""
    ok = [c for c in candidates if c[1] <= limit.delta] or candidates
    return Budget(min(c[0] for c in ok), clip_delta(max(c[1] for c in ok)))


def clip_delta(delta: float) -> float:
    """A δ total as a valid ``Budget`` δ (< 1)."""
    return min(delta, math.nextafter(1.0, 0.0))
