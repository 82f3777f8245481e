"""One step presented to the gate (a release, a batch, a pipeline's allocation) with the record
members that describe it, and one account's step under its composition rule — shared by the gate's
debit and the audit's replay, so that both compute the very same state.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.values import _numeric
from dpbudget.accountant.composition import CompositionRule, Refused, State, batch_charge
from dpbudget.accountant.composition.base import check_charge, clip_delta
from dpbudget.accountant.values.errors import LedgerConflictError
from dpbudget.accountant.ledger import Account
from dpbudget.accountant.ledger.record import canonical, charge_record, step_fragments
from dpbudget.mechanisms.base import Mechanism
from dpbudget.policies.blocks import Unlock

__all__ = ["Step", "check_continues", "check_unlocked", "step_account"]


def check_continues(key: str, rule: CompositionRule, current: Account | None) -> None:
    """Refuse to continue account ``key`` under ``rule`` when it was recorded under another rule
    or another value of a parameter its state depends on (a rule cannot change mid-stream).

    Raises:
        LedgerConflictError: naming the account and the difference.
    """
    # The common case (same rule, no state parameters) is decided without building anything:
    # this runs on every debit.
    if current is not None and (current.rule != rule.name or rule.state_params):
        why = rule.conflict({**current.config, "rule": current.rule})
        if why is not None:
            raise LedgerConflictError(f"{key} cannot continue: {why}")


def check_unlocked(unlock: Unlock, start: float, rule: CompositionRule, state: State,
                   now: float) -> None:
    """Refuse a block's state beyond the share of its ε limit unlocked at ``now`` (the debit's
    time) for a block that began at ``start`` — a usage policy (``dpbudget.policies.blocks.Unlock``; the
    guarantee is the block's whole limit either way), checked by the gate and the audit alike.

    Raises:
        Refused: saying the share unlocked so far.
    """
    share = unlock.share(start, now)
    limit = rule.limit
    if share < 1.0 and limit is not None and not _numeric.within(
            rule.spent(state).epsilon, share * limit.epsilon):
        raise Refused(f"the block has unlocked {share:.0%} of its limit so far "
                      f"({unlock.fraction:.0%} more every {unlock.every})")


def step_account(key: str, rule: CompositionRule, current: Account | None,
                 charge: Charge) -> State:
    """One account's step, shared by the gate and the audit's replay: the account's new state
    after ``charge``.

    Raises:
        LedgerConflictError: the account was recorded under another rule (``check_continues``).
        Refused: the step does not fit what is left of the limit.
        MechanismNotAllowedError: the rule does not admit this kind of step at all.
    """
    check_continues(key, rule, current)
    return rule.debit(rule.initial_state() if current is None else current.state, charge)


class Step(NamedTuple):
    """One step presented to the gate: a release, a batch, or a pipeline's allocation. ``members``
    are the record members that describe it (canonical JSON, by ``dpbudget.accountant.ledger.record``);
    ``noise`` the kind of noise it draws (``"exact"``, ``"float"``; None for an allocation), which
    the gate records with its source."""

    name: str
    cost: Budget
    charge: Charge
    members: dict[str, str]
    noise: str | None = None

    @classmethod
    def of(cls, mechanism: Mechanism) -> "Step":
        """The step of one release of ``mechanism``. Kept per mechanism object (by identity: a
        class's own ``__eq__`` is never consulted) and per (class, parameters, charge), so that
        releasing the same mechanism again, or a fresh equal one, encodes nothing."""
        cached = _BY_ID.get(id(mechanism))
        if cached is not None and cached[0]() is mechanism:
            return cached[1]
        params = mechanism.params()
        charge = mechanism.charge
        check_charge(charge)  # before anything is encoded: a NaN cost is no cost to record
        # The charge is part of the key, so a class whose params() leaves out something its cost
        # depends on can never be charged another mechanism's cost.
        try:
            key: tuple[Any, ...] | None = (type(mechanism), tuple(params.items()), charge)
            step = _BY_VALUE.get(key)  # type: ignore[arg-type]
        except TypeError:  # unhashable parameters (candidate lists)
            key, step = None, None
        if step is None:
            step = cls(mechanism.name, mechanism.cost, charge,
                       step_fragments(mechanism.name, params, charge), mechanism.noise)
            if key is not None:
                if len(_BY_VALUE) > 4096:
                    _BY_VALUE.clear()
                _BY_VALUE[key] = step
        try:
            ref = weakref.ref(mechanism)
        except TypeError:  # a class without weak references: no reuse by object
            return step
        if len(_BY_ID) > 4096:
            _BY_ID.clear()
        _BY_ID[id(mechanism)] = (ref, step)
        return step

    @classmethod
    def batch(cls, mechanisms: tuple[Mechanism, ...]) -> "Step":
        charge = batch_charge(tuple(m.charge for m in mechanisms))
        # Each item's own declared cost too: a per-query cap applies to each item (the gate checks
        # them one by one), and the audit checks them again from the record.
        params = {"items": [{"name": m.name, "params": m.params(),
                             "cost": {"epsilon": m.cost.epsilon, "delta": m.cost.delta}}
                            for m in mechanisms]}
        cost = Budget(charge.epsilon, clip_delta(charge.delta))
        noise = "float" if any(m.noise == "float" for m in mechanisms) else "exact"
        return cls("batch", cost, charge, step_fragments("batch", params, charge), noise)

    @classmethod
    def allocation(cls, budget: Budget, rule: CompositionRule) -> "Step":
        """A pipeline's allocation, charged to its parent as an (ε, δ) step."""
        charge = Charge(budget.epsilon, budget.delta, None, None, "a pipeline's allocation")
        return cls("Pipeline", budget, charge, {
            "cost": canonical(charge_record(charge)),
            "rule": canonical(rule.describe())})


# Steps by mechanism object — id() with a weak reference that must still point at the very same
# object (ids are reused once an object dies) — and by (class, parameters, charge).
_BY_ID: "dict[int, tuple[weakref.ref[Mechanism], Step]]" = {}
_BY_VALUE: dict[tuple[Any, ...], Step] = {}
