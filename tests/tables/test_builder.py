"""The table API (dpbudget.accountant.tables.builder), as the issue's five acceptance queries on the
events table at ε = 1 per person (20 rows per person, 3 regions per person for Q3, amounts on
[0, 1000]), each shown private per PERSON: all rows of one person are removed, the keys of the
rows the two tables share are kept (the coupling), and the output law of the mechanisms the query
is priced with is compared exactly on the two true values the query computes. Negative control:
the same query priced row by row (Δ = 1, as the old helpers) leaks more than ε per person.

Also: one debit per query, refusals that debit nothing, and the same answers from every engine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pytest

import dpbudget as dp
from dpbudget.accountant.tables.builder import TableQuery, table
from dpbudget.accountant.values.errors import (BudgetExceededError, InvalidArgumentError,
                                               InvalidDataError, InvalidDataTypeError,
                                               InvalidTypeError)
from dpbudget.examples.events import REGIONS, events_frame
from dpbudget.mechanisms import BinnedQuantile, DiscreteLaplace, Laplace, PartitionSelection

from tests.support import snapshot
from tests.tables._tables import GivenKeys, accountant

PERSON = "person_id"
B = {"max_rows_per_unit": 20}


def _acc(eps: float = 100.0) -> Any:
    return dp.Accountant(limits={"events": dp.DatasetLimit(limit=dp.Budget(eps, 1e-3),
                                                           privacy_unit=PERSON)}, rng=0)


def _queries(frame: Any, acc: Any = None) -> dict[str, TableQuery]:
    t = table(acc or _acc(), frame, dataset="events")
    by_region = t.group_by("region", keys=REGIONS)
    return {"Q1": by_region.count(epsilon=1.0, **B),
            "Q2": by_region.mean("amount", lower=0, upper=1000, epsilon=1.0, **B),
            "Q3": by_region.count_distinct_units(epsilon=1.0, max_groups_per_unit=3,
                                                 max_rows_per_group=20),
            "Q4": t.median("amount", lower=0, upper=1000, epsilon=1.0, **B),
            "Q5": t.group_by("day", "region").count(epsilon=1.0, delta=1e-6, **B)}


def _true(query: TableQuery, keys: tuple[np.ndarray, ...]) -> tuple[list[Any], dict[str, Any]]:
    state: dict[str, Any] = {}
    return query._compute(GivenKeys(*keys), state), state  # type: ignore[arg-type]


def _loss(mechanism: Any, a: Any, b: Any) -> float:
    """The exact worst-case privacy loss between the mechanism's output laws on a and b."""
    if isinstance(mechanism, (DiscreteLaplace, Laplace)):
        # Laplace (discrete or on a fine grid): ln P(a + Z = y)/P(b + Z = y) <= |a − b|₁·rate.
        l1 = float(np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float)).sum())
        return l1 * mechanism.epsilon / mechanism.sensitivity
    assert isinstance(mechanism, BinnedQuantile)
    pa, pb = (_exponential(mechanism, np.diff(mechanism.prepare(v), prepend=0)) for v in (a, b))
    return float(np.max(np.abs(np.log(pa) - np.log(pb))))


def _exponential(m: BinnedQuantile, counts: np.ndarray) -> np.ndarray:
    scores = np.array(m.release_scores(counts), dtype=float)
    logits = -float(m._rate) * (scores - scores.min())
    p = np.exp(logits)
    return p / p.sum()


@pytest.mark.parametrize("name", ["Q1", "Q2", "Q3", "Q4"])
def test_each_query_is_private_per_person(name: str) -> None:
    """For several key draws and the persons with the most rows (where row-level pricing leaks
    most), the exact loss of every mechanism summed over the query is at most ε = 1."""
    full = events_frame(persons=300, seed=3)
    rng = np.random.default_rng(0)
    heavy = full[PERSON].value_counts().index[:3]
    for _ in range(3):
        keys = (rng.random(len(full)),)
        query = _queries(full)[name]
        a, _ = _true(query, keys)
        for person in heavy:
            keep = (full[PERSON] != person).to_numpy()
            less = _queries(full[keep].reset_index(drop=True))[name]
            b, _ = _true(less, tuple(k[keep] for k in keys))
            loss = sum(_loss(m, x, y) for m, x, y in zip(query.mechanisms(), a, b))
            assert loss <= 1.0 + 1e-9, (name, person)


