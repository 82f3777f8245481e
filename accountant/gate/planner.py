"""The planner: which accounts a release is charged to, and which stateless checks it must pass.

Invariant: ``Planner.plan(dataset, analyst)`` is the one place that maps a request to its accounts
— the dataset's limit, the analyst's on it, the analyst's everywhere, the global one, each with its
rule — and to the policy's stateless checks (allowed mechanisms, per-query caps). It validates the
dataset and analyst, refuses unknown or denied ones, and never touches the ledger. Plans are cached
per (dataset, analyst), the least recently used evicted beyond ``_PLAN_CACHE``; a pipeline's plan
is derived from its parent's (``Plan.child``).

Who is held to what:

- The analyst is the one the ledger authenticated (``Ledger.authenticated_analyst``: on
  PostgreSQL the session's role; ``analyst=None`` names it, another is refused). On SQLite and
  in memory the caller's name stands: quotas against mistakes (docs/threat-model.md).
- ``analyst=None``, or an analyst a dataset does not list: only the dataset-level (and
  global) limits apply — unless the dataset sets ``other_analysts = "deny"``, which
  refuses them (``UnknownAnalystError``). The same holds for the top-level
  ``[analysts]`` table and the policy's own ``other_analysts``.
- A join (``dataset=("adult", "census")``) is charged to every limit of every dataset
  named, and must be admitted by each dataset's checks.
- A windowed limit (``period``) charges the account of the window in force at the
  debit's time — its transaction's, the ledger's, never the caller's (``Gate.debit``); see
  ``dpbudget.policies.periods`` for why that is a weaker guarantee.
- ``dataset`` not given: ``"default"`` while the planner knows no other dataset, else refused
  (``dpbudget.accountant.gate.unnamed``); resolved here, before any plan is cached.

Policy changes (a policy file applied to an existing ledger): a policy whose limits are lower than
what a ledger has already spent loads, and those limits then refuse every release (``dpbudget
status --policy`` marks them). A policy whose rule, or renewal period, for an account differs from
the one the ledger recorded is refused (rules cannot change mid-stream; adding or changing a
window would forget recorded spend).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.composition import CompositionRule
from dpbudget.accountant.values.errors import (AnalystMismatchError, InvalidArgumentError, InvalidTypeError,
                               UnknownAnalystError, UnknownDatasetError)
from dpbudget.accountant.ledger.record import AccountLayout, canonical
from dpbudget.accountant.gate.unnamed import NOT_GIVEN, named
from dpbudget.policies.accounts import (AccountSpec, analyst_key, block_spec, block_template_key,
                               dataset_analyst_key, dataset_key, policy_accounts)
from dpbudget.policies.blocks import Blocks, Unlock, block_names
from dpbudget.policies.limits import DatasetLimit, folded_name, valid_name
from dpbudget.policies.periods import Period
from dpbudget.policies.policy import Policy
from dpbudget.policies.stored import POLICY_KEY

__all__ = ["Plan", "Planner", "Target"]

_PLAN_CACHE = 4096  # plans, targets kept; more in use lose only the least recently used
_V = TypeVar("_V")


class Target(NamedTuple):
    """One account a step is charged to: its base key, rule, renewal window and record layout."""

    key: str
    rule: CompositionRule
    period: Period | None
    layout: AccountLayout
    unlock: tuple[Unlock, float] | None = None  # a block's schedule and the block's start

    @classmethod
    def of(cls, key: str, rule: CompositionRule, period: Period | None = None,
           unlock: tuple[Unlock, float] | None = None) -> "Target":
        return cls(key, rule, period, AccountLayout(rule.describe()), unlock)

    def key_at(self, now: float) -> str:
        """The account key in force at time ``now`` (the base key for a lifetime limit)."""
        return self.key if self.period is None else self.key + self.period.suffix(now)


class Plan(NamedTuple):
    """What a release on ``dataset`` by ``analyst`` is charged to (``targets``, dataset first)
    and checked against (``checks``: the datasets whose policy has stateless checks), plus extra
    record ``members`` (a pipeline's id). ``fixed``: the record members the plan fixes (analyst,
    dataset(s), ``members``), encoded once. Build one with ``Plan.make``."""

    dataset: str | tuple[str, ...]
    analyst: str | None
    targets: tuple[Target, ...]
    checks: tuple[tuple[str, DatasetLimit], ...]
    members: Mapping[str, str]
    windowed: bool
    fixed: Mapping[str, str]
    prefetch: tuple[str, ...]  # what a debit reads without windows: the policy pointer, targets
    opens: tuple[float, str] | None = None  # the latest start among the blocks named, and its name

    @classmethod
    def make(cls, dataset: str | tuple[str, ...], analyst: str | None,
             targets: tuple[Target, ...], checks: tuple[tuple[str, DatasetLimit], ...],
             members: Mapping[str, str] | None = None,
             opens: tuple[float, str] | None = None) -> "Plan":
        members = dict(members or {})
        fixed = {"analyst": canonical(analyst)}
        if isinstance(dataset, str):
            fixed["dataset"] = canonical(dataset)
        else:  # a join names its first dataset in ``dataset`` and all of them in ``datasets``
            fixed["dataset"] = canonical(dataset[0])
            fixed["datasets"] = canonical(list(dataset))
        fixed.update(members)
        return cls(dataset, analyst, targets, checks, members,
                   any(t.period is not None for t in targets), fixed,
                   (POLICY_KEY, *(t.key for t in targets)), opens)

    def child(self, target: Target, members: Mapping[str, str]) -> "Plan":
        """The plan of a pipeline opened on this one: charged to ``target`` (its own account)
        only, still subject to the datasets' stateless checks."""
        return Plan.make(self.dataset, self.analyst, (target,), self.checks, members)

    def keys(self, now: float) -> list[str]:
        """The account keys in force at time ``now``."""
        return [t.key_at(now) for t in self.targets]

    def window_end(self, now: float) -> float | None:
        """When the earliest renewal window among the targets ends (None: no window)."""
        ends = [t.period.end(now) for t in self.targets if t.period is not None]
        return min(ends) if ends else None

    def begun(self, now: float) -> float:
        """``now``, checked to be no earlier than the start of every block this plan reads;
        else ``InvalidArgumentError`` (the block has no data yet: nothing drawn or debited)."""
        if self.opens is not None and now < self.opens[0]:
            raise InvalidArgumentError("blocks", self.opens[1], "blocks that have begun (this "
                                       "one has not: it has no data yet)")
        return now

    def keys_at(self, now: float) -> list[str]:
        """What a debit at time ``now`` reads: the policy pointer and ``keys(now)``."""
        return [POLICY_KEY, *self.keys(now)]

    def refused_dataset(self, key: str) -> str:
        """The dataset a refusal of account ``key`` is reported on: the one asked for, or for a
        join the one whose account refused (the first named, if a global or analyst limit did)."""
        if isinstance(self.dataset, str):
            return self.dataset
        for name in self.dataset:
            own = dataset_key(name)
            if key == own or key.startswith((own + "/", own + "@")):
                return name
        return self.dataset[0]


