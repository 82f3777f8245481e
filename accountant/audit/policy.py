"""The policy in force during an audit's replay: the latest policy record before each record.

The audit holds every release to that policy as the gate would have: its dataset and analyst must
be admitted (declared, or under the default limit; not denied), its mechanism allowed and its cost
within the per-query caps, the accounts it charges exactly those of the gate's plan (its analyst's
quotas, no one else's: a record naming alice that charges bob's quota, or skips her own, is
flagged), and every account's replayed spend within the limit in force — whatever limits the
record itself carries. A writer that kept an older policy (or wrote records by hand)
shows up here, record by record.

Each policy record is listed (``PolicyRecords``: when, who, why, what it grants more than the
one before) and checked to be the owner's (``dpbudget.accountant.gate.owner_key``): signed in its place by the
key the first record pins, or — in a ledger that pins none — the ledger's first policy record.
"""

from __future__ import annotations

from typing import Any

from dpbudget.accountant.gate import owner_key
from dpbudget.accountant.values._numeric import within_budget
from dpbudget.accountant.audit.findings import PolicyRecordReport
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import CompositionRule
from dpbudget.accountant.values.errors import OwnerKeyError, PrivacyError
from dpbudget.accountant.ledger.record import charge_from_record
from dpbudget.accountant.gate.planner import Plan, Planner
from dpbudget.policies.accounts import PolicyLimits, pipeline_key
from dpbudget.policies.limits import refusal
from dpbudget.policies.periods import split_window
from dpbudget.policies.stored import from_document, raised
from dpbudget.policies.units import RAW, bounds_problem, per_account, unit_refusal

__all__ = ["InForce", "PolicyRecords", "charged"]


class InForce:
    """The policy stated by policy record ``seq`` (``document``: its ``policy`` member)."""

    def __init__(self, seq: int, document: Any) -> None:
        policy, default = from_document(document)
        self.seq, self.document = seq, document
        self.limits = PolicyLimits(policy, default)
        self.planner = Planner(policy, default)

    def refuses(self, record: dict[str, Any]) -> str | None:
        """Why the policy in force would have refused this record's request, or None (the
        gate checks releases inside a pipeline against their dataset's policy too). That
        includes charging other accounts than the gate's plan: another analyst's quota, or
        without one's own (``charged``)."""
        datasets = record.get("datasets") or record.get("dataset")
        blocks = record.get("blocks")
        inside = _inside(record)
        try:
            if inside is not None:
                # Inside a pipeline (or a pipeline opened in one): charged to the pipeline only
                # (its opening record paid the blocks), so only the datasets' checks apply.
                plan = self.planner.inside_plan(datasets, record.get("analyst"))
            else:
                plan = self.planner.plan(datasets, record.get("analyst"),
                                         None if blocks is None else tuple(blocks))
        except (PrivacyError, TypeError) as refusal:
            return str(refusal)
        return self._stateless(record, plan) or charged(record.get("accounts") or {},
                                                        plan if inside is None else inside)

    @staticmethod
    def _stateless(record: dict[str, Any], plan: Plan) -> str | None:
        """Why the policy's stateless checks (``dpbudget.policies.limits.refusal``, the gate's own: allowed
        mechanisms, per-query caps) refuse it."""
        mechanism = record.get("mechanism") or {}
        name = mechanism.get("name")
        if name is None or not plan.checks:  # a pipeline's allocation: admitted by planning
            return None
        # A batch is checked item by item, as the gate does (records from before items stated
        # their own cost are checked by name only).
        items = (mechanism.get("params") or {}).get("items") or [] if name == "batch" else \
            [{"name": name, "cost": record.get("cost")}]
        for item in items:
            try:
                cost = _cost(item.get("cost"))
            except (KeyError, TypeError, ValueError, PrivacyError):
                return "its cost is not one the gate could have written (malformed)"
            # (the privacy unit: ``unit_problem``, a release problem)
            refused = refusal(plan.checks, str(item.get("name")), cost)
            if refused is not None:
                return refused.why
        return None

    def unit_problem(self, record: dict[str, Any]) -> str | None:
        """Why a release record breaks the unit rule of the policy in force (the gate's own:
        ``dpbudget.policies.units.unit_refusal``, a record without ``unit`` being a raw value),
        or carries bounds the gate would have refused (``bounds_problem``), or None."""
        if record.get("kind") not in ("release", "session"):
            return None
        unit = record["unit"] if "unit" in record else RAW
        names = record.get("datasets") or [record.get("dataset")]
        names = names if isinstance(names, list) else []
        for name in names:
            try:
                limit = self.planner.limit(name)
            except (PrivacyError, TypeError):  # (an unknown dataset: ``refuses`` reports it)
                continue
            refused = unit_refusal(name, limit, unit, len(names) > 1)
            if refused is not None:
                return refused[0]
        return None if unit is RAW else bounds_problem(record.get("bounds"), unit)

    def per(self, key: str, dataset: Any = None) -> str:
        """What account ``key``'s ε is per under this policy (``per_account``; ``dataset``: a
        pipeline's, named by its records)."""
        return per_account(key, self.planner.policy.datasets, self.planner.default, dataset)

    def over(self, key: str, rule: CompositionRule, state: dict[str, float]) -> str | None:
        """How the replayed spend of account ``key`` exceeds its limit in force, or None."""
        declared = self.limits.limit_for(key)
        if declared is None or declared.is_unlimited:
            return None
        spent = rule.spent(state)
        if within_budget(spent, declared):
            return None
        return f"{key} has spent {spent}, over the limit in force {declared}"