@pytest.mark.parametrize("name", ["Q1", "Q2", "Q4"])
def test_row_level_pricing_leaks_more_than_epsilon_per_person(name: str,
                                                             monkeypatch: Any) -> None:
    """Negative control: no bounding (bounds no person reaches) and the row-level sensitivity
    (Δ = 1 row), as the old helpers priced an events table: a 40-row person leaks ε·40."""
    from dpbudget.accountant.tables import sensitivities
    monkeypatch.setattr(sensitivities, "contribution",
                        lambda bounds, grouped: sensitivities.Contribution(1, 1, 1, False))
    monkeypatch.setattr("dpbudget.accountant.tables.builder.contribution",
                        lambda bounds, grouped: sensitivities.Contribution(1, 1, 1, False))
    full = events_frame(persons=300, seed=3)
    person = full[PERSON].value_counts().index[0]
    keys = (np.random.default_rng(1).random(len(full)),)
    query = _queries(full)[name]
    unbounded = query.contribution._replace(total=10 ** 6, groups=10 ** 6, per_group=10 ** 6)
    query.contribution = unbounded  # compute without bounding, priced as above (Δ per row)
    keep = (full[PERSON] != person).to_numpy()
    less = _queries(full[keep].reset_index(drop=True))[name]
    less.contribution = unbounded
    a, _ = _true(query, keys)
    b, _ = _true(less, tuple(k[keep] for k in keys))
    priced = _queries(full)[name].mechanisms()  # (the row-level mechanisms)
    assert sum(_loss(m, x, y) for m, x, y in zip(priced, a, b)) > 1.0


def test_q5_a_key_only_one_person_creates_is_released_with_probability_at_most_delta() -> None:
    """The removed person's own keys (absent without them) appear with probability <= δ in all;
    the keys both tables share are priced by the selection's and the counts' ε."""
    full = events_frame(persons=300, seed=3)
    rng = np.random.default_rng(2)
    keys = (rng.random(len(full)),)
    query = _queries(full)["Q5"]
    selection, counts = query.mechanisms()
    for person in full[PERSON].unique()[:20]:
        a, state_a = _true(query, keys)
        keep = (full[PERSON] != person).to_numpy()
        b, state_b = _true(_queries(full[keep].reset_index(drop=True))["Q5"],
                           tuple(k[keep] for k in keys))
        only = [i for i, k in enumerate(state_a["keys"]) if k not in set(state_b["keys"])]
        assert all(a[0][i] == 1 for i in only)  # a key only they create has one unit
        assert sum(selection.release_probability(1) for _ in only) <= selection.delta
        shared = [state_a["keys"].index(k) for k in state_b["keys"]]
        loss = _loss(DiscreteLaplace(selection.epsilon, sensitivity=selection.max_groups_per_unit),
                     a[0][shared], b[0]) + _loss(counts, a[1][shared], b[1])
        assert loss <= 1.0 + 1e-9


def test_the_five_queries_release_and_charge_epsilon_each() -> None:
    acc = _acc(eps=5.0)
    frame = events_frame(persons=2000, seed=3)
    out = {name: q.release(label=name) for name, q in _queries(frame, acc).items()}
    assert set(out["Q1"]) == set(REGIONS) and all(isinstance(v, int) for v in out["Q1"].values())
    assert set(out["Q2"]["r00"]) == {"mean", "count", "sum"} and 0 <= out["Q2"]["r00"]["mean"] <= 1000
    assert 50 <= out["Q4"] <= 150  # the median of exp(N(4.5, 1)) is e^4.5 ≈ 90
    assert all(isinstance(k, tuple) and len(k) == 2 for k in out["Q5"])
    assert acc.spent("events").epsilon == pytest.approx(5.0)
    records = [json.loads(e.text) for e in acc.ledger.entries()][-5:]
    assert all(r.get("unit") == PERSON for r in records)


