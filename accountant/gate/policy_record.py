"""Policy records: the limits in force, written into the ledger's hash chain.

A ledger's stored policy is the ``policy`` member of its latest record of kind ``"policy"``; the
ledger row ``policy`` (``dpbudget.policies.stored.POLICY_KEY``) points at that record, so reading it is
O(1), and the record's own hash is re-checked when it is read (a hand-edited limit is refused,
not enforced). ``enforce`` runs when an accountant opens a ledger: the first opener writes the
policy record, every later one must bring the same limits or none (``Accountant.open``).
``apply`` is the one explicit way to change them, and only with the ledger owner's key: a policy
record is enforced only if it is the ledger's first, or is signed in its place by the owner key
the first record pins (``dpbudget.accountant.gate.owner_key``); a ledger that pins none keeps its first policy.

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

from dpbudget.accountant.values import _validate
from dpbudget.accountant.gate import owner_key
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    LedgerConflictError,
    LedgerCorruptedError,
    LedgerError,
    OwnerKeyError,
)
from dpbudget.accountant.gate.continuity import check_ledger
from dpbudget.accountant.ledger import Account, Entry, Ledger, open_ledger, record_hash
from dpbudget.accountant.ledger.base import Transaction
from dpbudget.accountant.ledger.record import ZERO_COST, RecordKind, canonical
from dpbudget.accountant.gate.owner_key import OwnerKey
from dpbudget.accountant.gate.planner import Planner
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy
from dpbudget.policies.stored import POLICY_KEY, differences, document, from_document, raised

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
            adopting: Callable[[], None] = lambda: None, owner: OwnerKey | None = None,
            simulation: bool = False) -> int:
    """Write ``doc`` as the ledger's first policy record, or check it equals the stored one;
    return the seq of the policy record in force. ``adopting`` runs (inside the transaction)
    before a ledger that has records but no policy record adopts ``doc``: it refuses limits
    above the ones its accounts were recorded under. ``owner``: the key a new ledger pins (and
    signs its first record with); an existing ledger must pin that same key.

    ``simulation``: a new ledger's first record says it was created for simulation
    (``Ledger.simulation``); an existing ledger must be one already — it cannot become one.

    Raises:
        LedgerConflictError: the ledger stores other limits; the message names each difference.
        OwnerKeyError: ``owner`` given for a ledger that pins another key or none.
        InvalidArgumentError: ``simulation`` on a ledger not created for simulation; nothing was
            written.
    """
    _check_document(doc)
    # The common case (opening a ledger with its own policy) reads without a lock: a change made
    # just after is seen by every debit, which checks the pointer in its own transaction.
    pointer = ledger.account(POLICY_KEY)
    stored = _read(pointer, ledger)
    if pointer is not None and stored is not None and not differences(stored, doc):
        _same_owner(ledger, owner)
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
        if not tx.empty:
            _same_owner(ledger, owner)  # (a key cannot be pinned after the first record)
        if stored is None:
            if not tx.empty:
                _no_policy_record(ledger)  # O(records), but only on a ledger without a pointer
                adopting()
            seq = _append(tx, ledger, doc, by, "created" if tx.empty else
                          "adopted: the first policy recorded in this ledger", owner,
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
                    "change the policy with Accountant.apply_policy / `dpbudget policy apply` "
                    "and the owner key; nothing was written")
        scope.commit()
    except BaseException:
        scope.abandon()
        raise
    return seq


def apply(ledger: Ledger, doc: Any, *, by: str, reason: str, owner: OwnerKey | None,
          check: Callable[[], None] = lambda: None) -> PolicyChange:
    """Append a policy record replacing the stored policy with ``doc`` (an explicit, audited act),
    signed with ``owner``, the key the ledger's first record pins. ``check`` runs inside the
    transaction, before the append: that the recorded accounts can continue under the new
    rules, checked where no release can slip in between.

    Raises:
        InvalidArgumentError: an empty ``by`` or ``reason``.
        OwnerKeyError: no ``owner``, another key than the pinned one, or a ledger that pins none
            (its policy cannot change); nothing was written.
    """
    _validate.text("by", by)
    _validate.text("reason", reason)
    _check_document(doc)
    if owner is None:
        raise OwnerKeyError("owner_key: a policy change needs the ledger owner's private key "
                            "(owner_key=, or `dpbudget policy apply --owner-key FILE`); nothing "
                            "was written")
    scope = ledger.transaction()
    try:
        tx = scope.begin((POLICY_KEY,))  # (in a ledger of lanes: every debit waits for it)
        _same_owner(ledger, owner)
        check()
        stored = _read(tx.account(POLICY_KEY), ledger)
        if stored is None:  # its first record is a policy record: the pointer was deleted
            _no_policy_record(ledger)
        changes, grants = differences(stored, doc), raised(stored, doc)
        seq = _append(tx, ledger, doc, by, reason, owner)
        scope.commit()
    except BaseException:
        scope.abandon()
        raise
    return PolicyChange(seq, changes, grants)


def replace(ledger: Ledger, policy: Policy, *, by: str, reason: str,
            owner: OwnerKey | None) -> PolicyChange:
    """``apply`` for a ``Policy``, checking inside the transaction that every recorded account
    can continue under the new policy's rules and windows (``Accountant.apply_policy`` and
    ``dpbudget policy apply``), signed with ``owner``.

    Raises:
        LedgerConflictError: an account cannot continue under the new rules; nothing written.
    """
    planner = Planner(policy, None)
    return apply(ledger, document(policy, None), by=by, reason=reason, owner=owner,
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


def _append(tx: Transaction, ledger: Ledger, doc: Any, by: str, reason: str,
            owner: OwnerKey | None, *, simulation: bool = False) -> int:
    fields = {"kind": RecordKind.POLICY.text, "policy": canonical(doc), "by": canonical(by),
              "reason": canonical(reason), "cost": ZERO_COST,
              "accounts": canonical({POLICY_KEY: {"rule": "policy", "state": {}}})}
    if simulation:  # only ever in a ledger's first record (accountant.ledger.record)
        fields["simulation"] = canonical(True)
    seq = tx.next_seq
    if owner is not None:  # signed in its place: this seq, this ledger (its first record's hash)
        if seq == 1:
            fields["owner"] = canonical(owner.public)
        signed = {"by": by, "reason": reason, "policy": json.loads(fields["policy"])}
        fields["sig"] = canonical(owner.sign(owner_key.signed_text(
            signed, seq, owner.public, None if seq == 1 else _first(ledger)[1])))
    entry = tx.append(fields, [Account(POLICY_KEY, "policy", {}, {}, 0)])
    assert entry.seq == seq  # (the transaction holds the lock it writes under)
    return entry.seq


def _same_owner(ledger: Ledger, owner: OwnerKey | None) -> None:
    """Refuse ``owner`` for a ledger that pins another key, or none."""
    if owner is None:
        return
    pin = owner_key.pinned(_first(ledger)[0])
    if pin is None:
        raise OwnerKeyError("this ledger pins no owner key (it was created without one): its "
                            "policy cannot change, and no key can be added later; nothing was "
                            "written. Create a ledger with owner_key= to be able to change its "
                            "policy")
    if pin != owner.public:
        raise OwnerKeyError("owner_key: not the key this ledger's first record pins; nothing "
                            "was written")


def _first(ledger: Ledger) -> tuple[dict[str, Any] | None, str | None]:
    """The ledger's first record, hash-checked, and its hash (the ledger's identity); ``(None,
    None)`` for an empty ledger."""
    entry = ledger.entry(1)
    if entry is None:
        return None, None
    try:
        return _verified(entry, ledger), entry.hash
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerCorruptedError(f"the ledger's first record cannot be trusted ({exc}); "
                                   "nothing was written; run `dpbudget audit` on it") from None


def _verified(entry: Entry, ledger: Ledger) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(entry.text)
    keyed = record.get("auth") == "hmac-sha256"
    if ledger._key is not None and not keyed:
        raise ValueError("its record is not HMAC-keyed although the ledger is")
    if record_hash(entry.text, ledger._key if keyed else None) != entry.hash:
        raise ValueError("its record does not match its hash")
    return record


def _not_the_owners(ledger: Ledger, record: dict[str, Any], seq: int) -> str | None:
    """Why policy record ``seq`` is not one to enforce, or None: it must verify under the key the
    first record pins, in its place; in a ledger that pins none, be its first policy record."""
    first, identity = (record, None) if seq == 1 else _first(ledger)
    pin = owner_key.pinned(first)
    if pin is not None:
        return owner_key.verify(record, seq, pin, identity)
    if seq == 1:
        return None
    # A ledger from before stored policies adopted one at some later record: none may precede
    # it (read only when such a ledger is opened; a new ledger's first record is its policy).
    first_policy = (first or {}).get("kind") == "policy" or any(
        '"kind":"policy"' in e.text for e in _before(ledger, seq))
    return (f"policy record {seq} changes the policy of a ledger that pins no owner key (its "
            "first policy is its policy for good)") if first_policy else None


def _before(ledger: Ledger, seq: int) -> Any:
    for entry in ledger.entries():
        if entry.seq >= seq:
            return
        yield entry
def _check_simulation(ledger: Ledger) -> None:
    if not ledger.simulation:
        raise InvalidArgumentError(
            "simulation", True, "False for a ledger not created for simulation (its first "
            "record says whether it was; a ledger becomes one only when created with "
            "simulation=True)", "Nothing was written")




def _read(row: Account | None, ledger: Ledger) -> Any:
    if row is None:
        return None
    entry = ledger.entry(row.seq)
    try:
        if entry is None:
            raise ValueError("the record it points at is missing")
        record = _verified(entry, ledger)
        if record.get("kind") != "policy":
            raise ValueError("it points at a record that is not a policy record")
        why = _not_the_owners(ledger, record, row.seq)
        if why is not None:
            raise ValueError(why)
        return record["policy"]
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerCorruptedError(f"the ledger's stored policy cannot be trusted ({exc}); "
                                   "nothing was written; run `dpbudget audit` on it") from None
