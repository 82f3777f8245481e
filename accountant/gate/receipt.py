"""``Receipt``: what the caller learns about a debit that has committed.

Invariant: a receipt is read-only and shares nothing with the gate: it holds a copy of the state
right after the debit, and reads spend through the rule without exposing it (a caller holding a
receipt cannot reach, let alone change, the running state or the limit the gate enforces).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.composition import CompositionRule
from dpbudget.policies.units import per_unit

__all__ = ["Receipt"]

_FIELDS = ("seq", "hash", "dataset", "analyst", "label", "mechanism", "cost")


class Receipt:
    """The record of one committed debit, as returned by ``Accountant.last_receipt``.

    Attributes:
        seq: the ledger record's sequence number.
        hash: the record's chain hash (keep it to detect later truncation).
        dataset, analyst, label: as given to ``release`` (``dataset`` a tuple for a join).
        mechanism: the mechanism's name.
        cost: the declared (ε, δ) cost that was debited.
        spent, remaining: the first account's spend and what was left of its limit right after
            this debit (the dataset's limit, or a pipeline's own account inside a pipeline).
        unit: the privacy unit its cost is per (a table query's, ``release_bounded``); None: per
            row (a raw value). ``per`` says it: ``"per person_id"`` or ``"per row"``.
    """

    __slots__ = (*_FIELDS, "_rule", "_state", "unit")

    seq: int
    hash: str
    dataset: Any
    analyst: str | None
    label: str | None
    mechanism: str
    cost: Budget
    _rule: CompositionRule
    _state: dict[str, float]
    unit: str | None

    def __init__(self, seq: int, hash: str, dataset: Any, analyst: str | None,
                 label: str | None, mechanism: str, cost: Budget, rule: CompositionRule,
                 state: Mapping[str, float], unit: str | None = None) -> None:
        init = object.__setattr__
        init(self, "seq", seq)
        init(self, "hash", hash)
        init(self, "dataset", dataset)
        init(self, "analyst", analyst)
        init(self, "label", label)
        init(self, "mechanism", mechanism)
        init(self, "cost", cost)
        init(self, "_rule", rule)
        init(self, "_state", dict(state))  # a copy: the gate's state is never shared
        init(self, "unit", unit)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("a Receipt is read-only")

    @property
    def spent(self) -> Budget:
        """The first account's spend right after this debit (under its composition rule)."""
        return self._rule.spent(dict(self._state))

    @property
    def remaining(self) -> Budget:
        """What was left of the first account's limit right after this debit."""
        return self._rule.remaining(dict(self._state))

    @property
    def per(self) -> str:
        """What its cost is per: ``"per person_id"`` (its unit), or ``"per row"``."""
        return per_unit(self.unit)

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "dataset": self.dataset,
                "analyst": self.analyst, "label": self.label, "mechanism": self.mechanism,
                "cost": self.cost.model_dump(), "per": self.per, "spent": self.spent.model_dump(),
                "remaining": self.remaining.model_dump()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Receipt):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    def __hash__(self) -> int:
        return hash((self.seq, self.hash))

    def _repr_html_(self) -> str:
        from dpbudget.accountant.values._html import table

        return table(("record", "dataset", "mechanism", f"cost ε {self.per}", "cost δ", "spent ε",
                      "remaining ε", "hash"),
                     [(self.seq, self.dataset, self.mechanism, self.cost.epsilon,
                       self.cost.delta, self.spent.epsilon, self.remaining.epsilon,
                       self.hash[:16] + "…")], caption="receipt")

    def __repr__(self) -> str:
        return (f"Receipt(seq={self.seq}, hash={self.hash[:12]}..., dataset={self.dataset!r}, "
                f"mechanism={self.mechanism!r}, cost={self.cost!r}, per={self.per!r})")
