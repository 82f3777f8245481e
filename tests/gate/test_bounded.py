"""``release_bounded``: a table query's one gate entry (dpbudget.accountant.gate.bounded).

Each test is the attack or the promise: one debit for the batch, nothing computed or drawn when
refused, the unit and bounds in the record, a query per another unit refused, the bounding
generator seeded from the accountant's source.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.gate import bounded
from dpbudget.accountant.gate.bounded import UnitBounds, release_bounded
from dpbudget.accountant.gate.refusals import REFUSAL_LOGGER
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (BudgetExceededError, InvalidArgumentError,
                                               InvalidDataError, InvalidTypeError,
                                               UnitRequiredError)
from dpbudget.mechanisms import Laplace
from dpbudget.policies.limits import DatasetLimit

from tests.support import snapshot

BOUNDS = {"max_rows_per_unit": 20, "max_groups_per_unit": 3, "lower": 0.0, "upper": 1000.0}
PER_PERSON = UnitBounds("person_id", BOUNDS)


def _acc(unit: str | None = "person_id", eps: float = 1.0, rng: Any = 0) -> Accountant:
    return Accountant(limits={"events": DatasetLimit(limit=Budget(eps), privacy_unit=unit)},
                      rng=rng)


def _records(acc: Accountant) -> list[dict[str, Any]]:
    return [json.loads(e.text) for e in acc.ledger.entries()]


class _Compute:
    """A ``compute`` that records its calls and the generator it was handed."""

    def __init__(self, values: list[float]) -> None:
        self.values, self.calls, self.draws = values, 0, []

    def __call__(self, rng: np.random.Generator) -> list[float]:
        self.calls += 1
        self.draws.append(int(rng.integers(0, 2 ** 62)))
        return self.values


def _two(eps: float = 0.25) -> list[Laplace]:
    return [Laplace(epsilon=eps, sensitivity=20.0), Laplace(epsilon=eps, sensitivity=60.0)]


def test_one_debit_for_the_batch_then_compute_then_draw() -> None:
    acc = _acc()
    compute = _Compute([100.0, 5000.0])
    out = release_bounded(acc._gate, _two(), compute, PER_PERSON, "q1", ("events", None))
    assert compute.calls == 1 and len(out) == 2
    assert all(isinstance(x, float) for x in out)
    releases = [r for r in _records(acc) if r["kind"] == "release"]
    assert len(releases) == 1  # one record, one debit
    assert releases[0]["mechanism"]["name"] == "batch"
    assert acc.spent("events") == Budget(0.5)


def test_record_carries_unit_and_bounds() -> None:
    acc = _acc()
    release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), PER_PERSON, None, ("events", None))
    record = _records(acc)[-1]
    assert record["unit"] == "person_id"
    assert record["bounds"] == BOUNDS


def test_refused_batch_computes_draws_and_debits_nothing() -> None:
    acc = _acc(eps=0.4)  # 0.25 + 0.25 does not fit
    compute = _Compute([1.0, 2.0])
    before = snapshot(acc.ledger)
    with pytest.raises(BudgetExceededError):
        release_bounded(acc._gate, _two(), compute, PER_PERSON, None, ("events", None))
    assert compute.calls == 0
    assert snapshot(acc.ledger) == before
    # Nothing drawn: the next answer is a fresh seeded accountant's first one.
    one = [Laplace(epsilon=0.1, sensitivity=1.0)]
    fresh = _acc(eps=0.4)
    assert (release_bounded(acc._gate, one, _Compute([0.0]), PER_PERSON, None, ("events", None))
            == release_bounded(fresh._gate, one, _Compute([0.0]), PER_PERSON, None,
                               ("events", None)))


def test_negative_control_a_draw_before_refusal_is_seen() -> None:
    """The comparison above detects a single word taken from the source."""
    acc, fresh = _acc(), _acc()
    acc._gate.sampler.bits.word()
    one = [Laplace(epsilon=0.1, sensitivity=1.0)]
    assert (release_bounded(acc._gate, one, _Compute([0.0]), PER_PERSON, None, ("events", None))
            != release_bounded(fresh._gate, one, _Compute([0.0]), PER_PERSON, None,
                               ("events", None)))


@pytest.mark.parametrize("unit", [None, "user_id"])
def test_query_per_another_unit_is_refused(unit: str | None) -> None:
    acc = _acc()
    compute = _Compute([1.0, 2.0])
    before = snapshot(acc.ledger)
    with pytest.raises(UnitRequiredError, match="datasets.events.privacy_unit") as info:
        release_bounded(acc._gate, _two(), compute, UnitBounds(unit, BOUNDS), None,
                        ("events", None))
    assert info.value.dataset == "events" and "person_id" in str(info.value)
    assert compute.calls == 0 and snapshot(acc.ledger) == before


def test_query_per_another_unit_on_a_join_is_refused() -> None:
    acc = Accountant(limits={"a": DatasetLimit(limit=Budget(1.0), privacy_unit="person_id"),
                             "b": DatasetLimit(limit=Budget(1.0), privacy_unit="person_id")})
    with pytest.raises(UnitRequiredError, match="datasets.a.privacy_unit"):
        release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), UnitBounds("user_id", BOUNDS),
                        None, (("a", "b"), None))


def _join() -> Accountant:
    return Accountant(limits={"plain": DatasetLimit(limit=Budget(1.0)),
                              "events": DatasetLimit(limit=Budget(1.0), privacy_unit="person_id")})


def test_a_join_per_person_with_a_dataset_without_the_unit_is_refused() -> None:
    """Review finding 2, the attack: a per-person query over events joined with a table that
    declares no unit. A row of that table can reach many persons' joined rows, so a per-person
    Δ says nothing about it: refused, nothing computed, drawn or debited."""
    acc = _join()
    compute, before = _Compute([1.0, 2.0]), snapshot(acc.ledger)
    with pytest.raises(UnitRequiredError, match="datasets.plain declares no privacy_unit"):
        release_bounded(acc._gate, _two(), compute, PER_PERSON, None, (("plain", "events"), None))
    assert compute.calls == 0 and snapshot(acc.ledger) == before


def test_negative_control_the_old_join_rule_admitted_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old rule (refuse only a dataset whose declared unit differs) re-created: the same
    join is debited per person on a dataset whose limit is per row."""
    def old(dataset: str, limit: Any, unit: Any, joined: bool) -> Any:
        declared = limit.privacy_unit
        return None if declared is None or declared == unit else ("refused", "")

    monkeypatch.setattr(bounded, "unit_refusal", old)
    acc = _join()
    release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), PER_PERSON, None,
                    (("plain", "events"), None))
    assert acc.spent("plain") == Budget(0.5)


