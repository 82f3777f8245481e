"""Account keys, and the accounts a policy declares.

Every limit is one ledger account, named by a key:

=============================  ===============================================================
``global``                     the policy's top-level ``limit`` (all datasets together)
``dataset:adult``              ``[datasets.adult]``
``dataset:adult/analyst:alice`` ``[datasets.adult.analysts.alice]``
``analyst:alice``              ``[analysts.alice]`` (alice across all datasets)
``pipeline:report#12``         a pipeline's allocation (opened by ledger record 12)
``dataset:events/block:2026-11-01`` one block of ``[datasets.events.blocks]`` (``dpbudget.policies.blocks``)
=============================  ===============================================================

A windowed limit (``period``) has one account per window, the key plus ``@<start>+<period>``
(``dpbudget.policies.periods``). Names in a policy cannot contain ``:``, ``/``, ``@`` or ``+``, so no name
can forge another limit's key.

Invariant: ``policy_accounts`` is the one place that maps a policy to its accounts and their rules;
the accountant, ``dpbudget status --policy`` and the load-time rule checks all use it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dpbudget.accountant.composition import CompositionRule, make_rule
from dpbudget.accountant.values.errors import PolicyError, PrivacyError
from dpbudget.policies.limits import DatasetLimit, _Limit
from dpbudget.policies.periods import Period, split_window
from dpbudget.policies.policy import Policy, load_policy

__all__ = ["GLOBAL", "AccountSpec", "PolicyLimits", "analyst_key", "block_spec",
           "block_template_key", "dataset_analyst_key", "dataset_key", "dataset_name",
           "pipeline_key", "policy_accounts"]

GLOBAL = "global"


def dataset_key(dataset: str) -> str:
    return f"dataset:{dataset}"


def dataset_name(key: str) -> str | None:
    """The dataset whose own limit account ``key`` is (a renewal window's suffix ignored), or
    None for any other account (an analyst's, a pipeline's, the global one).

    >>> dataset_name("dataset:adult@2026-11-21+1d"), dataset_name("dataset:adult/analyst:bob")
    ('adult', None)
    """
    base = split_window(key)[0]
    if not base.startswith("dataset:") or "/" in base:
        return None
    return base[len("dataset:"):]


def dataset_analyst_key(dataset: str, analyst: str) -> str:
    return f"dataset:{dataset}/analyst:{analyst}"


def block_template_key(dataset: str) -> str:
    """The key every block account of ``dataset`` extends with ``:<block name>``."""
    return f"dataset:{dataset}/block"


def block_spec(name: str, limit: DatasetLimit, path: str) -> AccountSpec:
    """The account spec every block of ``name`` shares (keyed by ``block_template_key``)."""
    blocks = limit.blocks
    assert blocks is not None
    try:
        rule = make_rule(blocks.composition, blocks.limit, blocks.per_query,
                         conversion_share=blocks.conversion_share, order=blocks.order)
    except PrivacyError as exc:
        raise PolicyError(f"{path}.blocks", str(exc)) from None
    return AccountSpec(block_template_key(name), rule, None, f"{path}.blocks", name)


def analyst_key(analyst: str) -> str:
    return f"analyst:{analyst}"


def pipeline_key(pipeline_id: str) -> str:
    return f"pipeline:{pipeline_id}"


class AccountSpec(NamedTuple):
    """One limit as an account: its base ``key``, its ``rule``, its renewal window (``period``,
    None for a lifetime limit), the policy key ``path`` it comes from, and its ``dataset`` (None
    for the global and per-analyst accounts)."""

    key: str
    rule: CompositionRule
    period: Period | None
    path: str
    dataset: str | None = None

    def key_at(self, now: float) -> str:
        """The account key in force at time ``now`` (the base key for a lifetime limit)."""
        return self.key if self.period is None else self.key + self.period.suffix(now)


def dataset_spec(name: str, limit: DatasetLimit, path: str) -> AccountSpec:
    return AccountSpec(dataset_key(name), _rule(limit, limit.composition, path), limit.window(),
                       path, name)


def policy_accounts(policy: Policy) -> dict[str, AccountSpec]:
    """Every account a ``Policy`` declares, by base key, with its rule built (and so checked).

    Inheritance: a dataset's analyst uses the dataset's ``composition`` and ``period`` unless it
    sets its own; a top-level analyst uses the policy's.

    Raises:
        PolicyError: a rule cannot be built from its limit (e.g. ``"optimal"`` without
            ``per_query``), naming the key path.
    """
    specs: dict[str, AccountSpec] = {}
    if policy.limit is not None:
        specs[GLOBAL] = AccountSpec(GLOBAL, _rule(policy, policy.composition, "limit"),
                                    policy.window(), "limit")
    for name, limit in policy.datasets.items():
        spec = dataset_spec(name, limit, f"datasets.{name}")
        specs[spec.key] = spec
        if limit.blocks is not None:
            specs[block_template_key(name)] = block_spec(name, limit, f"datasets.{name}")
        for who, own in limit.analysts.items():
            path = f"datasets.{name}.analysts.{who}"
            key = dataset_analyst_key(name, who)
            specs[key] = AccountSpec(key, _rule(own, own.composition or limit.composition, path),
                                     own.window() or limit.window(), path, name)
    for who, own in policy.analysts.items():
        path = f"analysts.{who}"
        specs[analyst_key(who)] = AccountSpec(
            analyst_key(who), _rule(own, own.composition or policy.composition, path),
            own.window() or policy.window(), path)
    return specs


def _rule(limit: _Limit, composition: str, path: str) -> CompositionRule:
    try:
        return make_rule(composition, limit.limit, limit.per_query,
                         conversion_share=limit.conversion_share, order=limit.order,
                         step=limit.step)
    except PrivacyError as exc:
        raise PolicyError(path, str(exc)) from None


class PolicyLimits:
    """The limit a policy (a ``Policy`` or a policy file) declares for an account key; windowed
    keys map to their base key. ``default``: the limit of datasets the policy does not list (a
    stored policy's default). What the audit checks replayed spend against."""

    def __init__(self, policy: Any, default: DatasetLimit | None = None) -> None:
        policy = policy if isinstance(policy, Policy) else load_policy(policy)
        self.specs = policy_accounts(policy)
        default = default if default is not None else policy.other_datasets
        self.default = None if default is None else default.rule().limit
        self.default_block = (None if default is None or default.blocks is None
                              else default.blocks.limit)

    def limit_for(self, key: str) -> Any:
        base = split_window(key)[0]
        if "/block:" in base:  # every block of a dataset has the limit of its template
            spec = self.specs.get(base[:base.index("/block:")] + "/block")
            return self.default_block if spec is None else spec.rule.limit
        spec = self.specs.get(base)
        if spec is None:
            return self.default if dataset_name(key) is not None else None
        return spec.rule.limit