def test_same_seed_same_answers_from_every_engine(tmp_path: Path) -> None:
    pdf = events_frame(persons=500, seed=3)
    path = tmp_path / "e.parquet"
    pdf.to_parquet(path, index=False)
    answers = []
    for frame in (pdf, pl.DataFrame(pdf), pl.DataFrame(pdf).lazy(), duckdb.from_df(pdf), path):
        qs = _queries(frame)
        answers.append({n: qs[n].release() for n in ("Q1", "Q3", "Q4", "Q5")})
    assert all(a == answers[0] for a in answers)


def test_accuracy_reports_the_noise_before_spending_anything() -> None:
    acc = _acc()
    before = snapshot(acc.ledger)
    qs = _queries(events_frame(persons=300, seed=3), acc)
    assert qs["Q1"].accuracy()["rows"]["scale"] == pytest.approx(20.0)  # Δ₁ = 20 at ε = 1
    assert qs["Q2"].accuracy()["sum"]["scale"] == pytest.approx(20 * 500 / 0.5)
    assert qs["Q5"].accuracy()["selection"]["threshold"] > 1
    assert "rank" in qs["Q4"].accuracy()
    assert snapshot(acc.ledger) == before


@pytest.mark.parametrize("build,error,argument", [
    (lambda t: t.count(epsilon=1.0), InvalidArgumentError, "max_rows_per_unit"),
    (lambda t: t.group_by("region", keys=REGIONS).count(epsilon=1.0, max_groups_per_unit=2),
     InvalidArgumentError, "max_rows_per_group"),
    (lambda t: t.sum("amount", lower=0, upper=None, epsilon=1.0, **B), InvalidArgumentError,
     "upper"),
    (lambda t: t.group_by("region").sum("amount", lower=0, upper=9, epsilon=1.0, **B),
     InvalidArgumentError, "keys"),
    (lambda t: t.group_by("region").count(epsilon=1.0, **B), InvalidArgumentError, "delta"),
    (lambda t: t.group_by("region", keys=[]), InvalidArgumentError, "keys"),
    (lambda t: t.group_by("region", keys=[3]).count(epsilon=1.0, **B), InvalidTypeError, "keys"),
    (lambda t: t.count(epsilon=1.0, max_rows_per_person=3), InvalidArgumentError, "bounds"),
    (lambda t: t.sum("nope", lower=0, upper=1, epsilon=1.0, **B), InvalidArgumentError,
     "column"),
    (lambda t: t.filter("region", "~", "r00"), InvalidArgumentError, "op"),
    (lambda t: t.filter("day", "<", "7").count(epsilon=1.0, **B), InvalidTypeError, "value"),
    (lambda t: t.filter("region", "in", ["r00", 1]).count(epsilon=1.0, **B), InvalidTypeError,
     "value"),
    (lambda t: t.filter("nope", "==", 1).count(epsilon=1.0, **B), InvalidArgumentError,
     "column"),
])
def test_a_bad_query_is_refused_before_anything_is_read_or_debited(
        build: Any, error: type, argument: str) -> None:
    acc = _acc()
    before = snapshot(acc.ledger)
    with pytest.raises(error) as err:
        build(table(acc, events_frame(persons=50, seed=3), dataset="events"))
    assert err.value.argument == argument
    assert snapshot(acc.ledger) == before


@pytest.mark.parametrize("column,values,error", [
    (PERSON, [None, 1.0], InvalidDataError), ("amount", [float("nan"), 1.0], InvalidDataError),
    ("amount", [float("inf"), 1.0], InvalidDataError),
    (PERSON, ["p1", 2], InvalidDataTypeError)])
