"""The query helpers run wherever a release does: on an ``Accountant``, inside a pipeline, and
inside a ``@acc.budgeted`` function (whose handle is a pipeline), through one protocol
(``dpbudget.mechanisms.noisy.Releaser``). Inside a pipeline they charge its allocation only, and a bad
argument debits nothing more: the allocation is spent once, when the pipeline opens (as
documented: unused allocation is not refunded), and nothing else.

The issue's figure: ``noisy_mean`` inside a pipeline raised ``TypeError`` from
``Pipeline.release_many`` after the allocation had been debited.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import dpbudget as dp
from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.gate.pipeline import Pipeline
from dpbudget.mechanisms.noisy import noisy_mean, noisy_quantiles

ALLOCATION = Budget(0.5)
AGES = [float(a) for a in range(20, 80)]
KEYS = ["a", "b"] * 30

# Each helper, run through a releaser at ε = 0.1 (on the pipeline's dataset when ``dataset``).
HELPERS: dict[str, Callable[..., Any]] = {
    "noisy_mean": lambda r, **kw: dp.noisy_mean(r, AGES, 0, 100, epsilon=0.1, **kw),
    "noisy_mean replace": lambda r, **kw: dp.noisy_mean(r, AGES, 0, 100, epsilon=0.1,
                                                        neighbouring="replace", **kw),
    "noisy_quantiles": lambda r, **kw: dp.noisy_quantiles(r, AGES, [0.25, 0.75], 0, 100,
                                                          epsilon=0.1, **kw),
    "group_by count": lambda r, **kw: dp.group_by(r, KEYS, ["a", "b"], epsilon=0.1, **kw),
    "group_by sum": lambda r, **kw: dp.group_by(r, KEYS, ["a", "b"], epsilon=0.1,
                                                statistic="sum", values=AGES, lower=0,
                                                upper=100, **kw),
    "group_by mean": lambda r, **kw: dp.group_by(r, KEYS, ["a", "b"], epsilon=0.1,
                                                 statistic="mean", values=AGES, lower=0,
                                                 upper=100, **kw),
}


def _fresh() -> Accountant:
    return Accountant(Budget(1.0), rng=0)


def _records(acc: Accountant) -> int:
    return acc.ledger.head()[0]


@pytest.mark.parametrize("name", list(HELPERS))
@pytest.mark.parametrize("named", [False, True], ids=["dataset left out", "dataset named"])
def test_a_helper_runs_inside_a_pipeline_and_charges_only_its_allocation(
        name: str, named: bool) -> None:
    acc = _fresh()
    with acc.pipeline("r", dataset="s", budget=ALLOCATION) as p:
        opened = _records(acc)
        HELPERS[name](p, **({"dataset": "s"} if named else {}))
        assert math.isclose(p.spent().epsilon, 0.1, rel_tol=1e-9)
        assert _records(acc) == opened + 1  # one debit, of the pipeline's account
    assert acc.spent("s") == ALLOCATION  # the parent paid the allocation, and only that


@pytest.mark.parametrize("name", list(HELPERS))
def test_a_helper_runs_inside_a_budgeted_function(name: str) -> None:
    acc = _fresh()
    handles: list[Pipeline] = []

    @acc.budgeted("report", dataset="s", budget=ALLOCATION)
    def report(p: Pipeline) -> Any:
        handles.append(p)
        return HELPERS[name](p)

    report()
    assert math.isclose(handles[0].spent().epsilon, 0.1, rel_tol=1e-9)
    assert acc.spent("s") == ALLOCATION


@pytest.mark.parametrize("name", list(HELPERS))
def test_a_helper_on_an_accountant_is_unchanged(name: str) -> None:
    acc = _fresh()
    HELPERS[name](acc)  # the accountant's default dataset, as before
    assert math.isclose(acc.spent().epsilon, 0.1, rel_tol=1e-9)


BAD: dict[str, Callable[[Any], Any]] = {
    "epsilon": lambda r: dp.noisy_mean(r, AGES, 0, 100, epsilon=-1.0),
    "nan in data": lambda r: dp.noisy_mean(r, [1.0, math.nan], 0, 100, epsilon=0.1),
    "bounds": lambda r: dp.noisy_quantiles(r, AGES, [0.5], 100, 0, epsilon=0.1),
    "quantile": lambda r: dp.noisy_quantiles(r, AGES, [0.5, 1.5], 0, 100, epsilon=0.1),
    "statistic": lambda r: dp.group_by(r, KEYS, ["a", "b"], epsilon=0.1, statistic="max"),
    "values": lambda r: dp.group_by(r, KEYS, ["a"], epsilon=0.1, statistic="sum",
                                    values=AGES[:3], lower=0, upper=1),
    "another dataset": lambda r: dp.noisy_mean(r, AGES, 0, 100, epsilon=0.1, dataset="t"),
    "another analyst": lambda r: dp.group_by(r, KEYS, ["a"], epsilon=0.1, analyst="eve"),
    "too costly": lambda r: dp.noisy_quantiles(r, AGES, [0.5], 0, 100, epsilon=0.6),
    "not a releaser": lambda r: dp.noisy_mean(dp.Budget(1.0), AGES, 0, 100, epsilon=0.1),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_a_bad_argument_inside_a_pipeline_debits_nothing_more(bad: str) -> None:
    acc = _fresh()
    with acc.pipeline("r", dataset="s", budget=ALLOCATION) as p:
        opened = _records(acc)
        with pytest.raises(dp.PrivacyError):
            BAD[bad](p)
        assert _records(acc) == opened  # not a record more
        assert p.spent() == Budget(0.0)
        dp.noisy_mean(p, AGES, 0, 100, epsilon=0.5)  # the whole allocation is still there
    assert acc.spent("s") == ALLOCATION and acc.spent("t") == Budget(0.0)


def test_a_pipeline_names_no_other_dataset_or_analyst() -> None:
    acc = _fresh()
    with acc.pipeline("r", dataset="s", analyst="ann", budget=ALLOCATION) as p:
        for kwargs in ({"dataset": "t"}, {"dataset": ["s", "t"]}, {"dataset": 3},
                       {"analyst": "eve"}, {"analyst": 3}):
            with pytest.raises(InvalidArgumentError):
                p.release(dp.Laplace(0.1, sensitivity=1.0), 1.0, **kwargs)
        assert p.spent() == Budget(0.0)
        p.release(dp.Laplace(0.1, sensitivity=1.0), 1.0, dataset="s", analyst="ann")  # its own: admitted
        dp.noisy_mean(p, AGES, 0, 100, epsilon=0.1, analyst="ann")
    assert acc.spent("s") == ALLOCATION and acc.spent("t") == Budget(0.0)


def test_a_join_pipeline_admits_its_join_named_as_a_list() -> None:
    acc = _fresh()
    with acc.pipeline("j", dataset=("s", "t"), budget=ALLOCATION) as p:
        p.release_many([(dp.Laplace(0.1, sensitivity=1.0), 1.0)], dataset=["s", "t"])
        assert math.isclose(p.spent().epsilon, 0.1, rel_tol=1e-9)


def test_negative_control_the_old_pipeline_signature_crashes_after_the_allocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's figure, re-created: ``Pipeline.release_many`` without ``dataset`` and
    ``analyst`` crashes the helper with ``TypeError`` once the allocation is spent."""
    def old(self: Pipeline, items: Any, *, label: str | None = None) -> list[Any]:
        return self._gate.release_many(items, label, self._plan)

    monkeypatch.setattr(Pipeline, "release_many", old)
    acc = _fresh()
    with acc.pipeline("r", dataset="s", budget=ALLOCATION) as p:
        with pytest.raises(TypeError):
            dp.noisy_mean(p, [1.0, 2.0], 0, 10, epsilon=0.1, dataset="s")
    assert acc.spent("s") == ALLOCATION  # spent, for no answer