def test_a_join_per_row_on_datasets_without_units_stays_admitted() -> None:
    acc = Accountant(limits={"a": DatasetLimit(limit=Budget(1.0)),
                             "b": DatasetLimit(limit=Budget(1.0))})
    release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), UnitBounds(None, {}), None,
                    (("a", "b"), None))
    assert acc.spent("a") == acc.spent("b") == Budget(0.5)


def test_a_unit_refusal_is_logged_for_review(caplog: pytest.LogCaptureFixture) -> None:
    """Review finding 7: the table entry's unit refusals reach the security log too."""
    with caplog.at_level("WARNING", logger=REFUSAL_LOGGER):
        with pytest.raises(UnitRequiredError):
            release_bounded(_acc()._gate, _two(), _Compute([1.0, 2.0]),
                            UnitBounds("user_id", BOUNDS), "q", ("events", None))
    entries = [r.dpbudget_refusal for r in caplog.records if hasattr(r, "dpbudget_refusal")]
    assert [(e["reason"], e["dataset"], e["mechanism"]) for e in entries] == [
        ("UnitRequiredError", "events", "batch")]


def test_the_hint_of_a_query_per_the_wrong_unit_is_not_raw_values() -> None:
    """Review finding 8: allowing raw values would not admit a table query per another unit."""
    with pytest.raises(UnitRequiredError) as info:
        release_bounded(_acc()._gate, _two(), _Compute([1.0, 2.0]),
                        UnitBounds("user_id", BOUNDS), None, ("events", None))
    assert "raw_values" not in str(info.value) and "bounds per 'person_id'" in str(info.value)


@pytest.mark.parametrize("unit", [None, "user_id"])
def test_dataset_without_a_unit_takes_either_and_the_record_says_which(unit: str | None) -> None:
    acc = _acc(unit=None)
    release_bounded(acc._gate, _two(), _Compute([1.0, 2.0]), UnitBounds(unit, BOUNDS), None,
                    ("events", None))
    assert _records(acc)[-1]["unit"] == unit


