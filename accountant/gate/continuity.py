"""Whether a ledger's recorded accounts can continue under a planner's rules: the same
composition rule and renewal window for every account (``check_ledger``), and, when a ledger from
before stored policies adopts one, no limit above the ones its releases were recorded under
(``refuse_raised``). Run when an accountant opens a ledger and when a policy changes.
"""

from __future__ import annotations

from dpbudget.accountant.values.errors import LedgerConflictError
from dpbudget.accountant.ledger import Ledger
from dpbudget.accountant.gate.planner import Planner
from dpbudget.accountant.gate.step import check_continues
from dpbudget.policies.accounts import dataset_name
from dpbudget.policies.periods import split_window
from dpbudget.policies.stored import POLICY_KEY

__all__ = ["check_ledger", "refuse_raised"]


def check_ledger(ledger: Ledger, planner: Planner) -> None:
    """Refuse a ledger whose accounts were recorded under another rule or renewal period than
    the one ``planner`` declares for them (a rule cannot change mid-stream; adding, removing or
    changing a window would forget recorded spend)."""
    ledger.check_accounts()
    specs = planner.specs
    for account in ledger.accounts():
        base, period = split_window(account.key)
        name = dataset_name(account.key)
        if name is not None:
            planner.know(name)  # for the twin check
        spec = specs.get(_spec_key(base))
        if spec is None:
            continue
        check_continues(account.key, spec.rule, account)
        declared = None if spec.period is None else spec.period.text
        if period != declared:
            raise LedgerConflictError(
                f"{account.key} was recorded "
                f"{'without a renewal window' if period is None else f'with period {period!r}'}"
                f" and the policy gives {base} "
                f"{'none' if declared is None else f'period {declared!r}'}; a renewal window "
                f"cannot change once releases are recorded (that would forget their spend)")


def _spec_key(base: str) -> str:
    """The key of the spec an account is held to: a block's is its dataset's block template."""
    return base[:base.index("/block:")] + "/block" if "/block:" in base else base


def refuse_raised(ledger: Ledger, planner: Planner) -> None:
    """Refuse limits above the ones a ledger's accounts were recorded under: what a ledger from
    before stored policies may adopt silently (raising them is ``apply_policy``'s explicit act).

    Raises:
        LedgerConflictError: naming each account whose limit would rise.
    """
    raised = []
    for account in ledger.accounts():
        recorded = account.config.get("limit") if account.key != POLICY_KEY else None
        spec = planner.specs.get(_spec_key(split_window(account.key)[0]))
        if spec is not None:
            declared = spec.rule.limit
        elif dataset_name(account.key) is not None and planner.default is not None:
            declared = planner.default.rule().limit
        else:
            continue
        if isinstance(recorded, dict) and (declared is None or any(
                getattr(declared, k) > float(recorded.get(k, 0.0)) for k in ("epsilon", "delta"))):
            raised.append(f"{account.key}: recorded {recorded}, given {declared}")
    if raised:
        raise LedgerConflictError(
            "the limits given are above the ones this ledger's releases were recorded under: "
            + "; ".join(raised[:20]) + ". Raise them explicitly with `dpbudget policy apply` "
            "(recorded as a weaker guarantee); nothing was written")
