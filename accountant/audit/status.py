"""Per-dataset budget reports read from a ledger's stored state (what ``dpbudget status`` prints).

Reads only the accounts' running state, never the records, so it costs O(number of limits)
however long the ledger is (benchmarks/status_large.py). ``check_states`` first checks each state
against the one record its row names (``Ledger.check_accounts``, also O(number of limits)): a state
edited by hand is refused, not reported. What only the records hold is left to ``dpbudget audit``,
the check that recomputes from every record: the count of releases by noise kind, and a row rewound
to an earlier record of an unkeyed ledger.

With a policy, each account is reported against the limit the policy now gives it, not the one
recorded with its last debit: a policy that lowered a limit below what was spent shows that account
as over its limit (it refuses every release). ``dpbudget status LEDGER`` uses the policy stored in
the ledger (the one in force); ``--policy FILE`` compares against a file instead.
"""

from __future__ import annotations

import json
from typing import Any

from dpbudget.accountant.values import _numeric
from dpbudget.accountant.composition import CompositionRule, rule_from_config
from dpbudget.accountant.ledger import Account, Ledger
from dpbudget.policies.accounts import (
    block_spec,
    block_template_key,
    dataset_key,
    dataset_name,
    dataset_spec,
    policy_accounts,
)
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.periods import split_window
from dpbudget.policies.stored import POLICY_KEY
from dpbudget.policies.units import per_account

__all__ = ["budget_rows", "budget_table", "check_states"]


def check_states(ledger: Ledger) -> str:
    """Check the stored running states that status reports; return what was checked, to print.

    Raises:
        LedgerCorruptedError: a state is not the one the record its row names wrote (edited
            outside dpbudget), or on a keyed ledger opened with its key, the rows disagree with
            the head record's commitment (``dpbudget.accountant.ledger.table_sum``).
    """
    first = ledger.entry(1)
    if not ledger.authenticated and first is not None and _keyed(first.text):
        # Without the key no record of a keyed ledger verifies: the check would call every
        # state edited. Say so rather than report a check that was not made.
        return ("running states NOT checked: the ledger is keyed and no key was given "
                "(DPBUDGET_LEDGER_KEY)")
    ledger.check_accounts()
    return "running states checked against the records that wrote them"


def _keyed(text: str) -> bool:
    try:
        return bool(json.loads(text).get("auth") == "hmac-sha256")
    except (ValueError, AttributeError):
        return False


def budget_rows(ledger: Ledger, policy: Any = None,
                default: DatasetLimit | None = None) -> list[dict[str, Any]]:
    """One row per limit in the ledger: key, rule, limit, spent, remaining, last record, and what
    its ε is ``per`` ("per person_id": the dataset's privacy unit; "per row" where none).

    Args:
        policy: a ``dpbudget.policies.Policy`` to report against (its limits, not the recorded ones):
            each row then also has ``over_limit`` (spent exceeds the policy's limit: every
            release there is refused), ``new_dataset`` (a dataset the policy does not list,
            charged under its default limit: a misspelt name shows as one) and ``note``.
        default: the policy's limit for datasets it does not list (a stored policy's).
    """
    specs: dict[str, Any] = {}
    new: set[str] = set()  # the accounts of datasets the policy does not list (its default's)
    if policy is not None:
        specs = policy_accounts(policy)
        default = default if default is not None else getattr(policy, "other_datasets", None)
        if default is not None:
            for account in ledger.accounts():
                name = dataset_name(account.key)
                if name is not None and dataset_key(name) not in specs:
                    specs[dataset_key(name)] = dataset_spec(name, default, "default")
                    new.add(dataset_key(name))
                    if default.blocks is not None:
                        specs[block_template_key(name)] = block_spec(name, default, "default")
    rows = []
    for account in ledger.accounts():
        if account.key == POLICY_KEY:  # the pointer to the policy in force, not a limit
            continue
        rule, note = _rule_for(account, specs, policy is not None)
        spent = rule.spent(account.state)
        remaining = rule.remaining(account.state)
        exhausted = rule.limit is not None and remaining.epsilon <= 0.0
        row = {
            "account": account.key, "rule": account.rule,
            "limit": None if rule.limit is None else rule.limit.model_dump(),
            "spent": spent.model_dump(), "remaining": remaining.model_dump(),
            "exhausted": exhausted, "last_seq": account.seq,
            "per": per_account(account.key, getattr(policy, "datasets", {}), default,
                               _pipeline_dataset(ledger, account)),
        }
        if policy is not None:
            row["over_limit"] = _over(rule, account)
            row["new_dataset"] = split_window(account.key)[0] in new
            if row["new_dataset"] and not note:  # a typo under a default limit shows here
                note = "new dataset (not in the policy: its default limit)"
            row["note"] = ("OVER LIMIT: refuses every release" if row["over_limit"] else note
                           or ("exhausted" if exhausted else ""))
        rows.append(row)
    return rows


def _rule_for(account: Account, specs: dict[str, Any], with_policy: bool
              ) -> tuple[CompositionRule, str]:
    """The rule to report ``account`` under: the policy's when it declares the account (and
    the rule names agree), else the one recorded with the account."""
    recorded = rule_from_config(account.config)
    if not with_policy or account.key.startswith("pipeline:"):
        return recorded, ""  # a pipeline's limit is its allocation, never in a policy
    base, period = split_window(account.key)
    # Every block of a dataset is held to the one spec its blocks share (policies.blocks).
    spec = specs.get(base[:base.index("/block:")] + "/block" if "/block:" in base else base)
    if spec is None:
        return recorded, "not in the policy"
    if spec.rule.name != account.rule:
        return recorded, f"RULE CONFLICT: the policy says {spec.rule.name!r}"
    if (None if spec.period is None else spec.period.text) != period:
        return spec.rule, "PERIOD CONFLICT with the policy"
    return spec.rule, ""


def _over(rule: CompositionRule, account: Account) -> bool:
    limit = rule.limit
    if limit is None:
        return False
    return not _numeric.within_budget(rule.spent(account.state), limit)


def _pipeline_dataset(ledger: Ledger, account: Account) -> Any:
    """The dataset a pipeline's account spends on (its last record's): its ε is per its unit."""
    entry = ledger.entry(account.seq) if account.key.startswith("pipeline:") else None
    return None if entry is None else json.loads(entry.text).get("dataset")


def budget_table(ledger: Ledger, policy: Any = None, default: DatasetLimit | None = None) -> str:
    """A fixed-width text table of ``budget_rows`` (with a ``status`` column given a policy)."""
    head: tuple[str, ...] = ("account", "ε is", "rule", "limit ε", "limit δ", "spent ε",
                             "spent δ", "remaining ε", "remaining δ")
    if policy is not None:
        head += ("status",)
    lines = [head]
    for r in budget_rows(ledger, policy, default):
        lim = r["limit"]
        lines.append((r["account"], r["per"], r["rule"],
                      "none" if lim is None else f"{lim['epsilon']:.6g}",
                      "none" if lim is None else f"{lim['delta']:.3g}",
                      f"{r['spent']['epsilon']:.6g}", f"{r['spent']['delta']:.3g}",
                      "∞" if lim is None else f"{r['remaining']['epsilon']:.6g}",
                      "∞" if lim is None else f"{r['remaining']['delta']:.3g}")
                     + ((r["note"],) if policy is not None else ()))
    if len(lines) == 1:
        return "  (no releases recorded)"
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in lines)