def test_seeded_accountant_reproduces_and_each_call_gets_a_fresh_seed() -> None:
    first, second = _Compute([1.0, 2.0]), _Compute([1.0, 2.0])
    a, b = _acc(eps=10.0), _acc(eps=10.0)
    outs_a = [release_bounded(a._gate, _two(), first, PER_PERSON, None, ("events", None))
              for _ in range(2)]
    outs_b = [release_bounded(b._gate, _two(), second, PER_PERSON, None, ("events", None))
              for _ in range(2)]
    assert first.draws == second.draws and outs_a == outs_b
    assert first.draws[0] != first.draws[1]  # a fresh seed per call
    other = _Compute([1.0, 2.0])
    release_bounded(_acc(rng=1)._gate, _two(), other, PER_PERSON, None, ("events", None))
    assert other.draws[0] != first.draws[0]  # the seed comes from the accountant's source


CANARY = "alice@example.com"


def _leaky(rng: np.random.Generator) -> list[float]:
    """What pandas or DuckDB do: an error quoting a cell value."""
    raise KeyError(f"no group for {CANARY!r}")


def test_compute_errors_that_quote_data_are_replaced_by_their_type() -> None:
    """Review finding 5, the attack: after the debit, the engine's error carries a cell value
    out in its message (or its ``__context__``). It is replaced by a typed error naming
    ``compute`` and the error's type only; the debit stands and says so; nothing is drawn."""
    acc = _acc()
    with pytest.raises(InvalidDataError) as info:
        release_bounded(acc._gate, _two(), _leaky, PER_PERSON, None, ("events", None))
    error = info.value
    assert "'compute'" in str(error) and "KeyError" in str(error)
    assert "the debit stands (record" in str(error)
    assert CANARY not in str(error) and CANARY not in repr(error)
    assert error.__context__ is None and error.__cause__ is None
    assert acc.spent("events") == Budget(0.5)


