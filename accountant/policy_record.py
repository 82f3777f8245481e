"""Policy records: the limits in force, written into the ledger's hash chain.

A ledger's stored policy is the ``policy`` member of its latest record of kind ``"policy"``; the
ledger row ``policy`` (``policies.stored.POLICY_KEY``) points at that record, so reading it is
O(1), and the record's own hash is re-checked when it is read (a hand-edited limit is refused,
not enforced). ``enforce`` runs when an accountant opens a ledger: the first opener writes the
policy record, every later one must bring the same limits or none (``Accountant.open``).
``apply`` is the one explicit way to change them.

Invariant: the read, the comparison and the append happen in one ledger transaction, so two
processes creating the same ledger at once write one policy record, and a process with other
limits is refused whichever comes first.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from accountant import _validate
from accountant.errors import (
    InvalidArgumentError,
    LedgerConflictError,
    LedgerCorruptedError,
    LedgerError,
)
from accountant.continuity import check_ledger
from accountant.ledger import Account, Ledger, open_ledger, record_hash
from accountant.ledger.base import Transaction
from accountant.ledger.record import ZERO_COST, canonical
from accountant.planner import Planner
from policies.limits import DatasetLimit
from policies.policy import Policy
from policies.stored import POLICY_KEY, differences, document, from_document, raised

__all__ = ["PolicyChange", "actor", "apply", "enforce", "replace", "stored_document",
           "stored_policy"]


class PolicyChange(NamedTuple):
    """What ``apply`` wrote: the record's ``seq``, each difference from the policy it replaces,
    and those that grant more than before (``raised``: non-empty means a weaker guarantee)."""

    seq: int
    changes: list[str]
    raised: list[str]


def actor() -> str:
    """Who is acting, for a policy record: ``DPBUDGET_ACTOR`` if set, else the OS user."""
    name = os.environ.get("DPBUDGET_ACTOR")
    if name:
        return name
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container): still record something
        return "unknown"


def stored_document(ledger: Ledger) -> Any:
    """The policy document in force in ``ledger``, or None if it has none.

    Raises:
        LedgerCorruptedError: the pointer row or the record it names was edited.
    """
    return _read(ledger.account(POLICY_KEY), ledger)


def stored_policy(ledger: Ledger | str) -> tuple[Policy, DatasetLimit | None]:
    """The policy stored in ``ledger`` (a ledger or its URL) and its default dataset limit.

    Raises:
        LedgerError: the ledger cannot be opened, or stores no policy.
        LedgerCorruptedError: the stored policy was edited outside dpbudget.
    """
    if isinstance(ledger, Ledger):
        doc = stored_document(ledger)
    else:
        with open_ledger(ledger, create=False) as reading:  # a mistyped path creates nothing
            doc = stored_document(reading)
    if doc is None:
        raise LedgerError("this ledger stores no policy: open it once with its limits "
                          "(Accountant(...) or Accountant.from_policy), which records them")
    return from_document(doc)


def enforce(ledger: Ledger, doc: Any, *, by: str,
            adopting: Callable[[], None] = lambda: None, simulation: bool = False) -> int:
    """Write ``doc`` as the ledger's first policy record, or check it equals the stored one;
    return the seq of the policy record in force. ``adopting`` runs (inside the transaction)
    before a ledger that has records but no policy record adopts ``doc``: it refuses limits
    above the ones its accounts were recorded under.

    ``simulation``: a new ledger's first record says it was created for simulation
    (``Ledger.simulation``); an existing ledger must be one already — it cannot become one.

    Raises:
        LedgerConflictError: the ledger stores other limits; the message names each difference.
        InvalidArgumentError: ``simulation`` on a ledger not created for simulation; nothing was
            written.
    """
    _check_document(doc)
    # The common case (opening a ledger with its own policy) reads without a lock: a change made
    # just after is seen by every debit, which checks the pointer in its own transaction.
    pointer = ledger.account(POLICY_KEY)
    stored = _read(pointer, ledger)
    if pointer is not None and stored is not None and not differences(stored, doc):
        if simulation:  # (a ledger with a record: its first record is settled)
            _check_simulation(ledger)
        return pointer.seq
    scope = ledger.transaction()
    try:
        tx = scope.begin((POLICY_KEY,))
        if simulation and not tx.empty:
            _check_simulation(ledger)
        pointer = tx.account(POLICY_KEY)
        stored = _read(pointer, ledger)
        if stored is None:
            if not tx.empty:
                _no_policy_record(ledger)  # O(records), but only on a ledger without a pointer
                adopting()
            seq = _append(tx, doc, by, "created" if tx.empty else
                          "adopted: the first policy recorded in this ledger",
                          simulation=simulation and tx.empty)
        else:
            assert pointer is not None  # a stored policy was read through it
            seq = pointer.seq
            diffs = differences(stored, doc)
            if diffs:
                raise LedgerConflictError(
                    "this ledger stores other limits than the ones given: "
                    + "; ".join(diffs[:20]) + ("; ..." if len(diffs) > 20 else "")
                    + ". Open it with Accountant.open(ledger) to use the stored policy, or "
                    "change the policy with Accountant.apply_policy / `dpbudget policy apply`; "
                    "nothing was written")
        scope.commit()
    except BaseException:
        scope.abandon()
        raise
    return seq


def apply(ledger: Ledger, doc: Any, *, by: str, reason: str,
          check: Callable[[], None] = lambda: None) -> PolicyChange:
    """Append a policy record replacing the stored policy with ``doc`` (an explicit, audited act).
    ``check`` runs inside the transaction, before the append: that the recorded accounts can
    continue under the new rules, checked where no release can slip in between.

    Raises:
        InvalidArgumentError: an empty ``by`` or ``reason``.
    """
    _validate.text("by", by)
    _validate.text("reason", reason)
    _check_document(doc)
    scope = ledger.transaction()
    try:
        tx = scope.begin((POLICY_KEY,))  # (in a ledger of lanes: every debit waits for it)
        check()
        stored = _read(tx.account(POLICY_KEY), ledger)
        changes = ["(no stored policy)"] if stored is None else differences(stored, doc)
        grants = [] if stored is None else raised(stored, doc)
        seq = _append(tx, doc, by, reason)
        scope.commit()
    except BaseException:
        scope.abandon()
        raise
    return PolicyChange(seq, changes, grants)


def replace(ledger: Ledger, policy: Policy, *, by: str, reason: str) -> PolicyChange:
    """``apply`` for a ``Policy``, checking inside the transaction that every recorded account
    can continue under the new policy's rules and windows (``Accountant.apply_policy`` and
    ``dpbudget policy apply``; also the explicit way to record a first policy in a ledger from
    before stored policies, limits above its recorded ones included).

    Raises:
        LedgerConflictError: an account cannot continue under the new rules; nothing written.
    """
    planner = Planner(policy, None)
    return apply(ledger, document(policy, None), by=by, reason=reason,
                 check=lambda: check_ledger(ledger, planner))


def _check_document(doc: Any) -> None:
    """What is written must read back: a policy built without validation (``model_construct``)
    would otherwise be stored, and then refuse every later opening as corrupted."""
    try:
        policy, default = from_document(json.loads(canonical(doc)))
        same = document(policy, default) == doc
    except (LedgerCorruptedError, ValueError, TypeError):
        same = False
    if not same:
        raise InvalidArgumentError("policy", "<Policy>", "a validated policy (a policy file, or "
                                   "Policy.model_validate), which reads back as written",
                                   "nothing was written")


def _no_policy_record(ledger: Ledger) -> None:
    """Refuse a ledger that holds a policy record but no pointer to it: the pointer row was
    deleted, and adopting the opener's limits would replace the stored ones silently."""
    for entry in ledger.entries():
        if '"kind":"policy"' in entry.text:
            raise LedgerCorruptedError(
                f"record {entry.seq} is a policy record but the ledger's pointer to its policy is "
                "missing (deleted outside dpbudget); nothing was written; run `dpbudget audit`")


