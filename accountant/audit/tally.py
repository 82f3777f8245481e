"""The audit's per-group tallies: releases and declared cost by analyst, mechanism, label,
pipeline, dataset and noise kind (``AuditReport.by_*``), and the record that first charged each
dataset (``AuditReport.datasets_first``: a misspelt name under a default limit shows there as a
dataset of its own).

Invariant: a record charged only to pipelines' accounts was paid for by an allocation already
tallied, so its cost goes in the "inside" columns, never in the totals: no total counts the same
budget twice.
"""

from __future__ import annotations

from typing import Any

from dpbudget.accountant.audit.findings import AuditReport, Tally
from dpbudget.accountant.values.charge import Charge

__all__ = ["Tallies"]

GROUPS = ("analyst", "mechanism", "label", "pipeline", "dataset", "noise")


class Tallies:
    """Plain lists while replaying (a million records); ``Tally`` models are built at the end."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[Any, list[Any]]] = {g: {} for g in GROUPS}
        self.first: dict[str, tuple[int, str | None]] = {}

    def add(self, record: dict[str, Any], charge: Charge, counted: bool = True) -> None:
        """Tally a charged record (``counted``: within the audit's ``since``; the first record
        of each dataset is noted either way)."""
        for name in record.get("datasets") or [record.get("dataset")]:
            if isinstance(name, str) and name not in self.first:
                self.first[name] = (record["seq"], record.get("time"))
        if not counted:
            return
        inside = 3 if all(k.startswith("pipeline:") for k in record["accounts"]) else 0
        t = self.rows
        names = [("analyst", record.get("analyst")),
                 ("mechanism", (record.get("mechanism") or {}).get("name")),
                 ("label", record.get("label")), ("pipeline", record.get("pipeline")),
                 ("noise", record.get("noise") or ("unrecorded" if record.get("mechanism")
                                                   else None))]
        names += [("dataset", d) for d in record.get("datasets") or [record.get("dataset")]]
        for group, name in names:
            if name is not None:
                row = t[group].get(name)
                if row is None:
                    row = t[group][name] = [0, 0.0, 0.0, 0, 0.0, 0.0]
                row[inside] += 1
                row[inside + 1] += charge.epsilon
                row[inside + 2] += charge.delta

    def into(self, out: AuditReport) -> None:
        """Set the report's ``by_*`` tallies and ``datasets_first``."""
        out.datasets_first = dict(self.first)
        for group, rows in self.rows.items():
            setattr(out, f"by_{group}", {str(name): Tally(
                releases=n, epsilon=e, delta=d, inside_releases=n2, inside_epsilon=e2,
                inside_delta=d2) for name, (n, e, d, n2, e2, d2) in rows.items()})
