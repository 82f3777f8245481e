"""The policy in force during an audit's replay: the latest policy record before each record.

The audit holds every release to that policy as the gate would have: its dataset and analyst must
be admitted (declared, or under the default limit; not denied), its mechanism allowed and its cost
within the per-query caps, and every account's replayed spend within the limit in force — whatever
limits the record itself carries. A writer that kept an older policy (or wrote records by hand)
shows up here, record by record.
"""

from __future__ import annotations

from typing import Any

from accountant._numeric import within_budget
from accountant.budget import Budget
from accountant.composition import CompositionRule
from accountant.errors import PrivacyError
from accountant.planner import Planner
from policies.accounts import PolicyLimits
from policies.stored import from_document

__all__ = ["InForce"]


class InForce:
    """The policy stated by policy record ``seq`` (``document``: its ``policy`` member)."""

    def __init__(self, seq: int, document: Any) -> None:
        policy, default = from_document(document)
        self.seq = seq
        self.limits = PolicyLimits(policy, default)
        self.planner = Planner(policy, default)

    def refuses(self, record: dict[str, Any]) -> str | None:
        """Why the policy in force would have refused this record's request, or None (the
        gate checks releases inside a pipeline against their dataset's policy too)."""
        datasets = record.get("datasets") or record.get("dataset")
        blocks = record.get("blocks")
        try:
            if "pipeline" in record and record.get("kind") != "pipeline":
                # Inside a pipeline: charged to the pipeline only (its opening record paid the
                # blocks), so only the datasets' checks apply.
                plan = self.planner.inside_plan(datasets, record.get("analyst"))
            else:
                plan = self.planner.plan(datasets, record.get("analyst"),
                                         None if blocks is None else tuple(blocks))
        except (PrivacyError, TypeError) as refusal:
            return str(refusal)
        charged = record.get("accounts") or {}
        if blocks is not None:
            missing = [t.key for t in plan.targets if "/block:" in t.key and t.key not in charged]
            if missing:
                return f"it names blocks it does not charge: {missing[:3]}"
        mechanism = record.get("mechanism") or {}
        name = mechanism.get("name")
        if name is None:  # a pipeline's allocation: admitted by planning alone
            return None
        # A batch is checked item by item, as the gate does (records from before items stated
        # their own cost are checked by name only).
        items = (mechanism.get("params") or {}).get("items") or [] if name == "batch" else \
            [{"name": name, "cost": record.get("cost")}]
        for dataset, limit in plan.checks:
            allowed = limit.allowed_mechanisms
            names = [item.get("name") for item in items]
            if allowed is not None and any(n not in allowed for n in names):
                return (f"datasets.{dataset}.allowed_mechanisms does not admit "
                        f"{[n for n in names if n not in allowed]}")
            cap = limit.max_per_query
            if cap is None:
                continue
            for item in items:
                cost = item.get("cost")
                if isinstance(cost, dict) and not cap.admits(
                        Budget(float(cost.get("epsilon", 0.0)), float(cost.get("delta", 0.0)))):
                    return f"a cost is above datasets.{dataset}.max_per_query {cap}"
        return None

    def over(self, key: str, rule: CompositionRule, state: dict[str, float]) -> str | None:
        """How the replayed spend of account ``key`` exceeds its limit in force, or None."""
        declared = self.limits.limit_for(key)
        if declared is None or declared.is_unlimited:
            return None
        spent = rule.spent(state)
        if within_budget(spent, declared):
            return None
        return f"{key} has spent {spent}, over the limit in force {declared}"