def _check_simulation(ledger: Ledger) -> None:
    if not ledger.simulation:
        raise InvalidArgumentError(
            "simulation", True, "False for a ledger not created for simulation (its first "
            "record says whether it was; a ledger becomes one only when created with "
            "simulation=True)", "Nothing was written")


def _append(tx: Transaction, doc: Any, by: str, reason: str, *, simulation: bool = False) -> int:
    fields = {"kind": '"policy"', "policy": canonical(doc), "by": canonical(by),
              "reason": canonical(reason), "cost": ZERO_COST,
              "accounts": canonical({POLICY_KEY: {"rule": "policy", "state": {}}})}
    if simulation:  # only ever in a ledger's first record (accountant.ledger.record)
        fields["simulation"] = "true"
    return tx.append(fields, [Account(POLICY_KEY, "policy", {}, {}, 0)]).seq


def _read(row: Account | None, ledger: Ledger) -> Any:
    if row is None:
        return None
    entry = ledger.entry(row.seq)
    try:
        if entry is None:
            raise ValueError("the record it points at is missing")
        record = json.loads(entry.text)
        keyed = record.get("auth") == "hmac-sha256"
        if ledger._key is not None and not keyed:
            raise ValueError("its record is not HMAC-keyed although the ledger is")
        if record_hash(entry.text, ledger._key if keyed else None) != entry.hash:
            raise ValueError("its record does not match its hash")
        if record.get("kind") != "policy":
            raise ValueError("it points at a record that is not a policy record")
        return record["policy"]
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerCorruptedError(f"the ledger's stored policy cannot be trusted ({exc}); "
                                   "nothing was written; run `dpbudget audit` on it") from None
