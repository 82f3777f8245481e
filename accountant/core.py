"""The ``Accountant``: the one gate every noisy answer passes through.

Invariant (ARCHITECTURE.md, "the one rule"): validate everything → in one ledger transaction, read
each applicable limit's state, ask its composition rule whether the step fits, append the record and
the new states, commit → only then let the mechanism draw noise. A refusal or a bad argument leaves
the ledger and the random source exactly as they were. Every spending method goes through
``_debit``; nothing changes state before validation has finished.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
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
    UnknownDatasetError,
)
from accountant.ledger import Account, Ledger, open_ledger
from accountant.receipt import Receipt
from mechanisms.base import Mechanism
from mechanisms.sampling import Sampler
from policies.limits import DatasetLimit

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
        self._default: DatasetLimit | None = None
        if limits is None or limit is not None:
            self._default = DatasetLimit(limit=limit, composition=composition, per_query=per_query)
        self._limits = _dataset_limits(limits, composition)
        self._rules: dict[str, CompositionRule] = {}
        self._sampler = Sampler(rng)
        self._ledger = open_ledger(ledger)
        self._local = threading.local()
        for dataset in self._limits:
            self._check_rule(_key(dataset), self._rule(dataset), self._ledger.account(_key(dataset)))

    # -- releasing ---------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, value: Any, *, dataset: str = "default",
                analyst: str | None = None, label: str | None = None) -> Any:
        """Debit ``mechanism.cost`` from ``dataset``'s limit, then return the noisy answer.

        Scalar in, scalar (``float``) out; array (or list) in, ``numpy`` array out.

        Raises:
            BudgetExceededError: the release does not fit; nothing was drawn or debited.
            InvalidArgumentError, InvalidTypeError: a bad mechanism, value, dataset, analyst or
                label; nothing was drawn or debited.
            UnknownDatasetError: no limit is declared for ``dataset``.
        """
        prepared = self._validated(mechanism, dataset, analyst, label, value)
        receipt = self._debit(mechanism, dataset, analyst, label)
        self._local.receipt = receipt
        return mechanism._release(prepared, self._sampler)

    def can_afford(self, mechanism: Mechanism, *, dataset: str = "default",
                   analyst: str | None = None) -> bool:
        """Whether ``release(mechanism, ...)`` would be admitted now. A dry run: debits nothing.

        Another caller may spend in between; only ``release`` is authoritative.
        """
        self._validated(mechanism, dataset, analyst, None)
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
        return getattr(self._local, "receipt", None)

    # -- reading -----------------------------------------------------------------------------

    def spent(self, dataset: str = "default") -> Budget:
        """The (ε, δ) guarantee of everything released on ``dataset`` so far (rounded up)."""
        rule = self._rule(_validate.text("dataset", dataset))
        return rule.spent(self._state(_key(dataset), rule))

    def remaining(self, dataset: str = "default") -> Budget:
        """What is left of ``dataset``'s limit (rounded down; ``Budget.unlimited()`` if none)."""
        rule = self._rule(_validate.text("dataset", dataset))
        return rule.remaining(self._state(_key(dataset), rule))

    def limit(self, dataset: str = "default") -> DatasetLimit:
        """The limit declared for ``dataset``."""
        _validate.text("dataset", dataset)
        declared = self._limits.get(dataset, self._default)
        if declared is None:
            raise UnknownDatasetError(dataset, tuple(sorted(self._limits)))
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

    def _validated(self, mechanism: Mechanism, dataset: str, analyst: str | None,
                   label: str | None, *value: Any) -> Any:
        if not isinstance(mechanism, Mechanism):
            raise InvalidTypeError("mechanism", mechanism, "a dpbudget Mechanism")
        _validate.text("dataset", dataset)
        _validate.text("analyst", analyst, optional=True)
        _validate.text("label", label, optional=True)
        self._rule(dataset)  # an unknown dataset is refused before anything else happens
        return mechanism.prepare(value[0]) if value else None

    def _debit(self, mechanism: Mechanism, dataset: str, analyst: str | None,
               label: str | None) -> Receipt:
        charge = mechanism.charge
        targets = self._targets(dataset, analyst)
        with self._ledger.transaction() as tx:
            accounts = []
            for key, rule in targets:
                current = tx.account(key)
                self._check_rule(key, rule, current)
                state = rule.initial_state() if current is None else current.state
                try:
                    new_state = rule.debit(state, charge)
                except Refused as refusal:
                    raise BudgetExceededError(mechanism.cost, rule.remaining(state), dataset, key,
                                              refusal.reason) from None
                accounts.append(Account(key, rule.name, rule.describe(), new_state, 0))
            entry = tx.append(_record(mechanism, charge, dataset, analyst, label, accounts),
                              accounts)
        key, rule = targets[0]
        return Receipt(entry.seq, entry.hash, dataset, analyst, label, mechanism.name,
                       mechanism.cost, rule, accounts[0].state)

    def _targets(self, dataset: str, analyst: str | None) -> list[tuple[str, CompositionRule]]:
        """Every limit a release on ``dataset`` by ``analyst`` is charged to, dataset first."""
        return [(_key(dataset), self._rule(dataset))]

    def _rule(self, dataset: str) -> CompositionRule:
        rule = self._rules.get(dataset)
        if rule is None:
            rule = self.limit(dataset).rule()
            self._rules[dataset] = rule
        return rule

    def _state(self, key: str, rule: CompositionRule) -> dict[str, float]:
        current = self._ledger.account(key)
        self._check_rule(key, rule, current)
        return rule.initial_state() if current is None else current.state

    @staticmethod
    def _check_rule(key: str, rule: CompositionRule, current: Account | None) -> None:
        if current is not None and current.rule != rule.name:
            raise LedgerConflictError(
                f"{key} was started under the {current.rule!r} composition rule and this "
                f"accountant uses {rule.name!r}; a rule cannot change once releases are recorded")

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
        receipt = self._debit(_Batch(mechanisms), dataset, analyst, label)  # type: ignore[arg-type]
        self._local.receipt = receipt
        return [m._release(v, self._sampler) for m, v in zip(mechanisms, prepared)]


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


def _key(dataset: str) -> str:
    return f"dataset:{dataset}"


def _record(mechanism: Mechanism, charge: Charge, dataset: str, analyst: str | None,
            label: str | None, accounts: list[Account]) -> dict[str, Any]:
    return {
        "kind": "release", "dataset": dataset, "analyst": analyst, "label": label,
        "mechanism": {"name": mechanism.name, "params": mechanism.params()},
        "cost": {"epsilon": charge.epsilon, "delta": charge.delta, "rho": charge.rho,
                 "mu": charge.mu},
        "accounts": {a.key: {**a.config, "state": a.state} for a in accounts},
    }


def _optional_budget(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Budget):
        raise InvalidTypeError(name, value, "a Budget or None")


def _dataset_limits(limits: Any, composition: str) -> dict[str, DatasetLimit]:
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
            out[name] = DatasetLimit(limit=value, composition=composition)
        else:
            raise InvalidTypeError(f"limits[{name!r}]", value, "a Budget, a DatasetLimit or None")
    return out
