"""Declarative privacy limits: per dataset (and, as the policy file grows, per analyst and query)."""

# `accountant` must finish initialising first: its Accountant imports this package back.
import accountant  # noqa: F401  (isort: skip)
from policies.limits import DatasetLimit

__all__ = ["DatasetLimit"]
