"""Per-dataset budget reports read from a ledger's stored state (what ``dpbudget status`` prints).

Reads only the accounts' running state, never the records, so it costs O(number of limits)
however long the ledger is. (``dpbudget audit`` is the check that recomputes from the records.)
"""

from __future__ import annotations

from typing import Any

from accountant.composition import rule_from_config
from accountant.ledger import Ledger

__all__ = ["budget_rows", "budget_table"]


def budget_rows(ledger: Ledger) -> list[dict[str, Any]]:
    """One row per limit in the ledger: key, rule, limit, spent, remaining, last record."""
    rows = []
    for account in ledger.accounts():
        rule = rule_from_config(account.config)
        spent = rule.spent(account.state)
        remaining = rule.remaining(account.state)
        exhausted = rule.limit is not None and remaining.epsilon <= 0.0
        rows.append({
            "account": account.key, "rule": account.rule,
            "limit": None if rule.limit is None else rule.limit.model_dump(),
            "spent": spent.model_dump(), "remaining": remaining.model_dump(),
            "exhausted": exhausted, "last_seq": account.seq,
        })
    return rows


def budget_table(ledger: Ledger) -> str:
    """A fixed-width text table of ``budget_rows``."""
    head = ("account", "rule", "limit ε", "limit δ", "spent ε", "spent δ", "remaining ε",
            "remaining δ")
    lines = [head]
    for r in budget_rows(ledger):
        lim = r["limit"]
        lines.append((r["account"], r["rule"],
                      "none" if lim is None else f"{lim['epsilon']:.6g}",
                      "none" if lim is None else f"{lim['delta']:.3g}",
                      f"{r['spent']['epsilon']:.6g}", f"{r['spent']['delta']:.3g}",
                      "∞" if lim is None else f"{r['remaining']['epsilon']:.6g}",
                      "∞" if lim is None else f"{r['remaining']['delta']:.3g}"))
    if len(lines) == 1:
        return "  (no releases recorded)"
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in lines)