class Planner:
    """Plans requests against a policy (and, for ``Accountant(limit)``, a default dataset limit).

    Raises (``plan``):
        UnknownDatasetError, UnknownAnalystError, InvalidArgumentError, InvalidTypeError.
    """

    def __init__(self, policy: Policy, default: DatasetLimit | None,
                 analyst: str | None = None) -> None:
        self.policy = policy
        self.analyst = analyst  # the ledger's authenticated analyst: every plan's (None: any)
        # A policy file admits datasets it does not list only through its own other_datasets.
        self.default = default if default is not None else getattr(policy, "other_datasets", None)
        self.specs: dict[str, AccountSpec] = policy_accounts(policy)  # builds (checks) rules
        self._targets: OrderedDict[str, Target] = OrderedDict()
        self._plans: OrderedDict[tuple[Any, ...], Plan] = OrderedDict()
        self._known: set[str] = set()
        self._folded: dict[str, str] = {}
        for name in policy.datasets:
            self.know(name)

    def plan(self, dataset: Any, analyst: str | None, blocks: Any = None) -> Plan:
        """The (cached) plan of a release on ``dataset`` (a name, or a tuple/list of names for a
        join) by ``authenticated(analyst)``, reading ``blocks`` of a dataset divided into blocks."""
        if dataset is NOT_GIVEN:
            dataset = named(dataset, self._known)
        if self.analyst is not None and analyst is not self.analyst:
            analyst = self.authenticated(analyst)
        if blocks is not None:
            return self._block_plan(dataset, analyst, blocks)
        if type(dataset) is list:  # a join given as a list: the same plan as the tuple
            dataset = tuple(dataset)
        try:
            return _lru(self._plans, (dataset, analyst), lambda: self._make_plan(dataset, analyst))
        except TypeError:  # an unhashable name (refused when planning), InvalidTypeError
            return self._make_plan(dataset, analyst)

    def authenticated(self, analyst: Any) -> str | None:
        """Who a release naming ``analyst`` is charged to: the caller's name, unless the ledger
        authenticated the analyst (``None`` names it; another name: ``AnalystMismatchError``)."""
        if self.analyst is None or analyst is None:
            return self.analyst if analyst is None else analyst
        if _validate.text("analyst", analyst) != self.analyst:
            raise AnalystMismatchError(analyst, self.analyst)
        return self.analyst

    def limit(self, dataset: str) -> DatasetLimit:
        """The limit declared for ``dataset``.

        A dataset the policy does not list falls under the default limit (``Accountant(limit)``)
        only with a name in the policy file's syntax (letters, digits, '_', '.', '-': no spaces
        to vary) that is not a case-only twin of a dataset already known — "people", "People"
        and "people " would otherwise be three budgets for one table.
        """
        _validate.text("dataset", dataset := named(dataset, self._known))
        declared = self.policy.datasets.get(dataset)
        if declared is not None:
            return declared
        if self.default is None:
            raise UnknownDatasetError(dataset, tuple(sorted(self.policy.datasets)))
        if dataset not in self._known:
            valid_name_as("dataset", dataset)
            twin = self._folded.get(folded_name(dataset))
            if twin is not None and twin != dataset:
                raise InvalidArgumentError("dataset", dataset, f"not a variant (in case or "
                                           f"'_', '.', '-') of the dataset {twin!r} (one table, "
                                           "one budget)")
            self.know(dataset)
        return self.default

    def know(self, dataset: str, *, instead_of: str | None = None) -> None:
        """Record ``dataset`` as in use (from the ledger's accounts, or on first release);
        ``instead_of``: a twin this planner took for new, that the ledger shows is not."""
        if instead_of is not None:
            self._known.discard(instead_of)
            self._folded[folded_name(dataset)] = dataset
        self._known.add(dataset)
        self._folded.setdefault(folded_name(dataset), dataset)

    def account(self, dataset: str, analyst: str | None, block: str | None = None) -> Target:
        """The account of ``dataset``'s limit, of its ``analyst``'s there, or of one block."""
        limit = self.limit(dataset := named(dataset, self._known))
        if block is not None:
            if analyst is not None or limit.blocks is None:
                raise InvalidArgumentError("block", block, "a block of a dataset divided into "
                                           "blocks (without analyst)")
            names = block_names(limit.blocks, block)
            if len(names) != 1:
                raise InvalidArgumentError("block", "several", "one block name")
            return self._block_target(self._block_template(dataset), limit.blocks, names[0])
        target = self._dataset_target(dataset, limit)
        if _validate.text("analyst", analyst, optional=True) is not None:
            spec = self.specs.get(dataset_analyst_key(dataset, analyst))  # type: ignore[arg-type]
            if spec is None:
                raise InvalidArgumentError("analyst", analyst, f"an analyst with a limit on "
                                           f"{dataset!r} ({sorted(limit.analysts)})")
            target = self._target(spec)
        return target

    def _block_plan(self, dataset: Any, analyst: str | None, blocks: Any) -> Plan:
        """The plan of a release on blocks of one dataset: its plan without blocks, with each
        block's account after the dataset's (all charged in one transaction, all or none)."""
        if not isinstance(dataset, str):
            raise InvalidArgumentError("blocks", "given with a join", "blocks of one dataset "
                                       "(a release on several datasets cannot name blocks)")
        _validate.text("analyst", analyst, optional=True)
        spec = self.limit(dataset).blocks
        if spec is None:
            raise InvalidArgumentError("blocks", "given", f"omitted: dataset {dataset!r} is not "
                                       "divided into blocks")
        names = block_names(spec, blocks)
        return _lru(self._plans, (dataset, analyst, names),
                    lambda: self._make_block_plan(dataset, analyst, spec, names))

    def _make_block_plan(self, dataset: str, analyst: str | None, spec: Blocks,
                         names: tuple[str, ...]) -> Plan:
        base = self._make_plan(dataset, analyst, with_blocks=True)
        template = self._block_template(dataset)
        own = tuple(self._block_target(template, spec, b) for b in names)
        opens = max((spec.start(b), b) for b in names)
        return Plan.make(dataset, analyst, (base.targets[0], *own, *base.targets[1:]),
                         base.checks, {"blocks": canonical(list(names))},
                         opens if opens[0] > 0.0 else None)

    def inside_plan(self, dataset: Any, analyst: str | None) -> Plan:
        """The plan of a release made inside a pipeline, as the audit re-checks it: the
        datasets' stateless checks, without requiring the blocks its pipeline paid for."""
        return self._make_plan(dataset, analyst, with_blocks=True)

    def _block_target(self, template: AccountSpec, spec: Blocks, block: str) -> Target:
        key = template.key + ":" + block
        return _lru(self._targets, key, lambda: Target.of(key, template.rule, None, None if (
            spec.unlock is None) else (spec.unlock, spec.start(block))))

    def _block_template(self, dataset: str) -> AccountSpec:
        spec = self.specs.get(block_template_key(dataset))
        if spec is None:  # a dataset under the default limit: made on first use
            limit = self.limit(dataset)
            spec = self.specs[block_template_key(dataset)] = block_spec(dataset, limit, dataset)
        return spec

    def _make_plan(self, dataset: Any, analyst: str | None, *, with_blocks: bool = False) -> Plan:
        names = _dataset_names(dataset)
        _validate.text("analyst", analyst, optional=True)
        policy = self.policy
        targets: list[Target] = []
        checks: list[tuple[str, DatasetLimit]] = []
        for name in names:
            limit = self.limit(name)
            if limit.blocks is not None and not with_blocks:
                raise InvalidArgumentError(
                    "blocks", None, f"the blocks the data came from: dataset {name!r} is divided "
                    f"into blocks ({_division(limit)}); pass blocks=...")
            targets.append(self._dataset_target(name, limit))
            if analyst is not None and analyst in limit.analysts:
                targets.append(self._target(self.specs[dataset_analyst_key(name, analyst)]))
            elif limit.other_analysts == "deny":
                raise UnknownAnalystError(analyst, f"datasets.{name}",
                                          tuple(sorted(limit.analysts)))
            if (limit.allowed_mechanisms, limit.max_per_query, limit.privacy_unit) != (None,) * 3:
                checks.append((name, limit))
        if analyst is not None and analyst in policy.analysts:
            targets.append(self._target(self.specs[analyst_key(analyst)]))
        elif policy.other_analysts == "deny":
            raise UnknownAnalystError(analyst, "the policy's [analysts] table",
                                      tuple(sorted(policy.analysts)))
        if "global" in self.specs:
            targets.append(self._target(self.specs["global"]))
        return Plan.make(names[0] if isinstance(dataset, str) else names, analyst,
                         tuple(targets), tuple(checks))

    def _dataset_target(self, name: str, limit: DatasetLimit) -> Target:
        spec = self.specs.get(dataset_key(name))
        if spec is None:  # a dataset under the default limit: its spec is made on first use
            spec = AccountSpec(dataset_key(name), limit.rule(), limit.window(), name, name)
            self.specs[spec.key] = spec
        return self._target(spec)

    def _target(self, spec: AccountSpec) -> Target:
        return _lru(self._targets, spec.key, lambda: Target.of(spec.key, spec.rule, spec.period))


