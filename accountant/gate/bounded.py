"""The gate's entry for table queries: sensitivities per privacy unit, one debit, then the data.

Invariant: a table query (``dpbudget.accountant.tables``) is released as ONE all-or-nothing step,
checked and debited before its data is looked at. Each mechanism's sensitivity was set by the table
layer from contribution bounds (``UnitBounds``) under the unit's neighbour relation (add or remove
all rows of one unit); the dataset(s) charged must declare exactly that unit (a query per row on a
dataset with a unit would spend the unit's budget at a row's price). Only after the debit commits
does ``compute(rng)`` run — the random contribution bounding and the aggregation — and then each
mechanism draws on its true value, as ``Gate.release_many`` does. The record carries ``unit`` and
``bounds`` (``unit_members``), which the audit checks against the
policy's unit.

The one in-library caller is the table layer, which reaches the gate as ``accountant._gate``. No
public ``Accountant`` method takes a ``compute`` callable: its caller could claim any unit and any
bounds for a computation it writes itself, which is what a raw-value release already is
(``Accountant.release``, refused on a dataset with a unit unless its policy allows raw values).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any, NamedTuple

import numpy as np

from dpbudget.accountant.gate.gate import Gate, Where
from dpbudget.accountant.gate.refusals import REFUSALS
from dpbudget.accountant.gate.step import Step
from dpbudget.accountant.ledger.record import canonical
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataError,
                                               InvalidTypeError, PrivacyError,
                                               UnitRequiredError)
from dpbudget.mechanisms.base import Mechanism, StreamMechanism
from dpbudget.mechanisms.partition_selection import PartitionSelection
from dpbudget.mechanisms.sampling import OneShotSampler
from dpbudget.mechanisms.sensitivity import priced, unstated_sensitivity
from dpbudget.policies.units import BOUNDS, bounds_problem, unit_refusal

__all__ = ["UnitBounds", "release_bounded", "unit_members"]

# Words of the accountant's source that seed the generator ``compute`` is handed (256 bits).
_SEED_WORDS = 4


class UnitBounds(NamedTuple):
    """What a table query's sensitivities are per, and the bounds they were derived from.

    Attributes:
        unit: the privacy-unit column the sensitivities are per; None: per row.
        bounds: the bounds by name, e.g. ``{"max_rows_per_unit": 20, "max_groups_per_unit": 3,
            "lower": 0.0, "upper": 1000.0}`` (finite numbers; written to the record).
    """

    unit: str | None
    bounds: Mapping[str, float]


def release_bounded(gate: Gate, mechanisms: Sequence[Mechanism],
                    compute: Callable[[np.random.Generator], Sequence[Any]],
                    unit: UnitBounds, label: str | None, where: Where) -> list[Any]:
    """Validate, debit the batch once, then ``compute(rng)`` the true values, then draw.

    Args:
        gate: the accountant's gate (``accountant._gate``).
        mechanisms: one per answer, each with its sensitivity set from ``unit.bounds``.
        compute: called once, after the debit has committed, with a ``numpy.random.Generator``
            seeded from the accountant's source of noise (a fresh seed per call; reproducible
            under a seeded accountant): returns one true value per mechanism, in order (a list,
            or a numpy array whose rows are the values). A value may be a function of the
            noisy answers drawn before it (a tuple), called once they are: a later item chosen
            by the earlier ones' output — the sums on the keys a selection released — which
            adaptive composition prices at the same sum of costs; it returns the value, or
            None for nothing to draw (that answer is None). It is handed only what is
            differentially private, read-only (``_released``): each earlier answer as a copy,
            and of a ``PartitionSelection`` only the positions it released. What it returns
            may depend on the data, but its shape only on what it is handed: drawn on the
            released keys' values, never on the present keys' count.
        unit: the unit and bounds the sensitivities are per.
        label, where: as for ``Gate.release_many``.

    Returns:
        One noisy answer per mechanism.

    Raises:
        UnitRequiredError: a dataset charged declares another privacy unit than ``unit.unit``
            (or one, and ``unit.unit`` is None), or, in a join, declares none while ``unit.unit``
            is one (``unit_refusal``); logged as a refusal; nothing drawn, debited or computed.
        InvalidArgumentError: ``unit.bounds`` not as ``bounds_problem`` requires (empty with a
            unit, an unknown name, a count below 1, a clamp not finite), or a mechanism without
            its sensitivity stated; nothing drawn, debited or computed.
        BudgetExceededError, MechanismNotAllowedError, InvalidArgumentError, InvalidTypeError:
            as ``release_many``; nothing drawn, debited or computed.
        After the debit, which then STANDS (the budget pays for a step that may have looked
            at the data), nothing drawn or returned: a ``PrivacyError`` that ``compute``, a
            callable value or a mechanism's ``prepare`` raises propagates, noted "the debit
            stands"; any other error of theirs is replaced by an ``InvalidDataError`` naming
            only its type (an engine's message can quote cell values), as is a result that is
            not a sized iterable (a list, a numpy array) of one value per mechanism.
    """
    unit = _checked_unit(unit)
    if not callable(compute):
        raise InvalidTypeError("compute", compute, "a callable taking a numpy Generator")
    if isinstance(mechanisms, (str, bytes)) or not isinstance(mechanisms, Sequence):
        raise InvalidTypeError("mechanisms", mechanisms, "a sequence of mechanisms")
    items = tuple(mechanisms)
    if not items:
        raise InvalidArgumentError("mechanisms", "empty", "a non-empty sequence of mechanisms")
    for i, mechanism in enumerate(items):
        if Mechanism not in type(mechanism).__mro__ or isinstance(mechanism, StreamMechanism):
            raise InvalidTypeError(f"mechanisms[{i}]", mechanism, "a one-shot mechanism")
        if type(mechanism).query_norm is not None and \
                getattr(mechanism, "sensitivity", 0.0) is None:  # (``prepare`` would refuse it
            raise unstated_sensitivity(mechanism)                # only after the debit)
    step = Step.batch(items)
    members = unit_members(unit)
    try:
        plan = None
        for mechanism in items:  # (the policy's checks, the raw-value one aside)
            plan = gate.validate(priced(mechanism), label, where if plan is None else plan,
                                 raw=False)
        assert plan is not None  # items is non-empty
        # The unit rule (``unit_refusal``) on every dataset named: a join's without a unit too.
        names = (plan.dataset,) if isinstance(plan.dataset, str) else plan.dataset
        for name in names:
            refused = unit_refusal(name, gate.planner.limit(name), unit.unit, len(names) > 1)
            if refused is not None:
                raise UnitRequiredError(name, *refused)
        fields = gate.debit(step, plan, label, extra=lambda _: members)
    except REFUSALS as refusal:
        gate.refused(refusal, "batch", step.cost, where, label)
        raise
    gate._local.receipt = (*fields, unit.unit)  # (``last_receipt``: what its cost is per)
    stands = f"the debit stands (record {fields[0]}) and nothing was drawn"
    return gate.sampler.once(lambda _, s: _answers(items, compute, s, stands), None)


def unit_members(unit: UnitBounds) -> dict[str, str]:
    """A table query's record members (``dpbudget.accountant.ledger.record``): ``unit``, the
    privacy-unit column (null: per row), and ``bounds``, the bounds by name."""
    return {"unit": canonical(unit.unit), "bounds": canonical(dict(unit.bounds))}


def _answers(items: tuple[Mechanism, ...], compute: Callable[[np.random.Generator], Any],
             sampler: OneShotSampler, stands: str) -> list[Any]:
    """After the debit: the generator, the true values, each validated, then every draw.

    ``compute`` and each callable value run the user's frame engine, whose errors can quote
    cell values (pandas, DuckDB): the library's own errors (which name no data) pass, noted
    ``stands``; any other is replaced by an ``InvalidDataError`` naming its type only
    (``_guarded``)."""
    seed = [int(w) for w in sampler.bits.words(_SEED_WORDS)]

    def prepared() -> list[Any]:
        values = compute(np.random.default_rng(seed))
        if isinstance(values, (str, bytes)) or not isinstance(values, Sized) or \
                not isinstance(values, Iterable) or len(values) != len(items):
            raise InvalidDataError("compute", values, f"a sized iterable of {len(items)} "
                                   "values (one per mechanism)", f"; {stands}")
        return [v if callable(v) else m.prepare(v) for m, v in zip(items, values)]

    answers: list[Any] = []
    for m, v in zip(items, _guarded(prepared, stands)):
        if callable(v):  # (chosen by the answers before it: ``release_bounded``)
            seen = tuple(_released(earlier, a) for earlier, a in zip(items, answers))
            v = _guarded(functools.partial(_chosen, m, v, seen),
                         stands.replace("drawn", "released"))  # (earlier items drew)
            if v is None:
                answers.append(None)
                continue
        answers.append(m.draw(v, sampler))
    return answers


def _chosen(mechanism: Mechanism, value: Callable[[tuple[Any, ...]], Any],
            seen: tuple[Any, ...]) -> Any:
    """A callable value, called on what it may see of the answers before it, then prepared."""
    chosen = value(seen)
    return None if chosen is None else mechanism.prepare(chosen)


def _released(mechanism: Mechanism, answer: Any) -> Any:
    """What a later callable value is handed of an earlier ``answer``: a read-only copy (it
    cannot change the answer returned), and of a ``PartitionSelection``'s only the positions it
    released, in order — its vector's length and its zeros (keys present but not released) are
    not differentially private."""
    if isinstance(mechanism, PartitionSelection):
        answer = np.flatnonzero(answer)
    elif isinstance(answer, np.ndarray):
        answer = answer.copy()
    if isinstance(answer, np.ndarray):
        answer.setflags(write=False)
    return answer


def _guarded(step: Callable[[], Any], stands: str) -> Any:
    """``step()``, after the debit: a ``PrivacyError`` propagates, noted ``stands``; any other
    error is replaced by an ``InvalidDataError`` naming its type only, raised outside the
    handler so that neither its message nor its ``__context__`` travels."""
    try:
        return step()
    except PrivacyError as error:
        error.add_note(stands)
        raise
    except Exception as error:  # noqa: BLE001 (whatever the engine raises: named by type only)
        replaced = InvalidDataError("compute", error, "a callable that returns the true values",
                                    f" raised (its message withheld: it may quote data); "
                                    f"{stands}")
    raise replaced from None


def _checked_unit(unit: Any) -> UnitBounds:
    """``unit``, checked: a ``UnitBounds`` of a column name (or None) and bounds named and valued
    as ``dpbudget.policies.units.bounds_problem`` (and the audit) hold records to."""
    if not isinstance(unit, UnitBounds):
        raise InvalidTypeError("unit", unit, "a UnitBounds(unit, bounds)")
    if unit.unit is not None and (not isinstance(unit.unit, str) or not unit.unit):
        raise InvalidTypeError("unit.unit", unit.unit, "a column name (str) or None")
    if not isinstance(unit.bounds, Mapping):
        raise InvalidTypeError("unit.bounds", unit.bounds, "a mapping of bound names to numbers")
    problem = bounds_problem(unit.bounds, unit.unit)
    if problem is not None:
        raise InvalidArgumentError("unit.bounds", sorted(map(str, unit.bounds)),
                                   f"bounds named from {sorted(BOUNDS)}, each of its kind",
                                   f"{problem}; nothing was drawn and nothing was debited")
    return UnitBounds(unit.unit, dict(unit.bounds))