def _cost(cost: Any) -> Charge | None:
    """A recorded cost as the charge the gate checked, or None where the record states none (a
    batch item from before items stated their cost).

    Raises:
        KeyError, TypeError, ValueError, PrivacyError: a cost the gate could not have written.
    """
    if cost is None:
        return None
    if not isinstance(cost, dict):
        raise TypeError("cost")
    return charge_from_record(cost)


def _inside(record: dict[str, Any]) -> str | None:
    """The account a record made in a pipeline is charged to (its pipeline's; for a pipeline
    opened in another, the parent's), or None for a record the planner's plan charges."""
    if record.get("kind") == "pipeline":
        parent = record.get("parent")
        return None if parent is None else pipeline_key(str(parent))
    return None if "pipeline" not in record else pipeline_key(str(record["pipeline"]))


def charged(accounts: dict[str, Any], plan: Plan | str) -> str | None:
    """How the accounts a record charges differ from those its ``plan`` (or one pipeline's
    account) charges, or None. Compared without windows (which window is the time check's,
    ``dpbudget.accountant.audit.times``), but a windowed limit must be charged in some window of its own
    period and a lifetime one without: ``dataset:adult/analyst:alice@2026-11-21+1d`` is the
    ``1d`` windows' account of ``dataset:adult/analyst:alice``. Blocks are those the record
    names (its plan's)."""
    want = {(plan, None)} if isinstance(plan, str) else {
        (t.key, None if t.period is None else t.period.text) for t in plan.targets}
    have = {split_window(key) for key in accounts}
    if have == want:
        return None
    missing = sorted(k + ("" if p is None else f"@…+{p}") for k, p in want - have)
    extra = sorted(k + ("" if p is None else f"@…+{p}") for k, p in have - want)
    return f"it charged other accounts than its plan: missing {missing}, extra {extra}"


class PolicyRecords:
    """The policy records read so far, listed, and the owner key the first record pins."""

    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None  # record 1, once read (a log may lack it)
        self.identity: str | None = None  # its hash: the ledger's identity, signed with each
        self.listed: list[PolicyRecordReport] = []

    def first_record(self, record: dict[str, Any], digest: str | None) -> None:
        self.first, self.identity = record, digest

    @property
    def owner(self) -> str | None:
        return owner_key.pinned(self.first)

    def read(self, record: dict[str, Any], seq: int, before: InForce | None) -> str | None:
        """List policy record ``seq`` (``before``: the policy it replaces); return why it is not
        the owner's, or None (also when record 1 is not in the source: nothing to check with)."""
        self.listed.append(PolicyRecordReport(
            seq=seq, time=record.get("time"), by=str(record.get("by")),
            reason=str(record.get("reason")), signed=isinstance(record.get("sig"), str),
            raised=[] if before is None else raised(before.document, record["policy"])))
        if self.first is None:
            return None
        pin = self.owner
        if pin is None:
            return None if before is None else (
                f"policy record {seq} changes the policy of a ledger that pins no owner key "
                f"(policy record {before.seq} was its policy for good)")
        try:
            return owner_key.verify(record, seq, pin, None if seq == 1 else self.identity)
        except OwnerKeyError as exc:  # cryptography missing: unverified is reported, not passed
            return f"policy record {seq} cannot be verified: {exc}"