def _lru(cache: OrderedDict[Any, _V], key: Any, make: Callable[[], _V]) -> _V:
    """``cache[key]``, now the most recently used, or ``make()`` kept there, evicting the least
    recently used beyond ``_PLAN_CACHE`` (KeyError in a race with another thread: made again)."""
    try:
        cache.move_to_end(key)
        return cache[key]
    except KeyError:
        value = cache[key] = make()
        while len(cache) > _PLAN_CACHE:
            cache.popitem(last=False)
        return value


def _division(limit: DatasetLimit) -> str:
    spec = limit.blocks
    assert spec is not None
    return f"by {spec.by}" if spec.by is not None else f"named {list(spec.names or ())[:5]}"


def valid_name_as(argument: str, value: str) -> str:
    """``dpbudget.policies.limits.valid_name``, naming ``argument`` in its error."""
    try:
        return valid_name(value)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(argument, value, exc.expected) from None


def pipeline_members(pipeline_id: str) -> dict[str, str]:
    """The record members that tie a release to the pipeline it was made in."""
    return {"pipeline": canonical(pipeline_id)}


def dataset_limits(limits: Any, composition: str, per_query: Budget | None,
                   order: float | None = None,
                   step: tuple[float, float] | None = None) -> dict[str, DatasetLimit]:
    """``Accountant(limits=...)`` as the policy's dataset limits (plain ``Budget`` entries get
    ``composition``, ``per_query``, ``order`` and ``step``)."""
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise InvalidTypeError("limits", limits, "a mapping of dataset names to limits")
    out: dict[str, DatasetLimit] = {}
    for name, value in limits.items():
        _validate.text("limits key", name)
        if any(c in name for c in ":/@+"):  # they build account keys: no name may forge one
            raise InvalidArgumentError("limits key", name, "a dataset name without ':', '/', "
                                       "'@' or '+'")
        if isinstance(value, DatasetLimit):
            out[name] = value
        elif value is None or isinstance(value, Budget):
            out[name] = DatasetLimit(limit=value, composition=composition, per_query=per_query,
                                     order=order, step=step)
        else:
            raise InvalidTypeError(f"limits[{name!r}]", value, "a Budget, a DatasetLimit or None")
    return out


def _dataset_names(dataset: Any) -> tuple[str, ...]:
    """The dataset(s) a release names: one name, or a tuple/list of distinct names (a join)."""
    if isinstance(dataset, (tuple, list)):
        if not dataset:
            raise InvalidArgumentError("dataset", dataset,
                                       "a name or a non-empty sequence of names")
        names = tuple(_validate.text("dataset", d) for d in dataset)
        if len(set(names)) != len(names):
            raise InvalidArgumentError("dataset", dataset, "distinct dataset names")
        return names  # type: ignore[return-value]
    return (_validate.text("dataset", dataset),)  # type: ignore[return-value]
