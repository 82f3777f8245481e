"""Composition rules: how the costs of successive releases add up against a limit.

Each rule is one class with O(1) state; ``RULES`` maps the names users select
(``Accountant(..., composition="basic")``) to them. ``docs/theory.md`` §2 says when each is valid.
"""

from __future__ import annotations

from typing import Any

from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition.advanced import AdvancedComposition
from dpbudget.accountant.composition.base import CompositionRule, Refused, State
from dpbudget.accountant.composition.basic import BasicComposition
from dpbudget.accountant.composition.batch import batch_charge
from dpbudget.accountant.composition.gaussian import GaussianComposition
from dpbudget.accountant.composition.optimal import OptimalComposition
from dpbudget.accountant.composition.pld import PLDComposition
from dpbudget.accountant.composition.renyi import RenyiComposition, plan_order
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    LedgerCorruptedError,
    PrivacyError,
)

__all__ = [
    "RULES", "AdvancedComposition", "BasicComposition", "Charge", "CompositionRule",
    "GaussianComposition", "OptimalComposition", "PLDComposition", "Refused", "RenyiComposition", "State",
    "batch_charge", "make_rule", "plan_order", "rule_from_config",
]

RULES: dict[str, type[CompositionRule]] = {
    rule.name: rule
    for rule in (BasicComposition, AdvancedComposition, OptimalComposition, GaussianComposition,
                 RenyiComposition, PLDComposition)
}


def rule_from_config(config: dict[str, Any]) -> CompositionRule:
    """Rebuild a rule from the configuration a ledger stored with it.

    Raises:
        LedgerCorruptedError: the configuration names no known rule or is malformed.
    """
    try:
        return RULES[config["rule"]].from_config(config)
    except (KeyError, TypeError, PrivacyError) as exc:
        raise LedgerCorruptedError(f"unreadable rule configuration {config!r}: {exc}") from None


def make_rule(name: str, limit: Budget | None, per_query: Budget | None = None, *,
              conversion_share: float | None = None,
              order: float | None = None, step: Any = None) -> CompositionRule:
    """The rule called ``name`` enforcing ``limit``.

    ``conversion_share`` is the ``"advanced"`` rule's split of δ (see ``AdvancedComposition``),
    ``order`` the ``"renyi"`` rule's one order (see ``RenyiComposition``); None keeps the
    default. ``step`` is the ``"pld"`` rule's fixed step (q, z) (see ``PLDComposition``).

    Raises:
        InvalidArgumentError: an unknown rule name, or a parameter given to another rule.
    """
    if not isinstance(name, str):
        raise InvalidTypeError("composition", name, "a rule name (a string)")
    for argument, value in (("limit", limit), ("per_query", per_query)):
        if value is not None and not isinstance(value, Budget):
            raise InvalidTypeError(argument, value, "a Budget or None")
    try:
        cls = RULES[name]
    except KeyError:
        raise InvalidArgumentError("composition", name, f"one of {sorted(RULES)}") from None
    if cls is PLDComposition or step is not None:
        if cls is not PLDComposition:
            raise InvalidArgumentError("step", step, "set only with the 'pld' rule")
        if order is not None:
            raise InvalidArgumentError("order", order, "not set with the 'pld' rule")
        if conversion_share is not None:
            raise InvalidArgumentError("conversion_share", conversion_share,
                                       "not set with the 'pld' rule")
        return PLDComposition(limit, per_query, step=step)
    if order is not None:
        if cls is not RenyiComposition:
            raise InvalidArgumentError("order", order, "set only with the 'renyi' rule")
        if conversion_share is not None:
            raise InvalidArgumentError("conversion_share", conversion_share,
                                       "set only with the 'advanced' rule")
        return RenyiComposition(limit, per_query, order=order)
    if conversion_share is None:
        return cls(limit, per_query)
    if cls is not AdvancedComposition:
        raise InvalidArgumentError("conversion_share", conversion_share,
                                   "set only with the 'advanced' rule")
    return AdvancedComposition(limit, per_query, conversion_share=conversion_share)
