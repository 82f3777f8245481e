"""Declarative privacy limits: per dataset, per analyst, per query, global; loaded from a policy
file (TOML or JSON) and enforced by ``Accountant.from_policy``."""

from dpbudget.policies.accounts import AccountSpec, policy_accounts
from dpbudget.policies.limits import AnalystLimit, Cap, DatasetLimit
from dpbudget.policies.periods import Period
from dpbudget.policies.policy import Policy, load_policy, parse_policy, policy_schema
from dpbudget.policies.units import ContributionBounds

__all__ = [
    "AccountSpec", "AnalystLimit", "Cap", "ContributionBounds", "DatasetLimit", "Period", "Policy", "load_policy",
    "parse_policy", "policy_accounts", "policy_schema",
]
