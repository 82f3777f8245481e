"""Declarative privacy limits: per dataset (and, as the policy file grows, per analyst and query)."""

from policies.limits import DatasetLimit

__all__ = ["DatasetLimit"]
