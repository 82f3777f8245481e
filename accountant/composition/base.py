"""The interface every composition rule implements.

Invariant: a rule is a pure function of (its limit, its O(1) running state, the step's declared
charge). It never rescans history, never draws noise, and never mutates anything: ``debit`` returns a
new state or raises, and the accountant writes that state to the ledger in the same transaction that
checked it. The state is a small JSON-serialisable dict, so any ledger can persist and resume it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from accountant.budget import Budget
from accountant.ledger.record import assemble, canonical

State = dict[str, float]

__all__ = ["Charge", "CompositionRule", "Refused", "State"]


@dataclass(frozen=True, slots=True)
class Charge:
    """What a rule needs to know about one step, as declared by the mechanism.

    Attributes:
        epsilon, delta: the step's (ε, δ)-DP cost.
        rho: its zero-concentrated DP cost where it has a tighter one (Gaussian family), else None.
        mu: its Gaussian-DP parameter where it has one (Gaussian family), else None.
        mechanism: the mechanism's name, for error messages.
    """

    epsilon: float
    delta: float
    rho: float | None = None
    mu: float | None = None
    mechanism: str = ""

    @property
    def budget(self) -> Budget:
        return Budget(self.epsilon, self.delta)


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

    def __init__(self, limit: Budget | None, per_query: Budget | None = None) -> None:
        self.limit = None if limit is None or limit.is_unlimited else limit
        self.per_query = per_query
        self._description: dict[str, Any] | None = None
        self._fragments: dict[str, str] | None = None
        self._template: tuple[str, str] | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CompositionRule":
        """The rule that ``describe()`` produced ``config`` (as stored in a ledger)."""
        return cls(_budget(config.get("limit")), _budget(config.get("per_query")))

    @abstractmethod
    def initial_state(self) -> State:
        """The state of a limit nothing has been spent from."""

    @abstractmethod
    def debit(self, state: State, charge: Charge) -> State:
        """The state after the step, or ``Refused`` if it does not fit. Must not mutate ``state``."""

    @abstractmethod
    def spent(self, state: State) -> Budget:
        """The (ε, δ) that the releases so far are guaranteed to satisfy, rounded up."""

    @abstractmethod
    def remaining(self, state: State) -> Budget:
        """What is left of the limit, rounded down (``Budget.unlimited()`` when there is none)."""

    def describe(self) -> dict[str, Any]:
        """The rule's public configuration, written to the ledger with every entry."""
        if self._description is None:
            self._description = self._describe()
        return self._description

    def describe_fragments(self) -> dict[str, str]:
        """``describe()`` with each member already encoded as canonical JSON (cached)."""
        if self._fragments is None:
            self._fragments = {k: canonical(v) for k, v in self.describe().items()}
        return self._fragments

    def account_text(self, state: State) -> str:
        """This rule's account in a ledger record, as canonical JSON: the configuration plus
        ``state``. The configuration part is laid out once (this is on every debit's path)."""
        if self._template is None:
            prefix, suffix = assemble({**self.describe_fragments(), "state": "\0"}).split("\0")
            self._template = (prefix, suffix)
        return self._template[0] + canonical(state) + self._template[1]

    def _describe(self) -> dict[str, Any]:
        return {
            "rule": self.name,
            "limit": None if self.limit is None else self.limit.model_dump(),
            "per_query": None if self.per_query is None else self.per_query.model_dump(),
        }

    def _check_per_query(self, charge: Charge) -> None:
        cap = self.per_query
        if cap is not None and (charge.epsilon > cap.epsilon or charge.delta > cap.delta):
            raise Refused(f"the step's cost exceeds the per-query cap {cap}")


def _budget(data: dict[str, float] | None) -> Budget | None:
    return None if data is None else Budget(**data)
