"""Pipelines: child budgets for a piece of analysis that makes several releases.

``acc.pipeline(name, dataset=..., budget=Budget(ε_c, δ_c))`` (a context manager) or the decorator
``@acc.budgeted(...)``; ``p.pipeline(...)`` nests.

Semantics, and why they are valid when every step is chosen adaptively (THEORY.md §1–2):

1. **Opening debits the whole allocation from the parent, as one step of cost (ε_c, δ_c).** Every
   account a release there would be charged to (the dataset's, the analyst's, the global one...;
   for a nested pipeline, the parent pipeline's account) is debited with the charge (ε_c, δ_c) in
   one ledger transaction (a record of kind ``"pipeline"``), all or none. This is valid under full
   adaptivity because the child's own filter guarantees that the child's *whole interaction* is
   (ε_c, δ_c)-DP, whatever it releases, and the parent's step cost (ε_c, δ_c) is fixed before the
   child runs — exactly what a filter needs of each step (Rogers–Roth–Ullman–Vadhan 2016, "Privacy
   Odometers and Filters": a step's parameters may depend on the past, not on its own outcome).
   The parent's rule composes that step like any other (ε_c, δ_c) step.
   An analyst may keep releasing on the parent while the pipeline is open, interleaving the
   two interactions; filters stay valid when such interactive steps run concurrently (Haney et
   al., CCS 2023, "Concurrent Composition for Interactive Differential Privacy with Adaptive
   Privacy-Loss Parameters"). Under an ``"advanced"`` parent an allocation with δ_c > 0 is an
   approximate-DP step and needs the rule's δ allowance (``conversion_share`` < 1); under
   ``"gaussian"`` it is refused (it has no μ).
2. **Releases inside are checked and debited against the pipeline's own account only**
   (``pipeline:<name>#<seq>``, whose limit is (ε_c, δ_c) under the pipeline's rule), through the
   same debit path as ``Accountant.release``, so the child's spend can never exceed its
   allocation. The policy's stateless checks of the dataset(s) (allowed mechanisms, per-query cap)
   still apply to each release. Each record names its pipeline (a ``pipeline`` member).
3. **Unused allocation is not refunded.** A filter's guarantee is its limit, not its realised
   spend: what the child *could* have spent, having seen the data, is what the parent must pay
   for. Closing a pipeline (leaving the ``with`` block) only stops it accepting releases.
4. **An allocation that does not fit in the parent is refused when the pipeline opens**
   (``BudgetExceededError``), and nothing is debited.

A pipeline opened in a renewal window keeps its allocation after the window ends (the window paid
for it). The pipeline's id is ``<name>#<seq>``, ``seq`` being its opening record's sequence number,
so the same name can be opened many times (each time a new allocation).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accountant import _validate
from accountant.budget import Budget
from accountant.composition import Charge, CompositionRule, Refused, make_rule
from accountant.errors import InvalidArgumentError, InvalidTypeError
from accountant.ledger.record import canonical
from mechanisms.base import Mechanism, StreamMechanism
from policies.accounts import pipeline_key
from policies.limits import valid_name

if TYPE_CHECKING:
    from accountant.core import Accountant
    from accountant.session import Session

__all__ = ["Pipeline"]


class Pipeline:
    """An open child budget. Made by ``Accountant.pipeline`` or ``Pipeline.pipeline``.

    Attributes:
        id: ``<name>#<seq>``; its account is ``pipeline:<id>``.
        name, budget, dataset, analyst: as opened.
        parent: the enclosing pipeline, or None.
    """

    def __init__(self, accountant: "Accountant", parent: "Pipeline | None", name: str,
                 pipeline_id: str, rule: CompositionRule, dataset: Any, analyst: str | None,
                 budget: Budget) -> None:
        self._acc = accountant
        self.parent = parent
        self.name = name
        self.id = pipeline_id
        self.key = pipeline_key(pipeline_id)
        self.budget = budget
        self.dataset = dataset
        self.analyst = analyst
        self._rule = rule
        self._targets = [(self.key, rule)]
        self._open = True
        self._members = {"pipeline": canonical(pipeline_id)}

    # -- releasing ---------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, value: Any, *, label: str | None = None) -> Any:
        """Debit ``mechanism.cost`` from this pipeline's allocation, then return the noisy answer.

        Raises:
            BudgetExceededError: it does not fit in what is left of the allocation (account
                ``pipeline:<id>``); nothing was drawn or debited.
            MechanismNotAllowedError, InvalidArgumentError, InvalidTypeError: as for
                ``Accountant.release``, or the pipeline is closed.
        """
        self._require_open()
        acc = self._acc
        prepared = acc._validated(mechanism, self.dataset, self.analyst, label, value)
        members = self._members
        acc._local.receipt = acc._debit(mechanism, self.dataset, self.analyst, label,
                                        self._targets, lambda seq: members)
        return mechanism._release(prepared, acc._sampler)

    def release_many(self, items: Any, *, label: str | None = None) -> list[Any]:
        """``Accountant.release_many`` inside this pipeline: the batch is one step against the
        pipeline's allocation, composed by the pipeline's rule."""
        self._require_open()
        return self._acc._release_many(items, self.dataset, self.analyst, label, self._targets,
                                       self._members)

    def session(self, mechanism: StreamMechanism, *, label: str | None = None) -> Session:
        """``Accountant.session`` inside this pipeline: its fixed cost is debited once from the
        pipeline's allocation when it opens."""
        self._require_open()
        return self._acc._session(mechanism, self.dataset, self.analyst, label, self._targets,
                                  self._members)

    def can_afford(self, mechanism: Mechanism) -> bool:
        """Whether ``release(mechanism, ...)`` would be admitted now. Debits nothing."""
        self._require_open()
        self._acc._validated(mechanism, self.dataset, self.analyst, None)
        try:
            self._rule.debit(self._state(), mechanism.charge)
        except Refused:
            return False
        return True

    def pipeline(self, name: str, *, budget: Budget, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None) -> "Pipeline":
        """Open a nested pipeline: its allocation is one step in this one's account."""
        self._require_open()
        return open_pipeline(self._acc, self, name, self.dataset, self.analyst, budget,
                             composition, per_query, label)

    def budgeted(self, name: str, *, budget: Budget, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None) -> Callable:
        """Decorator: each call runs in a new nested pipeline, passed as the first argument."""
        return budgeted(self._acc, self, name, self.dataset, self.analyst, budget, composition,
                        per_query, label)

    # -- reading -----------------------------------------------------------------------------

    def spent(self) -> Budget:
        """What the releases in this pipeline have spent of its allocation (rounded up)."""
        return self._rule.spent(self._state())

    def remaining(self) -> Budget:
        """What is left of the allocation (rounded down)."""
        return self._rule.remaining(self._state())

    @property
    def closed(self) -> bool:
        return not self._open

    def close(self) -> None:
        """Stop accepting releases. Nothing is refunded (see the module docstring)."""
        self._open = False

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Pipeline({self.id!r}, budget={self.budget!r}, dataset={self.dataset!r})"

    def _state(self) -> dict[str, float]:
        return self._acc._state(self.key, self._rule)

    def _require_open(self) -> None:
        if not self._open:
            raise InvalidArgumentError("pipeline", self.id, "open (a closed pipeline accepts no "
                                       "more releases; open a new one)")


