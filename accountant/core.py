"""The ``Accountant``: the public face of the gate every noisy answer passes through.

Invariant: the ``Accountant`` holds no logic of its own. It builds a ``Planner`` (which accounts a
request is charged to) and a ``Gate`` (the one check-and-debit path, ``accountant.gate``) and
forwards every request to them; pipelines and sessions hold the same gate, never the
``Accountant``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from accountant.budget import Budget
from accountant.composition import make_rule
from accountant.errors import InvalidTypeError
from accountant.continuity import refuse_raised
from accountant.gate import Gate
from accountant.ledger import Ledger, open_ledger
from accountant.pipeline import Pipeline, budgeted, open_pipeline, pipeline_rule
from accountant import policy_record
from accountant.planner import Planner, dataset_limits
from accountant.receipt import Receipt
from accountant.session import Session
from mechanisms.base import Mechanism, StreamMechanism
from mechanisms.sampling import Sampler
from policies.limits import DatasetLimit
from policies.policy import Policy, load_policy
from policies.stored import POLICY_KEY, document

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
        order: the ``"renyi"`` rule's one Rényi order (from ``plan_order``); ``None`` for its
            default orders.
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

    _gate: Gate
    _policy: Policy
    _default: DatasetLimit | None

    def __init__(self, limit: Budget | None = None, *,
                 limits: Mapping[str, Budget | DatasetLimit | None] | None = None,
                 composition: str = "basic", per_query: Budget | None = None,
                 order: float | None = None, ledger: Ledger | str | None = None,
                 rng: Any = None) -> None:
        _optional_budget("limit", limit)
        _optional_budget("per_query", per_query)
        make_rule(composition, limit, per_query, order=order)  # validated before anything opens
        default: DatasetLimit | None = None
        if limits is None or limit is not None:
            default = DatasetLimit(limit=limit, composition=composition, per_query=per_query,
                                   order=order)
        # The same machinery as a policy file's, without a file (names are not restricted to
        # the policy file's syntax here).
        policy = Policy.model_construct(
            datasets=dataset_limits(limits, composition, per_query, order))
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

        Who is held to which limit (analysts not listed, joins, windows) is documented in
        ``accountant.planner``, with what happens when a policy changes under an existing ledger.

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
        policy = path if isinstance(path, Policy) else load_policy(path)  # type: ignore[arg-type]
        acc = cls.__new__(cls)
        acc._setup(policy, None, ledger, rng, clock)
        return acc

    @classmethod
    def open(cls, ledger: Ledger | str, *, rng: Any = None,
             clock: Callable[[], float] | None = None) -> "Accountant":
        """An accountant enforcing the policy stored in ``ledger`` (the one its creator set, or
        the latest ``apply_policy``): no limits are passed, so none can be raised by opening.

        Raises:
            LedgerError: the ledger cannot be opened, or stores no policy (one created before
                policies were stored: open it once with its limits, which records them).
            LedgerCorruptedError: the stored policy was edited outside dpbudget.

        >>> import tempfile, pathlib
        >>> url = f"sqlite:///{pathlib.Path(tempfile.mkdtemp()) / 'b.db'}"
        >>> Accountant(Budget(2.0), ledger=url).close()
        >>> acc = Accountant.open(url)
        >>> acc.remaining("people")
        Budget(epsilon=2.0, delta=0.0)
        >>> acc.close()
        """
        policy, default = policy_record.stored_policy(ledger)
        acc = cls.__new__(cls)
        acc._setup(policy, default, ledger, rng, clock)
        return acc

    def apply_policy(self, policy: "str | os.PathLike[str] | Policy", *, by: str,
                     reason: str) -> policy_record.PolicyChange:
        """Replace the limits stored in this accountant's ledger with ``policy``'s (a policy file
        or ``Policy``), as one audited record naming ``by`` and ``reason``, and enforce them from
        now on. Lowering a limit always works; a change that grants more (``raised`` in the
        result is non-empty) weakens the guarantee and is recorded as such. Spend already
        recorded stays: a limit below it simply refuses every further release.

        Raises:
            PolicyError: a malformed policy file; nothing was written.
            LedgerConflictError: the new policy gives an account another composition rule or
                renewal window than its recorded spend; nothing was written.
        """
        new = policy if isinstance(policy, Policy) else load_policy(policy)  # type: ignore[arg-type]
        gate = self._gate
        change = policy_record.replace(gate.ledger, new, by=by, reason=reason)
        self._policy, self._default = new, None
        self._gate = Gate(gate.ledger, Planner(new, None), gate.sampler, gate.clock)
        self._gate.policy_seq = change.seq
        return change

    def _setup(self, policy: Policy, default: DatasetLimit | None, ledger: Any, rng: Any,
               clock: Callable[[], float] | None) -> None:
        if clock is not None and not callable(clock):
            raise InvalidTypeError("clock", clock, "a callable returning seconds since the epoch")
        self._policy = policy
        planner = Planner(policy, default)
        sampler = Sampler(rng)
        opened = open_ledger(ledger)
        self._gate = Gate(opened, planner, sampler, clock or time.time)
        self._default = default
        try:
            self._gate.check_ledger()
            # An in-memory ledger cannot be reopened by anyone else: it records a policy only
            # when asked to (apply_policy), and is then held to it like any other.
            if opened.durable or opened.account(POLICY_KEY) is not None:
                self._gate.policy_seq = policy_record.enforce(
                    opened, document(policy, default), by=policy_record.actor(),
                    adopting=lambda: refuse_raised(opened, planner))
        except BaseException:
            if not isinstance(ledger, Ledger):  # ours to close; a caller's ledger stays open
                opened.close()
            raise

    @property
    def policy(self) -> Policy:
        """The policy enforced (for an accountant built from arguments: its dataset limits)."""
        return self._policy

    @property
    def ledger(self) -> Ledger:
        return self._gate.ledger

    # -- releasing ---------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, value: Any, *, dataset: Any = "default",
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
        return self._gate.release(mechanism, value, label, (dataset, analyst))

    def release_many(self, items: Iterable[tuple[Mechanism, Any]], *, dataset: Any = "default",
                     analyst: str | None = None, label: str | None = None) -> list[Any]:
        """Release a batch fixed in advance as one step: one debit, all or nothing.

        Every item is validated before anything is debited; the batch is debited once, through
        the same path as ``release``; noise is drawn only after that commit, item by item, in order.
        Because the list is fixed before any of it is released, each rule may compose it with a
        non-adaptive theorem (``basic``: its total, else the tightest of Kairouz–Oh–Viswanath 2015
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

        >>> from mechanisms import Laplace
        >>> acc = Accountant(Budget(1.0, 1e-6), rng=0)
        >>> answers = acc.release_many([(Laplace(0.01), 1.0)] * 300)
        >>> len(answers), acc.spent().delta
        (300, 1e-06)
        """
        return self._gate.release_many(items, label, (dataset, analyst))

    def session(self, mechanism: StreamMechanism, *, dataset: Any = "default",
                analyst: str | None = None, label: str | None = None) -> Session:
        """Debit a sparse-vector mechanism's whole fixed cost now, once, and open its session.

        The session then answers queries with no further debit: it is one step whose cost is
        declared and debited when it opens (docs/theory.md §2, "Sparse vector's fixed cost").
        Its records and why other releases may interleave with it: ``accountant.session``.

        Returns:
            A ``Session`` (``test(value) -> bool``), or a ``NumericSession`` (also
            ``query(value) -> float | None``) for ``NumericSparse``.

        Raises:
            BudgetExceededError: the cost does not fit; nothing was drawn or debited.
            InvalidArgumentError, InvalidTypeError: not a sparse-vector mechanism, or a bad
                dataset, analyst or label; nothing was drawn or debited.
            UnknownDatasetError: no limit is declared for ``dataset``.
        """
        return self._gate.open_session(mechanism, label, (dataset, analyst))

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
        return open_pipeline(self._gate, (dataset, analyst), None, name, budget, composition,
                             per_query, label)

    def budgeted(self, name: str, *, dataset: Any = "default", budget: Budget,
                 analyst: str | None = None, composition: str = "basic",
                 per_query: Budget | None = None,
                 label: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
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
        pipeline_rule(name, budget, composition, per_query)
        return budgeted(lambda: self.pipeline(name, dataset=dataset, budget=budget,
                                              analyst=analyst, composition=composition,
                                              per_query=per_query, label=label))

    # -- planning and reading ------------------------------------------------------------------

    def can_afford(self, mechanism: Mechanism, *, dataset: Any = "default",
                   analyst: str | None = None) -> bool:
        """Whether ``release(mechanism, ...)`` would be admitted now. A dry run: debits nothing.

        Another caller may spend in between; only ``release`` is authoritative. A release above
        a policy's per-query cap is not affordable; a mechanism the policy does not allow at all
        raises ``MechanismNotAllowedError``, as ``release`` would.
        """
        return self._gate.afford(mechanism, (dataset, analyst))

    def max_releases(self, mechanism: Mechanism, *, dataset: Any = "default",
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
        return self._gate.max_steps(mechanism, (dataset, analyst))

    @property
    def last_receipt(self) -> Receipt | None:
        """The receipt of this thread's last successful debit (seq, hash, cost, spent,
        remaining), or None."""
        return self._gate.last_receipt

    def spent(self, dataset: str = "default", *, analyst: str | None = None) -> Budget:
        """How much of ``dataset``'s limit the releases so far have used, as (ε, δ) under its
        rule (rounded up; see ``CompositionRule.spent`` for what this does and does not
        guarantee); with ``analyst``, of that analyst's limit there. For a windowed limit, in the
        current window."""
        return self._gate.spent(self._gate.planner.account(dataset, analyst))

    def remaining(self, dataset: str = "default", *, analyst: str | None = None) -> Budget:
        """What is left of ``dataset``'s limit (rounded down; ``Budget.unlimited()`` if none);
        with ``analyst``, of that analyst's limit on it."""
        return self._gate.remaining(self._gate.planner.account(dataset, analyst))

    def limit(self, dataset: str = "default") -> DatasetLimit:
        """The limit declared for ``dataset``."""
        return self._gate.limit(dataset)

    def close(self) -> None:
        self._gate.ledger.close()

    def __enter__(self) -> "Accountant":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _optional_budget(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Budget):
        raise InvalidTypeError(name, value, "a Budget or None")