def test_negative_control_the_old_path_leaked_the_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old ``_answers`` (compute's error propagating as raised) re-created: the canary."""
    def old(items: Any, compute: Any, sampler: Any, stands: str) -> Any:
        values = compute(np.random.default_rng(0))
        return [m.draw(m.prepare(v), sampler) for m, v in zip(items, values)]

    monkeypatch.setattr(bounded, "_answers", old)
    with pytest.raises(KeyError, match=CANARY):
        release_bounded(_acc()._gate, _two(), _leaky, PER_PERSON, None, ("events", None))


def test_the_librarys_own_errors_pass_through_noted_the_debit_stands() -> None:
    acc = _acc()
    own = InvalidDataError("amount", float("nan"), "a finite number")

    def refusing(rng: np.random.Generator) -> list[float]:
        raise own

    with pytest.raises(InvalidDataError) as info:
        release_bounded(acc._gate, _two(), refusing, PER_PERSON, None, ("events", None))
    assert info.value is own and any("the debit stands" in n for n in own.__notes__)
    assert acc.spent("events") == Budget(0.5)


def test_a_mechanism_without_its_sensitivity_is_refused_before_the_debit() -> None:
    """Review finding 3, the attack: a mechanism whose Δ was never stated was debited, then its
    ``prepare`` refused the value "nothing was drawn or debited" — a false statement."""
    acc = _acc()
    compute, before = _Compute([1.0, 2.0]), snapshot(acc.ledger)
    bare = [Laplace(epsilon=0.25), Laplace(epsilon=0.25, sensitivity=20.0)]
    with pytest.raises(InvalidArgumentError, match="sensitivity"):
        release_bounded(acc._gate, bare, compute, PER_PERSON, None, ("events", None))
    assert compute.calls == 0 and snapshot(acc.ledger) == before


def test_negative_control_without_the_check_prepare_fails_after_the_debit_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-check skipped (Laplace posing as taking no Δ): the debit is made, ``prepare``
    refuses, and the error now says the debit stands."""
    monkeypatch.setattr(Laplace, "query_norm", None)
    acc = _acc()
    with pytest.raises(InvalidArgumentError, match="sensitivity") as info:
        release_bounded(acc._gate, [Laplace(epsilon=0.25)], _Compute([1.0]), PER_PERSON, None,
                        ("events", None))
    assert acc.spent("events") == Budget(0.25)
    assert any("the debit stands" in n for n in info.value.__notes__)


def test_compute_may_return_a_numpy_array_of_the_right_length() -> None:
    """Review finding 9: an ndarray is not a ``Sequence``; it was refused after the debit."""
    acc = _acc()
    out = release_bounded(acc._gate, _two(), lambda rng: np.array([100.0, 5000.0]), PER_PERSON,
                          None, ("events", None))
    assert len(out) == 2 and all(isinstance(x, float) for x in out)


@pytest.mark.parametrize("values", [np.array([1.0]), np.array(3.0), [1.0], "ab", 7])
def test_compute_returning_the_wrong_count_draws_nothing_and_says_the_debit_stands(
        values: Any) -> None:
    acc = _acc()
    with pytest.raises(InvalidDataError, match="compute") as info:
        release_bounded(acc._gate, _two(), lambda rng: values, PER_PERSON, None,
                        ("events", None))
    assert "the debit stands" in str(info.value)
    assert acc.spent("events") == Budget(0.5)  # the debit stands


@pytest.mark.parametrize("unit, error", [
    (("person_id", BOUNDS), InvalidTypeError),
    (UnitBounds(3, BOUNDS), InvalidTypeError),  # type: ignore[arg-type]
    (UnitBounds("person_id", {"upper": float("inf")}), InvalidArgumentError),
    (UnitBounds("person_id", {"upper": True}), InvalidArgumentError),
    (UnitBounds("person_id", [1]), InvalidTypeError),  # type: ignore[arg-type]
    # Review finding 4: no bounds, unknown names, counts below 1, clamps out of order.
    (UnitBounds("person_id", {}), InvalidArgumentError),
    (UnitBounds("person_id", {"max_rows_per_unit": 0, "junk": -1e300}), InvalidArgumentError),
    (UnitBounds("person_id", {"max_rows_per_unit": 20, "junk": 1}), InvalidArgumentError),
    (UnitBounds("person_id", {"lower": 5.0, "upper": 1.0}), InvalidArgumentError),
    (UnitBounds("person_id", {"max_rows_per_unit": 2.5}), InvalidArgumentError),
])
def test_malformed_unit_is_refused_before_anything(unit: Any, error: type) -> None:
    acc = _acc()
    before = snapshot(acc.ledger)
    compute = _Compute([1.0, 2.0])
    with pytest.raises(error) as info:
        release_bounded(acc._gate, _two(), compute, unit, None, ("events", None))
    assert snapshot(acc.ledger) == before and compute.calls == 0
    assert "300" not in str(info.value)  # a bound's name, never its value


def test_empty_or_stream_mechanisms_are_refused() -> None:
    from dpbudget.mechanisms import AboveThreshold

    acc = _acc()
    with pytest.raises(InvalidArgumentError):
        release_bounded(acc._gate, [], _Compute([]), PER_PERSON, None, ("events", None))
    stream = AboveThreshold(epsilon=0.1, threshold=1.0, sensitivity=1.0)
    with pytest.raises(InvalidTypeError):
        release_bounded(acc._gate, [stream], _Compute([1.0]), PER_PERSON, None, ("events", None))


def test_a_later_value_may_be_chosen_by_the_answers_drawn_before_it() -> None:
    """A value given as a function is called with the answers drawn before it (the sums of the
    keys a selection released: adaptive composition, the batch's one cost); None draws nothing
    of it. A later value that fails its mechanism's check is refused naming no data, the debit
    standing and nothing released."""
    acc = _acc(eps=1.0)
    seen: list[tuple[Any, ...]] = []

    def later(answers: tuple[Any, ...]) -> float:
        seen.append(answers)
        return 7.0
    first, second = release_bounded(acc._gate, _two(), lambda rng: [100.0, later], PER_PERSON,
                                    None, ("events", None, None))
    assert seen == [(first,)] and isinstance(second, float)
    out = release_bounded(acc._gate, _two(), lambda rng: [100.0, lambda answers: None],
                          PER_PERSON, None, ("events", None, None))
    assert out[1] is None and acc.spent("events").epsilon == pytest.approx(1.0)
    with pytest.raises(InvalidDataError) as err:
        release_bounded(_acc()._gate, _two(), lambda rng: [1.0, lambda a: float("nan")],
                        PER_PERSON, None, ("events", None, None))
    assert "debit stands" in str(err.value.__notes__) and "nothing was released" in \
        str(err.value.__notes__)


# -- a4 (third review): what a later callable value is handed, and its errors -------------------

def _selection() -> Any:
    from dpbudget.mechanisms.partition_selection import PartitionSelection
    return PartitionSelection(0.25, delta=1e-6, max_groups_per_unit=1, max_rows_per_group=1,
                              max_rows_per_unit=1)


def _acc_d() -> Accountant:
    return Accountant(limits={"events": DatasetLimit(limit=Budget(10.0, 1e-3),
                                                     privacy_unit="person_id")}, rng=0)


def _zeros_of_the_selection(present: list[int]) -> Any:
    """The a4 (f) attack: the later value is one entry per key present but NOT released (the
    selection's zeros), so the length of its answer says how many keys were present."""
    acc = _acc_d()
    counts = np.array(present)
    return release_bounded(acc._gate, [_selection(), Laplace(0.25, sensitivity=1.0)],
                           lambda rng: [counts, lambda a: np.zeros(
                               1 + np.size(a[0]) - np.count_nonzero(a[0]))],
                           PER_PERSON, None, ("events", None, None))[1]


def test_a_later_value_sees_only_the_released_positions_of_a_selection() -> None:
    """A third key of one person (count 1, never released) no longer lengthens the later
    answer: the callable is handed the positions released, not the selection's raw vector."""
    assert len(_zeros_of_the_selection([5000, 5000])) == \
        len(_zeros_of_the_selection([5000, 5000, 1]))


def test_negative_control_handed_the_raw_vector_the_length_leaks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old hand-off (each answer as drawn) re-created: one person's key changes the length."""
    monkeypatch.setattr(bounded, "_released", lambda mechanism, answer: answer)
    assert len(_zeros_of_the_selection([5000, 5000])) + 1 == \
        len(_zeros_of_the_selection([5000, 5000, 1]))


def test_a_later_value_cannot_change_an_earlier_answer() -> None:
    """a4 (e): the callable writes into the earlier answer before it is returned: refused (a
    read-only copy), named by type, the debit standing; an honest read still works."""
    acc = _acc_d()

    def overwrite(answers: tuple[Any, ...]) -> Any:
        answers[0][:] = 0
        return np.array([1.0])
    with pytest.raises(InvalidDataError, match="ValueError") as err:
        release_bounded(acc._gate, [_selection(), Laplace(0.25, sensitivity=1.0)],
                        lambda rng: [np.array([5000]), overwrite], PER_PERSON, None,
                        ("events", None, None))
    assert "debit stands" in str(err.value)
    first = np.array([1.0, 2.0])
    out = release_bounded(acc._gate, [Laplace(0.25, sensitivity=1.0)] * 2,
                          lambda rng: [first, lambda a: a[0] * 0 + 1.0], PER_PERSON, None,
                          ("events", None, None))
    assert out[0].flags.writeable and out[1].shape == (2,)


def test_negative_control_handed_the_answer_itself_it_is_overwritten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "_released", lambda mechanism, answer: answer)

    def overwrite(answers: tuple[Any, ...]) -> Any:
        answers[0][:] = 0
        return np.array([1.0])
    out = release_bounded(_acc_d()._gate, [_selection(), Laplace(0.25, sensitivity=1.0)],
                          lambda rng: [np.array([5000]), overwrite], PER_PERSON, None,
                          ("events", None, None))
    assert out[0].tolist() == [0]  # (the released count, rewritten after its draw)


def _quoting(answers: tuple[Any, ...]) -> Any:
    raise ValueError(f"row of person 7: amount={CANARY}")


class _QuotingPrepare(Laplace):
    def prepare(self, value: Any) -> Any:
        raise ValueError(f"cannot read {CANARY}")


@pytest.mark.parametrize("late", ["callable", "prepare"])
def test_a_later_value_or_its_prepare_quoting_data_is_replaced_by_its_type(late: str) -> None:
    """a4 (b): after the debit, a later callable (or its mechanism's ``prepare``) raises an
    error quoting a cell: replaced as ``compute``'s are — its type only, the debit stands."""
    acc = _acc_d()
    second = Laplace(0.25, sensitivity=1.0) if late == "callable" else \
        _QuotingPrepare(0.25, sensitivity=1.0)
    value = _quoting if late == "callable" else (lambda a: 1.0)
    with pytest.raises(InvalidDataError) as info:
        release_bounded(acc._gate, [_selection(), second], lambda rng: [np.array([5000]), value],
                        PER_PERSON, None, ("events", None, None))
    assert "ValueError" in str(info.value) and "debit stands" in str(info.value)
    assert CANARY not in str(info.value) and CANARY not in repr(info.value)
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert acc.spent("events").epsilon == pytest.approx(0.5)


def test_negative_control_unguarded_the_later_error_quotes_the_cell(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "_guarded", lambda step, stands: step())
    with pytest.raises(ValueError, match=CANARY):
        release_bounded(_acc_d()._gate, [_selection(), Laplace(0.25, sensitivity=1.0)],
                        lambda rng: [np.array([5000]), _quoting], PER_PERSON, None,
                        ("events", None, None))