class _Allocation:
    """A pipeline's allocation presented to ``Accountant._debit`` as one step: the surface of a
    ``Mechanism`` (``name``, ``cost``, ``charge``, ``ledger_fragments``) without noise."""

    name = "Pipeline"

    def __init__(self, budget: Budget, rule: CompositionRule) -> None:
        self.cost = budget
        self.charge = Charge(budget.epsilon, budget.delta, None, None, "a pipeline's allocation")
        self.ledger_fragments = {
            "cost": canonical({"epsilon": budget.epsilon, "delta": budget.delta, "rho": None,
                               "mu": None}),
            "rule": canonical(rule.describe()),
        }


def _checked(name: Any, budget: Any, composition: Any, per_query: Any) -> CompositionRule:
    """The child's rule, after checking the arguments (before anything is debited)."""
    valid_name(_validate.text("name", name))  # the same syntax as policy names: it becomes a key
    if not isinstance(budget, Budget):
        raise InvalidTypeError("budget", budget, "a Budget")
    if budget.is_unlimited:
        raise InvalidArgumentError("budget", budget, "a finite allocation (a pipeline's whole "
                                   "budget is charged to its parent when it opens)")
    if per_query is not None and not isinstance(per_query, Budget):
        raise InvalidTypeError("per_query", per_query, "a Budget or None")
    return make_rule(composition, budget, per_query)


def open_pipeline(acc: "Accountant", parent: Pipeline | None, name: str, dataset: Any,
                  analyst: str | None, budget: Budget, composition: str,
                  per_query: Budget | None, label: str | None) -> Pipeline:
    """Debit the allocation from the parent's accounts (one step, one record) and open."""
    rule = _checked(name, budget, composition, per_query)
    allocation = _Allocation(budget, rule)
    _validate.text("label", label, optional=True)
    acc._plan(dataset, analyst)  # an unknown dataset or refused analyst: refused here
    targets = parent._targets if parent is not None else None
    opened: list[str] = []

    def members(seq: int) -> dict[str, str]:
        opened.append(f"{name}#{seq}")
        return {"kind": '"pipeline"', "pipeline": canonical(opened[0]),
                "parent": canonical(None if parent is None else parent.id)}

    acc._local.receipt = acc._debit(allocation, dataset, analyst, label,  # type: ignore[arg-type]
                                    targets, members)
    return Pipeline(acc, parent, name, opened[0], rule, dataset, analyst, budget)


def budgeted(acc: "Accountant", parent: Pipeline | None, name: str, dataset: Any,
             analyst: str | None, budget: Budget, composition: str, per_query: Budget | None,
             label: str | None) -> Callable:
    """The decorator behind ``Accountant.budgeted`` and ``Pipeline.budgeted``."""
    _checked(name, budget, composition, per_query)

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            opener = acc if parent is None else parent
            kw = {} if parent is not None else {"dataset": dataset, "analyst": analyst}
            with opener.pipeline(name, budget=budget, composition=composition,
                                 per_query=per_query, label=label, **kw) as p:
                return fn(p, *args, **kwargs)
        return run
    return decorate

