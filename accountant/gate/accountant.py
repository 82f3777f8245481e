"""The ``Accountant``: the public face of the gate every noisy answer passes through.

Invariant: the ``Accountant`` holds no logic of its own. It builds a ``Planner`` (which accounts a
request is charged to) and a ``Gate`` (the one check-and-debit path, ``dpbudget.accountant.gate.gate``) and
forwards every request to them; pipelines and sessions hold the same gate, never the
``Accountant``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.composition import make_rule
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.ledger import Ledger
from dpbudget.accountant.gate.opening import Opening
from dpbudget.accountant.gate.owner_key import OwnerKey
from dpbudget.accountant.gate.pipeline import Pipeline, budgeted, open_pipeline, pipeline_rule
from dpbudget.accountant.gate.planner import dataset_limits
from dpbudget.accountant.gate.receipt import Receipt
from dpbudget.accountant.gate.session import Session
from dpbudget.accountant.gate.unnamed import NOT_GIVEN
from dpbudget.mechanisms.base import Mechanism, StreamMechanism
from dpbudget.policies.blocks import rows_in_blocks
from dpbudget.policies.limits import DatasetLimit
from dpbudget.policies.policy import Policy

__all__ = ["Accountant"]


class Accountant(Opening):
    """Checks and debits privacy budgets before any noisy answer is released.

    Args:
        limit: the limit every dataset gets, each separately (each dataset is its own population);
            ``None`` (with no ``limits``) means no limit — spend is still recorded.
        limits: per-dataset limits, ``{"adult": Budget(...)}`` or ``{"adult": DatasetLimit(...)}``.
            A release on a dataset not listed is refused unless ``limit`` is also given.
        composition: the rule for ``limit`` and for plain ``Budget`` entries of ``limits``.
        per_query: a cap on any single release's cost, with ``limit``.
        order: the ``"renyi"`` rule's one Rényi order (from ``plan_order``); ``None``: each
            account's first step plans it.
        step: the ``"pld"`` rule's fixed step (q, z), every release's (``PLDComposition``).
        ledger: a ``Ledger``, a URL (``"sqlite:///budget.db"``, ``"memory://"``,
            ``"postgresql://..."``), a path, or ``None`` for an in-memory ledger.
        rng: ``None`` for the OS CSPRNG (the default), or a seeded ``numpy.random.Generator`` / int
            for tests and reproducible examples only: on a durable ledger only with
            ``simulation=True`` (anyone who knows a seed subtracts its noise).
        owner_key: the ledger owner's private key (its file, from ``dpbudget keys new``, or an
            ``OwnerKey``), for a new ledger: its first record pins the public key, and only that
            key can change the policy later (``apply_policy``). ``None``: the ledger's first
            policy is its policy for good (``dpbudget.accountant.gate.owner_key``).
        simulation: create the ledger as a simulation ledger — its first record says so, for
            good (``dpbudget status`` and the audit show it) — or open one: only such a durable
            ledger takes a seeded ``rng``. Refused on a ledger not created for simulation. An
            in-memory ledger takes seeds without it.

    Raises:
        InvalidArgumentError, InvalidTypeError: a malformed limit, rule name, ledger or rng; a
            seeded rng on a durable ledger without ``simulation=True`` (``rng``), or
            ``simulation=True`` on a ledger not created for simulation (``simulation``); nothing
            was written.
        LedgerConflictError: the ledger holds a dataset under a different composition rule.
        OwnerKeyError: ``owner_key`` cannot be read, or the ledger pins another key or none.

    ``Accountant.from_policy(path)`` builds one from a policy file instead (per-dataset,
    per-analyst, global limits, caps, allowed mechanisms); ``pipeline``/``budgeted`` open child
    budgets (``dpbudget.accountant.gate.pipeline``).

    >>> from dpbudget.mechanisms import Laplace
    >>> acc = Accountant(Budget(1.0), rng=0)
    >>> noisy = acc.release(Laplace(epsilon=0.25, sensitivity=1.0), 42.0, dataset="adult")
    >>> acc.spent("adult"), acc.remaining("adult")
    (Budget(epsilon=0.25, delta=0.0), Budget(epsilon=0.75, delta=0.0))
    >>> acc.can_afford(Laplace(epsilon=1.0, sensitivity=1.0), dataset="adult")
    False
    """

    def __init__(self, limit: Budget | None = None, *,
                 limits: Mapping[str, Budget | DatasetLimit | None] | None = None,
                 composition: str = "basic", per_query: Budget | None = None,
                 order: float | None = None, step: tuple[float, float] | None = None,
                 ledger: Ledger | str | None = None,
                 rng: Any = None, owner_key: OwnerKey | str | os.PathLike[str] | None = None,
                 simulation: bool = False) -> None:
        _optional_budget("limit", limit)
        _optional_budget("per_query", per_query)
        make_rule(composition, limit, per_query, order=order, step=step)  # before anything opens
        default: DatasetLimit | None = None
        if limits is None or limit is not None:
            default = DatasetLimit(limit=limit, composition=composition, per_query=per_query,
                                   order=order, step=step)
        # The same machinery as a policy file's, without a file (names are not restricted to
        # the policy file's syntax here).
        policy = Policy.model_construct(
            datasets=dataset_limits(limits, composition, per_query, order, step))
        self._setup(policy, default, ledger, rng, None, owner_key, simulation)

    # -- releasing ---------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, value: Any, *, dataset: Any = NOT_GIVEN,
                analyst: str | None = None, label: str | None = None,
                blocks: Any = None) -> Any:
        """Debit ``mechanism.cost`` from every limit that applies, then return the noisy answer.

        The limits: ``dataset``'s, and with a policy (``from_policy``) also the analyst's on it,
        the analyst's across datasets and the global one — all debited in one ledger
        transaction, or none. ``dataset`` may be a tuple (or list) of names: a release computed
        from several datasets (a join) is charged to each of them, all or none. Left out, it is
        ``"default"`` while this accountant knows no other dataset, and refused once it does (as
        for every method here; ``dpbudget.accountant.gate.unnamed``).

        Scalar in, scalar (``float``) out; array (or list) in, ``numpy`` array out.

        ``blocks``: for a dataset divided into blocks (``dpbudget.policies.blocks``), the blocks the data
        came from — a name, a list of names, or ``slice(first, last)`` of time blocks; each
        block's limit is charged too, in the same transaction. ``block_rows`` selects the rows.

        Raises:
            BudgetExceededError: the release does not fit in some limit (``account`` names it),
                or is above a per-query cap; nothing was drawn or debited.
            MechanismNotAllowedError: the policy does not allow this mechanism on the dataset.
            InvalidArgumentError, InvalidTypeError: a bad mechanism, value, dataset, analyst or
                label, or ``dataset`` left out where other datasets are known; nothing was drawn
                or debited.
            UnknownDatasetError: no limit is declared for ``dataset``.
            UnknownAnalystError: the policy denies this analyst (or ``None``) on the dataset.
        """
        return self._gate.release(mechanism, value, label, (dataset, analyst, blocks))

    def release_many(self, items: Iterable[tuple[Mechanism, Any]], *, dataset: Any = NOT_GIVEN,
                     analyst: str | None = None, label: str | None = None,
                     blocks: Any = None) -> list[Any]:
        """Release a batch fixed in advance as one step: one debit, all or nothing.

        Every item is validated before anything is debited; the batch is debited once, through
        the same path as ``release``; noise is drawn only after that commit, item by item, in order.
        Because each item's mechanism and cost are fixed before any of it is released (its input
        may be chosen adaptively), each rule may compose it with a theorem for fixed parameters,
        valid under adaptive composition (KOV 2015's k-fold adaptive theorem, zCDP's and GDP's
        composition) (``basic``: its total, else the tightest of Kairouz–Oh–Viswanath 2015
        Thm 3.3/3.5 and the CKS conversion of the summed zCDP cost; ``advanced``: summed zCDP;
        ``gaussian``: summed μ²; ``optimal``: k fixed-cost releases) — docs/theory.md §2, "Batches".

        Args:
            items: a non-empty sequence of ``(mechanism, value)`` pairs.

        Returns:
            The noisy answers, in the order of ``items``.

        Raises:
            BudgetExceededError: the batch does not fit; nothing was drawn or debited.
            MechanismNotAllowedError: an item the dataset's rule does not admit.
            InvalidArgumentError, InvalidTypeError: a malformed batch or item.

        >>> from dpbudget.mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0, 1e-6), rng=0)
        >>> answers = acc.release_many([(Laplace(0.01, sensitivity=1.0), 1.0)] * 300)
        >>> len(answers), acc.spent().delta
        (300, 1e-06)
        """
        return self._gate.release_many(items, label, (dataset, analyst, blocks))

    def session(self, mechanism: StreamMechanism, *, dataset: Any = NOT_GIVEN,
                analyst: str | None = None, label: str | None = None,
                blocks: Any = None) -> Session:
        """Debit a sparse-vector mechanism's whole fixed cost now, once, and open its session.

        The session then answers queries with no further debit: it is one step whose cost is
        declared and debited when it opens (docs/theory.md §2, "Sparse vector's fixed cost").
        Its records and why other releases may interleave with it: ``dpbudget.accountant.gate.session``.

        Returns:
            A ``Session`` (``test(value) -> bool``), or a ``NumericSession`` (also
            ``query(value) -> float | None``) for ``NumericSparse``.

        Raises:
            BudgetExceededError: the cost does not fit; nothing was drawn or debited.
            InvalidArgumentError, InvalidTypeError: not a sparse-vector mechanism, or a bad
                dataset, analyst or label; nothing was drawn or debited.
            UnknownDatasetError: no limit is declared for ``dataset``.
        """
        return self._gate.open_session(mechanism, label, (dataset, analyst, blocks))

    def pipeline(self, name: str, *, dataset: Any = NOT_GIVEN, budget: Budget,
                 analyst: str | None = None, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None,
                 blocks: Any = None) -> Pipeline:
        """Open a child budget of ``budget`` on ``dataset``: its whole allocation is debited
        now, as one step, from every limit a release there would be charged to; releases inside
        are then charged to the pipeline's own account only. See ``dpbudget.accountant.gate.pipeline``.

        Raises:
            BudgetExceededError: the allocation does not fit; nothing was debited.
            InvalidArgumentError, InvalidTypeError, UnknownDatasetError, UnknownAnalystError:
                as for ``release``, or a bad name, budget or rule.

        >>> from dpbudget.mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0), rng=0)
        >>> with acc.pipeline("report", dataset="adult", budget=Budget(0.5)) as p:
        ...     _ = p.release(Laplace(0.2, sensitivity=1.0), 3.0)
        ...     p.spent(), p.remaining()
        (Budget(epsilon=0.2, delta=0.0), Budget(epsilon=0.3, delta=0.0))
        >>> acc.spent("adult")  # the whole allocation, spent once and not refunded
        Budget(epsilon=0.5, delta=0.0)
        """
        return open_pipeline(self._gate, (dataset, analyst, blocks), None, name, budget,
                             composition, per_query, label)

    def budgeted(self, name: str, *, dataset: Any = NOT_GIVEN, budget: Budget,
                 analyst: str | None = None, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None,
                 blocks: Any = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: each call of the function runs in a new pipeline (as ``pipeline``), passed
        as its first argument. The arguments are checked when decorating.

        >>> from dpbudget.mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0), rng=0)
        >>> @acc.budgeted("twice", dataset="adult", budget=Budget(0.4))
        ... def twice(p, value):
        ...     return [p.release(Laplace(0.2, sensitivity=1.0), value) for _ in range(2)]
        >>> len(twice(5.0)), acc.spent("adult")
        (2, Budget(epsilon=0.4, delta=0.0))
        """
        pipeline_rule(name, budget, composition, per_query)
        return budgeted(lambda: self.pipeline(name, dataset=dataset, budget=budget,
                                              analyst=analyst, composition=composition,
                                              per_query=per_query, label=label,
                                              blocks=blocks))

    # -- planning and reading ------------------------------------------------------------------

    def can_afford(self, mechanism: Mechanism, *, dataset: Any = NOT_GIVEN,
                   analyst: str | None = None, blocks: Any = None) -> bool:
        """Whether ``release(mechanism, ...)`` would be admitted now. A dry run: debits nothing.

        Another caller may spend in between; only ``release`` is authoritative. A release above
        a policy's per-query cap is not affordable; a mechanism the policy does not allow at all
        raises ``MechanismNotAllowedError``, as ``release`` would.
        """
        return self._gate.afford(mechanism, (dataset, analyst, blocks))

    def max_releases(self, mechanism: Mechanism, *, dataset: Any = NOT_GIVEN,
                     analyst: str | None = None, blocks: Any = None) -> int:
        """How many more releases of exactly ``mechanism`` fit now (``sys.maxsize`` when no
        limit applies). O(log n): each rule solves for n on its O(1) state, in closed form.

        A plan, not a reservation: another caller may spend in between; ``release`` is
        authoritative. Debits nothing.

        Raises:
            MechanismNotAllowedError: the dataset's rule does not admit this mechanism at all
                (e.g. Laplace under ``"gaussian"``, or a costlier one under ``"optimal"``).
            InvalidArgumentError, InvalidTypeError, UnknownDatasetError: as for ``release``.

        >>> from dpbudget.mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0, 1e-6), composition="advanced")
        >>> acc.max_releases(Laplace(0.01, sensitivity=1.0))
        487
        """
        return self._gate.max_steps(mechanism, (dataset, analyst, blocks))

    @property
    def last_receipt(self) -> Receipt | None:
        """The receipt of this thread's last successful debit (seq, hash, cost, spent,
        remaining), or None."""
        return self._gate.last_receipt

    def spent(self, dataset: str = NOT_GIVEN, *, analyst: str | None = None,
              block: str | None = None) -> Budget:
        """How much of ``dataset``'s limit the releases so far have used, as (ε, δ) under its
        rule (rounded up; see ``CompositionRule.spent`` for what this does and does not
        guarantee); with ``analyst``, of that analyst's limit there; with ``block``, of that
        block's. For a windowed limit, in the current window."""
        return self._gate.spent(self._gate.planner.account(dataset, analyst, block))

    def remaining(self, dataset: str = NOT_GIVEN, *, analyst: str | None = None,
                  block: str | None = None) -> Budget:
        """What is left of ``dataset``'s limit (rounded down; ``Budget.unlimited()`` if none);
        with ``analyst``, of that analyst's limit on it; with ``block``, of that block's."""
        return self._gate.remaining(self._gate.planner.account(dataset, analyst, block))

    def block_rows(self, dataset: str, frame: Any, column: str, blocks: Any) -> Any:
        """The rows of ``frame`` (a pandas DataFrame) whose time ``column`` falls in ``blocks``
        of ``dataset`` — the blocks to pass to ``release`` with them, so that the data read
        and the blocks charged cannot drift apart (``dpbudget.policies.blocks.rows_in_blocks``)."""
        spec = self.limit(dataset).blocks
        if spec is None:
            raise InvalidArgumentError("dataset", dataset, "a dataset divided into blocks")
        return rows_in_blocks(frame, column, spec, blocks)

    def limit(self, dataset: str = NOT_GIVEN) -> DatasetLimit:
        """The limit declared for ``dataset``."""
        return self._gate.limit(dataset)

    def _repr_html_(self) -> str:
        """The status of every account of this accountant's ledger, as a notebook table."""
        from dpbudget.accountant.composition import rule_from_config
        from dpbudget.accountant.values._html import table

        rows = []
        for account in self.ledger.accounts():
            if not account.config.get("rule"):  # the pointer to the policy in force
                continue
            rule = rule_from_config(account.config)
            spent, left = rule.spent(account.state), rule.remaining(account.state)
            rows.append((account.key, rule.name, spent.epsilon, spent.delta, left.epsilon,
                         left.delta))
        return table(("account", "rule", "spent ε", "spent δ", "remaining ε", "remaining δ"),
                     rows, caption=f"ledger {self.ledger.url}")

    def close(self) -> None:
        self._gate.ledger.close()

    def __enter__(self) -> "Accountant":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _optional_budget(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Budget):
        raise InvalidTypeError(name, value, "a Budget or None")
