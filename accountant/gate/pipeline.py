"""Pipelines: child budgets for a piece of analysis that makes several releases.

``acc.pipeline(name, dataset=..., budget=Budget(ε_c, δ_c))`` (a context manager) or the decorator
``@acc.budgeted(...)``; ``p.pipeline(...)`` nests.

Semantics, and why they are valid when every step is chosen adaptively (docs/theory.md §1–2):

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

A pipeline opened in a renewal window ends with that window (the window paid for it): after it,
every call raises ``WindowEndedError`` and nothing is drawn or debited, so nothing opened at
23:59:59 releases on the next day's budget; open a new pipeline, charged to the new window. Nested
pipelines and sessions opened in it end with it too. The pipeline's id is ``<name>#<seq>``, ``seq`` being its opening record's sequence number,
so the same name can be opened many times (each time a new allocation).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.composition import CompositionRule, make_rule
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidTypeError,
                                              UnitRequiredError, WindowEndedError)
from dpbudget.accountant.gate.gate import Gate, Step, Where
from dpbudget.accountant.ledger.record import RecordKind, canonical
from dpbudget.accountant.gate.planner import Plan, Target, pipeline_members
from dpbudget.accountant.gate.refusals import REFUSALS
from dpbudget.accountant.gate.session import Session
from dpbudget.accountant.gate.unnamed import NOT_GIVEN
from dpbudget.mechanisms.base import Mechanism, StreamMechanism
from dpbudget.policies.accounts import pipeline_key
from dpbudget.policies.limits import valid_name
from dpbudget.policies.units import RAW, unit_refusal

__all__ = ["Pipeline", "budgeted", "open_pipeline", "pipeline_rule"]


class Pipeline:
    """An open child budget. Made by ``Accountant.pipeline`` or ``Pipeline.pipeline``.

    It holds the gate and its own plan (its account, plus the datasets' stateless checks), and
    nothing of the ``Accountant`` that opened it.

    Attributes:
        id: ``<name>#<seq>``; its account is ``pipeline:<id>``.
        name, budget, dataset, analyst: as opened.
        parent: the enclosing pipeline, or None.
    """

    def __init__(self, gate: Gate, plan: Plan, parent: "Pipeline | None", name: str,
                 pipeline_id: str, budget: Budget, ends: float | None = None) -> None:
        self._gate = gate
        self._ends = ends  # the end of the renewal window that paid for it (None: none)
        self._plan = plan
        self._account = plan.targets[0]
        self.parent = parent
        self.name = name
        self.id = pipeline_id
        self.key = self._account.key
        self.budget = budget
        self.dataset = plan.dataset
        self.analyst = plan.analyst
        self._open = True

    # -- releasing ---------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, value: Any, *, dataset: Any = None,
                analyst: str | None = None, label: str | None = None) -> Any:
        """Debit ``mechanism.cost`` from this pipeline's allocation, then return the noisy answer.

        ``dataset`` and ``analyst`` are ``Accountant.release``'s keywords, so that code written
        for an accountant (``noisy_mean``, ``group_by``...) runs in a pipeline as it is; they
        may only be left out or name the pipeline's own (it cannot charge anyone else).

        Raises:
            BudgetExceededError: it does not fit in what is left of the allocation (account
                ``pipeline:<id>``); nothing was drawn or debited.
            MechanismNotAllowedError, InvalidArgumentError, InvalidTypeError: as for
                ``Accountant.release``, or the pipeline is closed, or ``dataset`` or ``analyst``
                names another than the pipeline's.
        """
        self._require_open(dataset, analyst)
        return self._gate.release(mechanism, value, label, self._plan)

    def release_many(self, items: Any, *, dataset: Any = None, analyst: str | None = None,
                     label: str | None = None) -> list[Any]:
        """``Accountant.release_many`` inside this pipeline: the batch is one step against the
        pipeline's allocation, composed by the pipeline's rule. ``dataset`` and ``analyst``: as
        for ``release``."""
        self._require_open(dataset, analyst)
        return self._gate.release_many(items, label, self._plan)

    def session(self, mechanism: StreamMechanism, *, dataset: Any = None,
                analyst: str | None = None, label: str | None = None) -> Session:
        """``Accountant.session`` inside this pipeline: its fixed cost is debited once from the
        pipeline's allocation when it opens. ``dataset`` and ``analyst``: as for ``release``."""
        self._require_open(dataset, analyst)
        return self._gate.open_session(mechanism, label, self._plan, self._ends)

    def can_afford(self, mechanism: Mechanism, *, dataset: Any = None,
                   analyst: str | None = None) -> bool:
        """Whether ``release(mechanism, ...)`` would be admitted now. Debits nothing."""
        self._require_open(dataset, analyst)
        return self._gate.afford(mechanism, self._plan)

    def pipeline(self, name: str, *, budget: Budget, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None) -> "Pipeline":
        """Open a nested pipeline: its allocation is one step in this one's account."""
        self._require_open()
        return open_pipeline(self._gate, self._plan, self, name, budget, composition, per_query,
                             label)

    def budgeted(self, name: str, *, budget: Budget, composition: str = "basic",
                 per_query: Budget | None = None, label: str | None = None) -> Callable[..., Any]:
        """Decorator: each call runs in a new nested pipeline, passed as the first argument."""
        pipeline_rule(name, budget, composition, per_query)
        return budgeted(lambda: self.pipeline(name, budget=budget, composition=composition,
                                              per_query=per_query, label=label))

    # -- reading -----------------------------------------------------------------------------

    def spent(self) -> Budget:
        """What the releases in this pipeline have spent of its allocation (rounded up)."""
        return self._gate.spent(self._account)

    def remaining(self) -> Budget:
        """What is left of the allocation (rounded down)."""
        return self._gate.remaining(self._account)

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

    def _require_open(self, dataset: Any = None, analyst: Any = None) -> None:
        if dataset is not None and dataset is not NOT_GIVEN:  # (left out: the pipeline's own)
            named = tuple(dataset) if type(dataset) is list else dataset  # a join, as a list
            names = (named,) if type(named) is str else named
            if type(names) is not tuple or not all(type(n) is str for n in names) \
                    or named != self.dataset:
                raise InvalidArgumentError(
                    "dataset", dataset, f"None or {self.dataset!r}, the pipeline's own",
                    "A pipeline's releases are charged to its allocation on the dataset it was "
                    "opened on; nothing was drawn or debited.")
        if analyst is not None and (type(analyst) is not str or analyst != self.analyst):
            raise InvalidArgumentError(
                "analyst", analyst, f"None or {self.analyst!r}, the pipeline's own",
                "A pipeline's releases are charged to the analyst it was opened by; nothing was "
                "drawn or debited.")
        if not self._open:
            raise InvalidArgumentError("pipeline", self.id, "open (a closed pipeline accepts no "
                                       "more releases; open a new one)")
        if self._ends is not None and self._gate.now() >= self._ends:
            raise WindowEndedError(
                f"pipeline {self.id!r} was opened in a renewal window that has ended; the window "
                "paid for it, so it releases nothing more (nothing was drawn or debited). Open "
                "a new pipeline, charged to the current window", self._ends)


def pipeline_rule(name: Any, budget: Any, composition: Any, per_query: Any) -> CompositionRule:
    """The child's rule, after checking a pipeline's arguments (before anything is debited)."""
    valid_name(str(_validate.text("name", name)))  # the same syntax as policy names: it becomes a key
    if not isinstance(budget, Budget):
        raise InvalidTypeError("budget", budget, "a Budget")
    if budget.is_unlimited:
        raise InvalidArgumentError("budget", budget, "a finite allocation (a pipeline's whole "
                                   "budget is charged to its parent when it opens)")
    if per_query is not None and not isinstance(per_query, Budget):
        raise InvalidTypeError("per_query", per_query, "a Budget or None")
    return make_rule(composition, budget, per_query)


def open_pipeline(gate: Gate, where: Where, parent: Pipeline | None, name: str,
                  budget: Budget, composition: str, per_query: Budget | None,
                  label: str | None) -> Pipeline:
    """Debit the allocation from the accounts ``where`` plans (one step, one record) and open
    the pipeline, whose own plan is charged to its new account only."""
    rule = pipeline_rule(name, budget, composition, per_query)
    _validate.text("label", label, optional=True)
    opened: list[str] = []

    def members(seq: int) -> dict[str, str]:
        # (Replaced, not appended: a debit redone on fresh reads gets a new seq.)
        opened[:] = [f"{name}#{seq}"]
        return {"pipeline": canonical(opened[0]),
                "parent": canonical(None if parent is None else parent.id)}

    try:
        parent_plan = gate.plan(where)  # an unknown dataset or refused analyst: refused here
        for dataset, limit in parent_plan.checks:  # (only raw values are released inside one:
            if (refused_unit := unit_refusal(dataset, limit, RAW, False)) is not None:
                raise UnitRequiredError(dataset, *refused_unit)  # its allocation would be lost)
        gate.debit(Step.allocation(budget, rule), parent_plan, label, kind=RecordKind.PIPELINE,
                   extra=members)
        ends = gate.window_end(parent_plan, None if parent is None else parent._ends)
    except REFUSALS as refusal:
        gate.refused(refusal, f"Pipeline {name}", budget, where, label)
        raise
    plan = parent_plan.child(Target.of(pipeline_key(opened[0]), rule),
                             pipeline_members(opened[0]))
    return Pipeline(gate, plan, parent, name, opened[0], budget, ends)


def budgeted(opener: Callable[[], Pipeline]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator behind ``Accountant.budgeted`` and ``Pipeline.budgeted``: each call of the
    decorated function runs in a new pipeline from ``opener``, passed as its first argument."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with opener() as p:
                return fn(p, *args, **kwargs)
        return run
    return decorate
