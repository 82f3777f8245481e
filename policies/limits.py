"""``DatasetLimit``: the limit one dataset is held to, and how its releases compose."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from accountant.budget import Budget
from accountant.composition import RULES, CompositionRule, make_rule
from accountant.errors import from_validation_error

__all__ = ["DatasetLimit"]


class DatasetLimit(BaseModel):
    """A dataset's privacy limit, its composition rule, and an optional per-query cap.

    Each dataset is its own population, so each has its own limit; the rule is fixed when the limit
    is created and cannot change once releases are recorded against it.

    Args:
        limit: the total budget; ``None`` means no limit (spend is still recorded).
        composition: the name of a composition rule (``"basic"``, ...).
        per_query: the most any single release may cost.

    >>> DatasetLimit(limit=Budget(1.0, 1e-6)).composition
    'basic'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    limit: Budget | None = None
    composition: str = "basic"
    per_query: Budget | None = None

    @field_validator("composition")
    @classmethod
    def _known_rule(cls, name: str) -> str:
        if name not in RULES:
            raise ValueError(f"'composition' must be one of {sorted(RULES)}; got {name!r}")
        return name

    def rule(self) -> CompositionRule:
        """A fresh rule object enforcing this limit."""
        return make_rule(self.composition, self.limit, self.per_query)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise from_validation_error(exc) from None