def test_bad_data_is_refused_naming_the_column_with_nothing_debited(
        column: str, values: list[Any], error: type) -> None:
    frame = pd.DataFrame({PERSON: [1, 2], "region": ["r00", "r01"], "amount": [1.0, 2.0]})
    frame[column] = pd.Series(values, dtype=object if error is InvalidDataTypeError else
                              "Int64" if column == PERSON else None)
    acc = _acc()
    before = snapshot(acc.ledger)
    with pytest.raises(error) as err:
        table(acc, frame, dataset="events").sum("amount", lower=0, upper=9, epsilon=1.0,
                                                **B).release()
    assert column in str(err.value) and "p1" not in str(err.value)
    assert snapshot(acc.ledger) == before


def test_a_refused_budget_computes_nothing(monkeypatch: Any) -> None:
    acc = _acc(eps=0.5)
    before = snapshot(acc.ledger)
    query = table(acc, events_frame(persons=50, seed=3), dataset="events").count(epsilon=1.0, **B)
    monkeypatch.setattr(type(query), "_compute", lambda *a: pytest.fail("computed"))
    with pytest.raises(BudgetExceededError):
        query.release()
    assert snapshot(acc.ledger) == before


def test_a_dataset_without_a_unit_is_refused() -> None:
    acc = accountant(unit=None)
    before = snapshot(acc.ledger)
    with pytest.raises(InvalidArgumentError) as err:
        table(acc, events_frame(persons=50, seed=3), dataset="t")
    assert err.value.argument == "unit" and snapshot(acc.ledger) == before


def test_why_a_per_unit_query_is_not_per_row_on_a_dataset_without_a_unit() -> None:
    """The attack the refusal above closes: bounded to C = 1 row per unit, removing ONE row
    (the kept one) makes the unit's other row kept instead: the count vector moves by 2 > Δ = 1.
    Per row, a unit-bounded query costs up to 2ε: it is priced per unit only where the unit is
    the dataset's."""
    acc = accountant()
    frame = pd.DataFrame({"unit": [1, 1], "g": ["a", "b"]})
    t = table(acc, frame, dataset="t").group_by("g", keys=["a", "b"])
    keys = (np.array([0.1, 0.9]),)
    a, _ = _true(t.count(epsilon=1.0, max_rows_per_unit=1), keys)
    b, _ = _true(table(acc, frame.iloc[1:].reset_index(drop=True), dataset="t").group_by(
        "g", keys=["a", "b"]).count(epsilon=1.0, max_rows_per_unit=1), (keys[0][1:],))
    assert a[0].tolist() == [1, 0] and b[0].tolist() == [0, 1]  # L1 change 2, with Δ₁ = 1


def test_public_keys_absent_from_the_data_get_a_noisy_zero_and_others_are_dropped() -> None:
    acc = _acc()
    frame = events_frame(persons=300, seed=3)
    keys = ["r00", "zz"]
    counts = table(acc, frame, dataset="events").group_by("region", keys=keys).count(
        epsilon=50.0, **B).release()
    assert set(counts) == set(keys) and abs(counts["zz"]) <= 10
    assert counts["r00"] == pytest.approx((frame["region"] == "r00").sum(), abs=10)


def test_filters_keep_only_their_rows() -> None:
    acc = _acc()
    frame = events_frame(persons=300, seed=3)
    n = table(acc, frame, dataset="events").filter("day", "<", 7).filter(
        "region", "in", ["r00", "r01"]).count(epsilon=50.0, max_rows_per_unit=40).release()
    want = ((frame["day"] < 7) & frame["region"].isin(["r00", "r01"])).sum()
    assert n == pytest.approx(want, abs=10)


def test_the_policy_bounds_are_the_default() -> None:
    from dpbudget.policies.units import ContributionBounds
    acc = dp.Accountant(limits={"events": dp.DatasetLimit(
        limit=dp.Budget(1.0), privacy_unit=PERSON,
        bounds=ContributionBounds(max_rows_per_unit=7))}, rng=0)
    query = table(acc, events_frame(persons=50, seed=3), dataset="events").count(epsilon=1.0)
    assert query.contribution.total == 7 and query.bounds == {"max_rows_per_unit": 7}
    assert math.isclose(query.accuracy()["rows"]["scale"], 7.0)
    assert isinstance(query.mechanisms()[0], DiscreteLaplace)
    assert not isinstance(query.mechanisms()[0], PartitionSelection)