def test_a_helper_given_no_releaser_is_a_typed_error() -> None:
    with pytest.raises(InvalidTypeError, match="'accountant' must be an Accountant or a Pipeline"):
        dp.group_by(object(), KEYS, ["a"], epsilon=0.1)


class _Recorder:
    """A releaser that records each call: how many debits a helper asks for, and where."""

    def __init__(self, release: bool = True) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        if not release:
            self.release = None  # type: ignore[assignment]

    def release(self, mechanism: Any, value: Any, **where: Any) -> float:
        self.calls.append(("release", where))
        return 50.0

    def release_many(self, items: Any, **where: Any) -> list[float]:
        self.calls.append(("release_many", where))
        return [50.0] * len(items)


def test_a_helper_makes_one_call_and_names_a_dataset_only_when_given() -> None:
    """``noisy_mean``/``noisy_quantiles`` (``mechanisms.noisy``): one call, so one debit; the
    ``dataset`` keyword only when the caller named one (an accountant then uses its default and a
    pipeline its own); something that cannot release is refused first, naming ``accountant``
    (the negative control: the same object with ``release`` is accepted)."""
    for helper in (lambda r, **kw: noisy_mean(r, AGES, 0, 100, epsilon=0.1, **kw),
                   lambda r, **kw: noisy_quantiles(r, AGES, [0.25, 0.75], 0, 100, epsilon=0.1,
                                                   **kw)):
        rec = _Recorder()
        helper(rec)
        assert len(rec.calls) == 1 and "dataset" not in rec.calls[0][1]
        rec = _Recorder()
        helper(rec, dataset="people")
        assert len(rec.calls) == 1 and rec.calls[0][1]["dataset"] == "people"
        crippled = _Recorder(release=False)
        with pytest.raises(InvalidTypeError, match="'accountant'"):
            helper(crippled)
        assert crippled.calls == []
