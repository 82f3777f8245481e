"""``Receipt``: what the caller learns about a debit that has committed."""

from __future__ import annotations

from typing import Any, NamedTuple

from accountant.budget import Budget
from accountant.composition import CompositionRule, State

__all__ = ["Receipt"]


class Receipt(NamedTuple):
    """The record of one committed debit, as returned by ``Accountant.last_receipt``.

    Attributes:
        seq: the ledger record's sequence number.
        hash: the record's chain hash (keep it to detect later truncation).
        dataset, analyst, label: as given to ``release`` (``dataset`` a tuple for a join).
        mechanism: the mechanism's name.
        cost: the declared (ε, δ) cost that was debited.
        rule, state: the first account's composition rule and its state right after the debit
            (the dataset's limit, or a pipeline's own account inside a pipeline).
    """

    seq: int
    hash: str
    dataset: Any
    analyst: str | None
    label: str | None
    mechanism: str
    cost: Budget
    rule: CompositionRule
    state: State

    @property
    def spent(self) -> Budget:
        """The first account's spend right after this debit (under its composition rule)."""
        return self.rule.spent(self.state)

    @property
    def remaining(self) -> Budget:
        """What was left of the first account's limit right after this debit."""
        return self.rule.remaining(self.state)

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "dataset": self.dataset,
                "analyst": self.analyst, "label": self.label, "mechanism": self.mechanism,
                "cost": self.cost.model_dump(), "spent": self.spent.model_dump(),
                "remaining": self.remaining.model_dump()}
