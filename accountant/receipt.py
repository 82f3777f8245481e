"""``Receipt``: what the caller learns about a debit that has committed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accountant.budget import Budget
from accountant.composition import CompositionRule, State

__all__ = ["Receipt"]


@dataclass(frozen=True)
class Receipt:
    """The record of one committed debit, as returned by ``Accountant.last_receipt``.

    Attributes:
        seq: the ledger record's sequence number.
        hash: the record's SHA-256 chain hash (keep it to detect later truncation).
        dataset, analyst, label: as given to ``release``.
        mechanism: the mechanism's name.
        cost: the declared (ε, δ) cost that was debited.
    """

    seq: int
    hash: str
    dataset: str
    analyst: str | None
    label: str | None
    mechanism: str
    cost: Budget
    _rule: CompositionRule
    _state: State

    @property
    def spent(self) -> Budget:
        """The dataset's spend right after this debit (under its composition rule)."""
        return self._rule.spent(self._state)

    @property
    def remaining(self) -> Budget:
        """What was left of the dataset's limit right after this debit."""
        return self._rule.remaining(self._state)

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "dataset": self.dataset,
                "analyst": self.analyst, "label": self.label, "mechanism": self.mechanism,
                "cost": self.cost.model_dump(), "spent": self.spent.model_dump(),
                "remaining": self.remaining.model_dump()}
