"""The ``Accountant``: the one gate every noisy answer passes through.

Invariant (ARCHITECTURE.md, "the one rule"): validate everything → in one ledger transaction, read
each applicable limit's state, ask its composition rule whether the step fits, append the record and
the new states, commit → only then let the mechanism draw noise. A refusal or a bad argument leaves
the ledger and the random source exactly as they were. Every spending method goes through
``_debit``; nothing changes state before validation has finished.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from accountant import _numeric, _validate
from accountant.budget import Budget
from accountant.composition import Charge, CompositionRule, Refused, make_rule
from accountant.composition.base import clip_delta
from accountant.errors import (
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
    LedgerConflictError,
    MechanismNotAllowedError,
    UnknownAnalystError,
    UnknownDatasetError,
)
from accountant.ledger import Account, Ledger, open_ledger
from accountant.ledger.record import assemble, canonical, step_fragments
from accountant.pipeline import Pipeline, budgeted, open_pipeline
from accountant.receipt import Receipt
from accountant.session import NumericSession, Session
from mechanisms.base import Mechanism, StreamMechanism
from mechanisms.sampling import Sampler
from policies.accounts import (
    AccountSpec,
    analyst_key,
    dataset_analyst_key,
    dataset_key,
    policy_accounts,
)
from policies.limits import DatasetLimit
from policies.periods import split_window
from policies.policy import Policy, load_policy

__all__ = ["Accountant"]


class Accountant:
    """Checks and debits privacy budgets before any noisy answer is released.

    Args:
        limit: the limit every dataset gets, each separately (each dataset is its own population);
            ``None`` (with no ``limits``) means no limit — spend is still recorded.
        limits: per-dataset limits, ``{"adult": Budget(...)}`` or ``{"adult": DatasetLimit(...)}``.
            A release on a dataset not listed is refused unless ``limit`` is also given.
        composition: the rule for ``limit`` and for plain ``Budget`` entries of ``limits``.
        per_query: a cap on any single release's cost, with ``limit``.
        ledger: a ``Ledger``, a URL (``"sqlite:///budget.db"``, ``"memory://"``,
            ``"postgresql://..."``), a path, or ``None`` for an in-memory ledger.
        rng: ``None`` for the OS CSPRNG (the default), or a seeded ``numpy.random.Generator`` / int
            for tests and reproducible examples only.

    Raises:
        InvalidArgumentError, InvalidTypeError: a malformed limit, rule name, ledger or rng.
        LedgerConflictError: the ledger holds a dataset under a different composition rule.

    ``Accountant.from_policy(path)`` builds one from a policy file instead (per-dataset,
    per-analyst, global limits, caps, allowed mechanisms); ``pipeline``/``budgeted`` open child
    budgets (``accountant.pipeline``).

    >>> from mechanisms import Laplace
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> noisy = acc.release(Laplace(epsilon=0.25), 42.0, dataset="adult")
    >>> acc.spent("adult"), acc.remaining("adult")
    (Budget(epsilon=0.25, delta=0.0), Budget(epsilon=0.75, delta=0.0))
    >>> acc.can_afford(Laplace(epsilon=1.0), dataset="adult")
    False
    """

    def __init__(self, limit: Budget | None = None, *,
                 limits: Mapping[str, Budget | DatasetLimit | None] | None = None,
                 composition: str = "basic", per_query: Budget | None = None,
                 ledger: Ledger | str | None = None, rng: Any = None) -> None:
        _optional_budget("limit", limit)
        _optional_budget("per_query", per_query)
        make_rule(composition, limit, per_query)  # validates the rule name before anything opens
        default: DatasetLimit | None = None
        if limits is None or limit is not None:
            default = DatasetLimit(limit=limit, composition=composition, per_query=per_query)
        # The same machinery as a policy file's, without a file: only dataset limits (names
        # are not restricted to the policy file's syntax here; only a file's are).
        policy = Policy.model_construct(datasets=_dataset_limits(limits, composition, per_query))
        self._setup(policy, default, ledger, rng, None)

    @classmethod
    def from_policy(cls, path: "str | os.PathLike[str] | Policy", *,
                    ledger: Ledger | str | None = None, rng: Any = None,
                    clock: Callable[[], float] | None = None) -> "Accountant":
        """An accountant enforcing a policy file (TOML or JSON; see ``policies.policy``).

        Every release is checked, before anything is drawn, against: the datasets' allowed
        mechanisms, their per-query caps, and every limit that applies to it — the global
        limit, each dataset's, the analyst's on each dataset, the analyst's across datasets —
        all debited in one ledger transaction, or none.

        Who is held to what:

        - ``analyst=None``, or an analyst a dataset does not list: only the dataset-level (and
          global) limits apply — unless the dataset sets ``other_analysts = "deny"``, which
          refuses them (``UnknownAnalystError``). The same holds for the top-level
          ``[analysts]`` table and the policy's own ``other_analysts``.
        - A join (``dataset=("adult", "census")``) is charged to every limit of every dataset
          named, and must be admitted by each dataset's checks.
        - A windowed limit (``period``) charges the account of the window in force at the
          release; see ``policies.periods`` for why that is a weaker guarantee.

        Policy changes: a policy whose limits are lower than what a ledger has already spent
        loads, and those limits then refuse every release (``dpbudget status --policy`` marks
        them). A policy whose rule, or renewal period, for an account differs from the one the
        ledger recorded is refused (rules cannot change mid-stream; adding or changing a window
        would forget recorded spend).

        Args:
            path: the policy file, or an already validated ``Policy``.
            ledger: as for ``Accountant``.
            rng: as for ``Accountant``.
            clock: seconds since the epoch (default ``time.time``); decides the renewal window.
                Tests inject one.

        Raises:
            PolicyError: a malformed policy file, naming the key path; nothing was opened.
            LedgerConflictError: the ledger holds an account under another rule or period.

        >>> import tempfile, pathlib
        >>> from mechanisms import Laplace
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "policy.toml"
        >>> _ = f.write_text('''
        ... [datasets.adult]
        ... limit = { epsilon = 1.0 }
        ... [datasets.adult.analysts.alice]
        ... limit = { epsilon = 0.3 }
        ... ''')
        >>> acc = Accountant.from_policy(f, rng=0)
        >>> _ = acc.release(Laplace(0.25), 10.0, dataset="adult", analyst="alice")
        >>> acc.remaining("adult", analyst="alice")
        Budget(epsilon=0.04999999999999999, delta=0.0)
        >>> acc.can_afford(Laplace(0.25), dataset="adult", analyst="alice")
        False
        >>> acc.can_afford(Laplace(0.25), dataset="adult", analyst="bob")
        True
        """
        policy = path if isinstance(path, Policy) else load_policy(path)
        acc = cls.__new__(cls)
        acc._setup(policy, None, ledger, rng, clock)
        return acc

    def _setup(self, policy: Policy, default: DatasetLimit | None, ledger: Any, rng: Any,
               clock: Callable[[], float] | None) -> None:
        if clock is not None and not callable(clock):
            raise InvalidTypeError("clock", clock, "a callable returning seconds since the epoch")
        self._policy = policy
        self._default = default
        self._specs: dict[str, AccountSpec] = policy_accounts(policy)  # builds (checks) rules
        self._plans: dict[tuple[Any, str | None], _Plan] = {}
        self._clock = clock or time.time
        self._sampler = Sampler(rng)
        self._ledger = open_ledger(ledger)
        self._local = threading.local()
        try:
            self._check_ledger()
        except BaseException:
            if not isinstance(ledger, Ledger):  # ours to close; a caller's ledger stays open
                self._ledger.close()
            raise

    @property
    def policy(self) -> Policy:
        """The policy enforced (for an accountant built from arguments: its dataset limits)."""
        return self._policy

    # -- releasing ---------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, value: Any, *, dataset: str = "default",
                analyst: str | None = None, label: str | None = None) -> Any:
        """Debit ``mechanism.cost`` from every limit that applies, then return the noisy answer.

        The limits: ``dataset``'s, and with a policy (``from_policy``) also the analyst's on it,
        the analyst's across datasets and the global one — all debited in one ledger
        transaction, or none. ``dataset`` may be a tuple (or list) of names: a release computed
        from several datasets (a join) is charged to each of them, all or none.

        Scalar in, scalar (``float``) out; array (or list) in, ``numpy`` array out.

        Raises:
            BudgetExceededError: the release does not fit in some limit (``account`` names it),
                or is above a per-query cap; nothing was drawn or debited.
            MechanismNotAllowedError: the policy does not allow this mechanism on the dataset.
            InvalidArgumentError, InvalidTypeError: a bad mechanism, value, dataset, analyst or
                label; nothing was drawn or debited.
            UnknownDatasetError: no limit is declared for ``dataset``.
            UnknownAnalystError: the policy denies this analyst (or ``None``) on the dataset.
        """
        prepared = self._validated(mechanism, dataset, analyst, label, value)
        self._local.receipt = self._debit(mechanism, dataset, analyst, label)
        return mechanism._release(prepared, self._sampler)

    def can_afford(self, mechanism: Mechanism, *, dataset: str = "default",
                   analyst: str | None = None) -> bool:
        """Whether ``release(mechanism, ...)`` would be admitted now. A dry run: debits nothing.

        Another caller may spend in between; only ``release`` is authoritative. A release above
        a policy's per-query cap is not affordable; a mechanism the policy does not allow at all
        raises ``MechanismNotAllowedError``, as ``release`` would.
        """
        try:
            self._validated(mechanism, dataset, analyst, None)
        except BudgetExceededError:  # a per-query cap
            return False
        for key, rule in self._targets(dataset, analyst):
            try:
                rule.debit(self._state(key, rule), mechanism.charge)
            except Refused:
                return False
        return True

    @property
    def last_receipt(self) -> Receipt | None:
        """The receipt of this thread's last successful release (seq, hash, cost, spent,
        remaining), or None."""
        pending = getattr(self._local, "receipt", None)
        return None if pending is None else Receipt(*pending)

    # -- pipelines (child budgets) ------------------------------------------------------------

    def pipeline(self, name: str, *, dataset: Any = "default", budget: Budget,
                 analyst: str | None = None, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None) -> Pipeline:
        """Open a child budget of ``budget`` on ``dataset``: its whole allocation is debited
        now, as one step, from every limit a release there would be charged to; releases inside
        are then charged to the pipeline's own account only. See ``accountant.pipeline``.

        Raises:
            BudgetExceededError: the allocation does not fit; nothing was debited.
            InvalidArgumentError, InvalidTypeError, UnknownDatasetError, UnknownAnalystError:
                as for ``release``, or a bad name, budget or rule.

        >>> from mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0), rng=0)
        >>> with acc.pipeline("report", dataset="adult", budget=Budget(0.5)) as p:
        ...     _ = p.release(Laplace(0.2), 3.0)
        ...     p.spent(), p.remaining()
        (Budget(epsilon=0.2, delta=0.0), Budget(epsilon=0.3, delta=0.0))
        >>> acc.spent("adult")  # the whole allocation, spent once and not refunded
        Budget(epsilon=0.5, delta=0.0)
        """
        return open_pipeline(self, None, name, dataset, analyst, budget, composition, per_query,
                             label)

    def budgeted(self, name: str, *, dataset: Any = "default", budget: Budget,
                 analyst: str | None = None, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None) -> Callable:
        """Decorator: each call of the function runs in a new pipeline (as ``pipeline``), passed
        as its first argument. The arguments are checked when decorating.

        >>> from mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0), rng=0)
        >>> @acc.budgeted("twice", dataset="adult", budget=Budget(0.4))
        ... def twice(p, value):
        ...     return [p.release(Laplace(0.2), value) for _ in range(2)]
        >>> len(twice(5.0)), acc.spent("adult")
        (2, Budget(epsilon=0.4, delta=0.0))
        """
        return budgeted(self, None, name, dataset, analyst, budget, composition, per_query, label)

    # -- reading -----------------------------------------------------------------------------

    def spent(self, dataset: str = "default", *, analyst: str | None = None) -> Budget:
        """How much of ``dataset``'s limit the releases so far have used, as (ε, δ) under its
        rule (rounded up; see ``CompositionRule.spent`` for what this does and does not
        guarantee); with ``analyst``, of that analyst's limit there. For a windowed limit, in the
        current window."""
        key, rule = self._account(dataset, analyst)
        return rule.spent(self._state(key, rule))

    def remaining(self, dataset: str = "default", *, analyst: str | None = None) -> Budget:
        """What is left of ``dataset``'s limit (rounded down; ``Budget.unlimited()`` if none);
        with ``analyst``, of that analyst's limit on it."""
        key, rule = self._account(dataset, analyst)
        return rule.remaining(self._state(key, rule))

    def limit(self, dataset: str = "default") -> DatasetLimit:
        """The limit declared for ``dataset``."""
        _validate.text("dataset", dataset)
        declared = self._policy.datasets.get(dataset, self._default)
        if declared is None:
            raise UnknownDatasetError(dataset, tuple(sorted(self._policy.datasets)))
        return declared

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    def close(self) -> None:
        self._ledger.close()

    def __enter__(self) -> "Accountant":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the gate ------------------------------------------------------------------------------

    def _validated(self, mechanism: Mechanism, dataset: Any, analyst: str | None,
                   label: str | None, *value: Any) -> Any:
        if not isinstance(mechanism, Mechanism):
            raise InvalidTypeError("mechanism", mechanism, "a dpbudget Mechanism")
        _validate.text("label", label, optional=True)
        # An unknown dataset or refused analyst is refused before anything else happens; the
        # plan validates both and is cached per (dataset, analyst).
        plan = self._plan(dataset, analyst)
        if plan.checks:
            self._check(plan, mechanism)
        return mechanism.prepare(value[0]) if value else None

    def _debit(self, mechanism: Mechanism, dataset: Any, analyst: str | None,
               label: str | None, targets: list[tuple[str, CompositionRule]] | None = None,
               members: Callable[[int], dict[str, str]] | None = None) -> tuple:
        """Check and debit in one ledger transaction; return the receipt's fields (a Receipt is
        built only if asked for: this is the hot path).

        ``targets`` (default: ``_targets(dataset, analyst)``) are the accounts charged;
        ``members(seq)`` adds record members (canonical JSON) given the record's sequence number.
        Every account in the record is debited with exactly ``mechanism.charge``, which is the
        record's ``cost`` (the auditor replays records on that invariant)."""
        charge = mechanism.charge
        if targets is None:
            targets = self._targets(dataset, analyst)
        with self._ledger.transaction() as tx:
            accounts: list[Account] = []
            for key, rule in targets:
                current = tx.account(key)
                self._check_rule(key, rule, current)
                state = rule.initial_state() if current is None else current.state
                try:
                    new_state = rule.debit(state, charge)
                except Refused as refusal:
                    raise BudgetExceededError(mechanism.cost, rule.remaining(state),
                                              _dataset_of(key, dataset), key,
                                              refusal.reason) from None
                accounts.append(Account(key, rule.name, rule.describe(), new_state, 0))
            fields = _record(mechanism, dataset, analyst, label,
                             [(rule, a) for (_, rule), a in zip(targets, accounts)])
            if members is not None:
                fields.update(members(tx.next_seq))
            entry = tx.append(fields, accounts)
        return (entry.seq, entry.hash, dataset, analyst, label, mechanism.name, mechanism.cost,
                targets[0][1], accounts[0].state)

    def _targets(self, dataset: Any, analyst: str | None) -> list[tuple[str, CompositionRule]]:
        """Every limit a release on ``dataset`` by ``analyst`` is charged to, dataset first:
        ``(account key, rule)`` pairs, from a plan cached per (dataset, analyst)."""
        try:
            plan = self._plans[(dataset, analyst)]
        except (KeyError, TypeError):  # TypeError: a list of datasets (a join), not hashable
            plan = self._plan(dataset, analyst)
        return plan.at(self._clock()) if plan.windowed else plan.targets

    def _plan(self, dataset: Any, analyst: str | None) -> "_Plan":
        if type(dataset) is list:
            dataset = tuple(dataset)
        try:
            return self._plans[(dataset, analyst)]
        except (KeyError, TypeError):
            pass
        plan = self._make_plan(dataset, analyst)
        if len(self._plans) >= _PLAN_CACHE:
            self._plans.clear()  # bounded: arbitrary (dataset, analyst) pairs must not pile up
        self._plans[(dataset, analyst)] = plan
        return plan

    def _make_plan(self, dataset: Any, analyst: str | None) -> "_Plan":
        names = _dataset_names(dataset)
        _validate.text("analyst", analyst, optional=True)
        policy = self._policy
        specs: list[AccountSpec] = []
        checks: list[tuple[str, DatasetLimit]] = []
        for name in names:
            limit = self.limit(name)
            specs.append(self._dataset_spec(name, limit))
            if analyst is not None and analyst in limit.analysts:
                specs.append(self._specs[dataset_analyst_key(name, analyst)])
            elif limit.other_analysts == "deny":
                raise UnknownAnalystError(analyst, f"datasets.{name}",
                                          tuple(sorted(limit.analysts)))
            if limit.allowed_mechanisms is not None or limit.max_per_query is not None:
                checks.append((name, limit))
        if analyst is not None and analyst in policy.analysts:
            specs.append(self._specs[analyst_key(analyst)])
        elif policy.other_analysts == "deny":
            raise UnknownAnalystError(analyst, "the policy's [analysts] table",
                                      tuple(sorted(policy.analysts)))
        if "global" in self._specs:
            specs.append(self._specs["global"])
        return _Plan(specs, checks)

    def _dataset_spec(self, name: str, limit: DatasetLimit) -> AccountSpec:
        spec = self._specs.get(dataset_key(name))
        if spec is None:  # a dataset under the default limit: its spec is made on first use
            spec = AccountSpec(dataset_key(name), limit.rule(), limit.window(), name, name)
            self._specs[spec.key] = spec
        return spec

    def _check(self, plan: "_Plan", mechanism: Mechanism) -> None:
        """The policy's stateless checks of one release: allowed mechanisms, per-query caps."""
        for name, limit in plan.checks:
            allowed = limit.allowed_mechanisms
            if allowed is not None and mechanism.name not in allowed:
                raise MechanismNotAllowedError(
                    f"datasets.{name}.allowed_mechanisms does not admit {mechanism.name} "
                    f"(admitted: {list(allowed)}); nothing was drawn and nothing was debited")
            cap = limit.max_per_query
            if cap is not None and not cap.admits(mechanism.cost):
                raise BudgetExceededError(mechanism.cost, self.remaining(name), name,
                                          dataset_key(name), f"above datasets.{name}."
                                          f"max_per_query {cap}")

    def _account(self, dataset: str, analyst: str | None) -> tuple[str, CompositionRule]:
        """The (current) key and rule of ``dataset``'s limit, or its ``analyst``'s there."""
        limit = self.limit(dataset)
        spec = self._dataset_spec(dataset, limit)
        if _validate.text("analyst", analyst, optional=True) is not None:
            spec = self._specs.get(dataset_analyst_key(dataset, analyst))
            if spec is None:
                raise InvalidArgumentError("analyst", analyst, f"an analyst with a limit on "
                                           f"{dataset!r} ({sorted(limit.analysts)})")
        return spec.key_at(self._clock()), spec.rule

    def _state(self, key: str, rule: CompositionRule) -> dict[str, float]:
        current = self._ledger.account(key)
        self._check_rule(key, rule, current)
        return rule.initial_state() if current is None else current.state

    def _check_ledger(self) -> None:
        """Refuse a ledger whose accounts were recorded under another rule or renewal period
        than the one now declared for them (a rule cannot change mid-stream; adding, removing
        or changing a window would forget recorded spend)."""
        if not self._specs:
            return
        for account in self._ledger.accounts():
            base, period = split_window(account.key)
            spec = self._specs.get(base)
            if spec is None:
                continue
            self._check_rule(account.key, spec.rule, account)
            declared = None if spec.period is None else spec.period.text
            if period != declared:
                raise LedgerConflictError(
                    f"{account.key} was recorded "
                    f"{'without a renewal window' if period is None else f'with period {period!r}'}"
                    f" and the policy gives {base} "
                    f"{'none' if declared is None else f'period {declared!r}'}; a renewal window "
                    f"cannot change once releases are recorded (that would forget their spend)")

    @staticmethod
    def _check_rule(key: str, rule: CompositionRule, current: Account | None) -> None:
        # The common case (same rule, no state parameters) is decided without building anything:
        # this runs on every debit.
        if current is not None and (current.rule != rule.name or rule.state_params):
            why = rule.conflict({**current.config, "rule": current.rule})
            if why is not None:
                raise LedgerConflictError(f"{key} cannot continue: {why}")

    # -- planning and batches (issue 3) ------------------------------------------------------

    def max_releases(self, mechanism: Mechanism, *, dataset: str = "default",
                     analyst: str | None = None) -> int:
        """How many more releases of exactly ``mechanism`` fit now (``sys.maxsize`` when no
        limit applies). O(log n): each rule solves for n on its O(1) state, in closed form.

        A plan, not a reservation: another caller may spend in between; ``release`` is
        authoritative. Debits nothing.

        Raises:
            MechanismNotAllowedError: the dataset's rule does not admit this mechanism at all
                (e.g. Laplace under ``"gaussian"``, or a costlier one under ``"optimal"``).
            InvalidArgumentError, InvalidTypeError, UnknownDatasetError: as for ``release``.

        >>> from mechanisms import Laplace
        >>> Accountant(Budget(1.0, 1e-6), composition="advanced").max_releases(Laplace(0.01))
        487
        """
        self._validated(mechanism, dataset, analyst, None)
        return min(rule.max_steps(self._state(key, rule), mechanism.charge)
                   for key, rule in self._targets(dataset, analyst))

    def release_many(self, items: Iterable[tuple[Mechanism, Any]], *, dataset: str = "default",
                     analyst: str | None = None, label: str | None = None) -> list[Any]:
        """Release a batch fixed in advance as one step: one debit, all or nothing.

        Every item is validated before anything is debited; the batch is debited once, through
        the same path as ``release``; noise is drawn only after that commit, item by item, in order.
        Because the list is fixed before any of it is released, the batch may be composed with a
        non-adaptive theorem. Each rule composes it as tightly as it can (see the rule's docs):
        ``"basic"`` charges its basic total when that fits, else the smallest of its
        Kairouz–Oh–Viswanath 2015 bound (Thm 3.3 if all items cost the same, else Thm 3.5) and
        the CKS conversion of its summed zCDP cost, at the δ still left;
        ``"advanced"`` sums the items' zCDP costs (exact zCDP composition, which dominates charging
        a KOV (ε, δ) point as an approximate step); ``"gaussian"`` sums the items' μ² (exact GDP
        composition; every item must be Gaussian-family); ``"optimal"`` charges k fixed-cost
        releases for k items.

        Args:
            items: a non-empty sequence of ``(mechanism, value)`` pairs.

        Returns:
            The noisy answers, in the order of ``items``.

        Raises:
            BudgetExceededError: the batch does not fit; nothing was drawn or debited.
            MechanismNotAllowedError: an item the dataset's rule does not admit.
            InvalidArgumentError, InvalidTypeError: a malformed batch or item.

        >>> from mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0, 1e-6), rng=0)
        >>> answers = acc.release_many([(Laplace(0.01), 1.0)] * 300)
        >>> len(answers), acc.spent().delta
        (300, 1e-06)
        """
        return self._release_many(items, dataset, analyst, label, None, {})

    def _release_many(self, items: Any, dataset: Any, analyst: str | None, label: str | None,
                      targets: list[tuple[str, CompositionRule]] | None,
                      members: dict[str, str]) -> list[Any]:
        """``release_many`` charged to ``targets`` (default: the dataset's accounts), with extra
        record ``members`` (a pipeline's id)."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise InvalidTypeError("items", items, "a sequence of (mechanism, value) pairs")
        pairs = tuple(items)
        if not pairs:
            raise InvalidArgumentError("items", items, "a non-empty sequence of (mechanism, "
                                       "value) pairs")
        prepared = []
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidTypeError(f"items[{i}]", pair, "a (mechanism, value) pair")
            prepared.append(self._validated(pair[0], dataset, analyst, label, pair[1]))
        mechanisms = tuple(pair[0] for pair in pairs)
        receipt = self._debit(_Batch(mechanisms), dataset, analyst, label,  # type: ignore[arg-type]
                              targets, lambda seq: members)
        self._local.receipt = receipt
        return [m._release(v, self._sampler) for m, v in zip(mechanisms, prepared)]


    # -- sparse-vector sessions ------------------------------------------------------------------

    def session(self, mechanism: StreamMechanism, *, dataset: str = "default",
                analyst: str | None = None, label: str | None = None) -> Session:
        """Debit a sparse-vector mechanism's whole fixed cost now, once, and open its session.

        The session then answers queries with no further debit (THEORY.md §2, "Sparse vector's
        fixed cost": the session is one step whose cost is declared and debited when it opens).
        The debit is one ledger record of kind ``"session"``; closing the session (leaving the
        ``with`` block, or ``close()``) writes a zero-cost ``"session-close"`` record with the
        number of queries answered and of ⊤ answers. A session never closed keeps its cost.
        Other releases may interleave with an open session: filters stay valid for such
        concurrent interactive steps (Haney et al., CCS 2023, "Concurrent Composition for
        Interactive Differential Privacy with Adaptive Privacy-Loss Parameters").

        Returns:
            A ``Session`` (``test(value) -> bool``), or a ``NumericSession`` (also
            ``query(value) -> float | None``) for ``NumericSparse``.

        Raises:
            BudgetExceededError: the cost does not fit; nothing was drawn or debited.
            InvalidArgumentError, InvalidTypeError: not a sparse-vector mechanism, or a bad
                dataset, analyst or label; nothing was drawn or debited.
            UnknownDatasetError: no limit is declared for ``dataset``.
        """
        return self._session(mechanism, dataset, analyst, label, None, {})

    def _session(self, mechanism: StreamMechanism, dataset: Any, analyst: str | None,
                 label: str | None, targets: list[tuple[str, CompositionRule]] | None,
                 members: dict[str, str]) -> Session:
        """``session`` charged to ``targets`` (default: the dataset's accounts), with extra
        record ``members`` (a pipeline's id)."""
        if not isinstance(mechanism, StreamMechanism):
            raise InvalidTypeError("mechanism", mechanism, "a sparse-vector mechanism "
                                   "(AboveThreshold, Sparse or NumericSparse)")
        self._validated(mechanism, dataset, analyst, label)
        opened = {"kind": '"session"', **members}
        fields = self._debit(mechanism, dataset, analyst, label, targets, lambda seq: opened)
        self._local.receipt = fields
        receipt = Receipt(*fields)
        stream = mechanism._open(self._sampler)
        cls = NumericSession if mechanism.releases_values else Session
        return cls(lambda s: self._close_session(s, mechanism, members), stream, receipt)

    def _close_session(self, session: Session, mechanism: Mechanism,
                       members: dict[str, str]) -> None:
        """Append the zero-cost record of a session's answer counts; no account changes."""
        r = session.receipt
        fields = _record(mechanism, r.dataset, r.analyst, r.label, [])
        fields.update(members)
        fields.update(kind='"session-close"', cost=_ZERO_COST, session=str(r.seq),
                      answered=str(session.answered), positives=str(session.positives))
        with self._ledger.transaction() as tx:
            tx.append(fields, [])


_PLAN_CACHE = 4096


class _Batch:
    """A batch of mechanisms fixed in advance, presented to ``_debit`` as one step: the same
    ``name``/``params()``/``cost``/``charge`` surface as a ``Mechanism``; ``charge.parts`` carries
    the items' charges for the composition rule, and ``cost`` is their basic total."""

    name = "batch"

    def __init__(self, mechanisms: tuple[Mechanism, ...]) -> None:
        self.mechanisms = mechanisms
        parts = tuple(m.charge for m in mechanisms)
        eps = dlt = 0.0
        for p in parts:
            eps, dlt = _numeric.add_up(eps, p.epsilon), _numeric.add_up(dlt, p.delta)
        rhos = [p.rho for p in parts]
        mus = [p.mu for p in parts]
        self.cost = Budget(eps, clip_delta(dlt))
        self.charge = Charge(
            eps, dlt, None if None in rhos else math.nextafter(math.fsum(rhos), math.inf),
            None if None in mus else _numeric.div_up(math.sqrt(math.fsum(m * m for m in mus)), 1.0),
            f"a batch of {len(parts)}", parts)

    def params(self) -> dict[str, Any]:
        return {"items": [{"name": m.name, "params": m.params()} for m in self.mechanisms]}

    @property
    def ledger_fragments(self) -> dict[str, str]:
        return step_fragments(self.name, self.params(), self.charge.as_record())


_ZERO_COST = canonical({"epsilon": 0.0, "delta": 0.0, "rho": None, "mu": None})


class _Plan:
    """What a release on (dataset(s), analyst) is charged to and checked against (cached)."""

    __slots__ = ("specs", "targets", "windowed", "checks")

    def __init__(self, specs: list[AccountSpec], checks: list[tuple[str, DatasetLimit]]) -> None:
        self.specs = specs
        self.targets = [(spec.key, spec.rule) for spec in specs]
        self.windowed = any(spec.period is not None for spec in specs)
        self.checks = checks

    def at(self, now: float) -> list[tuple[str, CompositionRule]]:
        """The targets with each windowed account's key for the window containing ``now``."""
        return [(spec.key_at(now), spec.rule) for spec in self.specs]


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


def _dataset_of(key: str, dataset: Any) -> str:
    """The dataset a refusal is reported on: the one asked for, or for a join the one whose
    account refused (the first named, if a global or analyst limit refused)."""
    if isinstance(dataset, str):
        return dataset
    for name in dataset:
        if key == dataset_key(name) or key.startswith((dataset_key(name) + "/",
                                                       dataset_key(name) + "@")):
            return name
    return dataset[0]


def _record(mechanism: Mechanism, dataset: Any, analyst: str | None, label: str | None,
            accounts: list[tuple[CompositionRule, Account]]) -> dict[str, str]:
    """A release record's members as canonical JSON (ledger/record.py documents the format).
    A join names its first dataset in ``dataset`` and all of them in ``datasets``."""
    fields = {
        "kind": '"release"', "analyst": canonical(analyst),
        "label": canonical(label), **mechanism.ledger_fragments,
        "accounts": assemble({a.key: rule.account_text(a.state) for rule, a in accounts}),
    }
    if isinstance(dataset, str):
        fields["dataset"] = canonical(dataset)
    else:
        fields["dataset"] = canonical(dataset[0])
        fields["datasets"] = canonical(list(dataset))
    return fields


def _optional_budget(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Budget):
        raise InvalidTypeError(name, value, "a Budget or None")


def _dataset_limits(limits: Any, composition: str,
                    per_query: Budget | None) -> dict[str, DatasetLimit]:
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise InvalidTypeError("limits", limits, "a mapping of dataset names to limits")
    out: dict[str, DatasetLimit] = {}
    for name, value in limits.items():
        _validate.text("limits key", name)
        if isinstance(value, DatasetLimit):
            out[name] = value
        elif value is None or isinstance(value, Budget):
            out[name] = DatasetLimit(limit=value, composition=composition, per_query=per_query)
        else:
            raise InvalidTypeError(f"limits[{name!r}]", value, "a Budget, a DatasetLimit or None")
    return out
