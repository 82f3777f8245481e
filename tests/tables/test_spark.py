"""The table queries on Spark (dpbudget.accountant.tables.spark), local mode, one session.

The attacks: a Spark frame gives one unit more influence than its bounds (brute force, every
unit removed, with a row-level negative control); a recomputed partition keys a unit's rows
differently from the first computation (negative control: ``rand(seed)``); identical rows sharing
one key change the bounding's law (negative control: the shared key re-created, which keeps
{A, A} of A, A, B half the time, not a third); a source evaluated twice (the frame raises on its
second evaluation; negative control: no checkpoint); a job failing after the debit releases
something, or retries and spends twice; the post-debit seed in a record, a log line or an error.
And the five queries answer alike on pandas, DuckDB and Spark: identically where no bound
truncates, with the same law where one does.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import duckdb
import narwhals as nw
import numpy as np
import pandas as pd
import pytest
from scipy import stats

import dpbudget as dp
from dpbudget.accountant.ledger import SqliteLedger
from dpbudget.accountant.tables import bounding, frames, sensitivities as sens
import dpbudget.accountant.tables.spark as spark_keys
from dpbudget.accountant.tables.builder import table
from dpbudget.accountant.tables.frames import KEY
from dpbudget.accountant.tables.sensitivities import Contribution
from dpbudget.accountant.values.errors import InvalidDataError
from dpbudget.examples.events import REGIONS, events_frame

from tests import _spark
from tests.tables._tables import small_table

ALPHA = 1e-6
PERSON = "person_id"
pytestmark = _spark.MARKS


def _acc(eps: float = 100.0, rng: Any = 0) -> Any:
    return dp.Accountant(limits={"events": dp.DatasetLimit(limit=dp.Budget(eps, 1e-3),
                                                           privacy_unit=PERSON)}, rng=rng)


def _five(frame: Any, bound: int) -> dict[str, Any]:
    """The five queries of benchmarks/tables.py, each person's rows bounded to ``bound`` (Q5 per
    region at ε = 10: per day × region, no key of this small table clears the threshold)."""
    t = table(_acc(), frame, dataset="events")
    by_region = t.group_by("region", keys=REGIONS)
    b = {"max_rows_per_unit": bound}
    return {"Q1": by_region.count(epsilon=1.0, **b).release(),
            "Q2": by_region.mean("amount", lower=0, upper=1000, epsilon=1.0, **b).release(),
            "Q3": by_region.count_distinct_units(epsilon=1.0, max_groups_per_unit=bound,
                                                 max_rows_per_group=bound).release(),
            "Q4": t.median("amount", lower=0, upper=1000, epsilon=1.0, **b).release(),
            "Q5": t.group_by("region").count(epsilon=10.0, delta=1e-3, **b).release()}


def test_the_five_queries_answer_the_same_on_pandas_duckdb_and_spark(spark: Any) -> None:
    """No bound truncates (at most 40 rows per person, bound 40): the same true values, the
    same post-debit draws, identical answers."""
    pdf = events_frame(persons=400, seed=3)
    assert pdf.groupby(PERSON).size().max() <= 40
    answers = [_five(f, 40) for f in (pdf, duckdb.from_df(pdf), _spark.frame(spark, pdf))]
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["Q5"]  # (selection released keys: not an empty answer on every engine)


def _kept_sums(frame: Any, c: Contribution) -> np.ndarray:
    """Per unit, the sum of the kept rows' ``x`` (``frame`` keyed, its columns ``inner``)."""
    n = frames.inner(["unit", "x"])
    found = frames.collect(bounding.unit_groups(frame, n["unit"], [], c, n["x"], -100.0, 100.0))
    return np.asarray(found[bounding.SUM], dtype=np.float64)


def _shared_keys(native: Any, rng: np.random.Generator, columns: Any, key: str) -> Any:
    """The broken keys: a hash of the seed and the row alone (identical rows share a key)."""
    from pyspark.sql import functions as F
    text = F.concat_ws("|", F.lit(rng.bytes(32).hex()), F.to_json(F.struct(*columns)))
    bits = F.conv(F.substring(F.sha2(text, 256), 1, 13), 16, 10).cast("long")
    return native.withColumn(key, bits.cast("double") / float(1 << 52))


@pytest.mark.statistical
def test_duplicated_rows_are_bounded_with_the_law_of_iid_keys(spark: Any,
                                                              monkeypatch: Any) -> None:
    """600 units of rows A, A, B (x = 1, 1, 5), two rows kept: {A, A} (sum 2) with probability
    1/3, as with numpy's iid keys on pandas; a binomial test at α = 1e-6. Which of the two A's
    is kept changes no sum. Negative control: one key per distinct row keeps {A, A} half the
    time, and the same test rejects it."""
    units = 600
    pdf = pd.DataFrame({"unit": np.repeat(np.arange(units), 3),
                        "x": np.tile([1.0, 1.0, 5.0], units)})
    c = Contribution(groups=2, per_group=2, total=2, by_group=False)
    rows = frames.open_frame(_spark.frame(spark, pdf)).read(["unit", "x"])
    sums = _kept_sums(frames.keyed(rows, np.random.default_rng(1), "spark"), c)
    assert set(sums) <= {2.0, 6.0}
    assert stats.binomtest(int((sums == 2.0).sum()), units, 1 / 3).pvalue > ALPHA
    local = frames.open_frame(pdf).read(["unit", "x"])
    numpy_sums = _kept_sums(frames.keyed(local, np.random.default_rng(1), "pandas"),
                            c)
    assert stats.binomtest(int((numpy_sums == 2.0).sum()), units, 1 / 3).pvalue > ALPHA
    monkeypatch.setattr(spark_keys, "keys", _shared_keys)
    shared = _kept_sums(frames.keyed(rows, np.random.default_rng(1), "spark"), c)
    assert stats.binomtest(int((shared == 2.0).sum()), units, 1 / 3).pvalue < ALPHA


def test_a_recomputed_partition_gets_the_same_keys(spark: Any) -> None:
    """The keys of the same rows, laid out in other partitions and another order (what a task
    recomputed after a lost executor may see), are the same. Negative control: ``rand(seed)``
    keys the same rows differently."""
    from pyspark.sql import functions as F
    pdf = small_table(5, units=6, max_rows=8)
    pdf = pd.concat([pdf, pdf.head(3)], ignore_index=True)  # (identical rows too)
    native = spark_keys.copy(_spark.frame(spark, pdf))
    other = native.repartition(3, "x").orderBy(F.col("x").desc())

    def keyed(frame: Any, seed: int) -> list[tuple[Any, ...]]:
        out = spark_keys.keys(frame, np.random.default_rng(seed), frame.columns, KEY)
        return sorted(tuple(r) for r in out.collect())

    first = keyed(native, 4)
    assert first == keyed(other, 4)
    assert len({k for *_, k in first}) == len(first)  # (identical rows: distinct keys)
    assert first != keyed(native, 5)  # (another seed, other keys)
    rand = sorted(tuple(r) for r in native.withColumn(KEY, F.rand(4)).collect())
    assert rand != sorted(tuple(r) for r in other.withColumn(KEY, F.rand(4)).collect())


def test_one_unit_moves_each_spark_aggregate_by_at_most_its_sensitivity(spark: Any) -> None:
    """Brute force on Spark: every unit of a small table removed, for two seeds (the keys of
    the rows both tables share are the same: a function of the seed and the row), moves each
    aggregate vector by at most its formula. Negative control: the change exceeds 1, the
    row-level sensitivity of a count."""
    c = Contribution(groups=2, per_group=2, total=4, by_group=True)
    pdf = small_table(2, units=3, max_rows=8)

    def per_group(frame: pd.DataFrame, seed: int) -> dict[str, np.ndarray]:
        rows = frames.open_frame(_spark.frame(spark, frame)).read(["unit", "group", "x"])
        n = frames.inner(["unit", "group", "x"])
        keyed = frames.keyed(rows, np.random.default_rng(seed), "spark")
        found = frames.collect(bounding.per_group(keyed, n["unit"], [n["group"]], c, n["x"],
                                                  0.0, 10.0))
        at = {g: i for i, g in enumerate(found[n["group"]].tolist())}
        return {name: np.array([float(found[name][at[g]]) if g in at else 0.0
                                for g in "abc"])
                for name in (bounding.ROWS, bounding.UNITS, bounding.SUM)}

    worst = dict.fromkeys((bounding.ROWS, bounding.UNITS, bounding.SUM), 0.0)
    for seed in (0, 1):
        full = per_group(pdf, seed)
        for unit in pdf["unit"].unique():
            less = per_group(pdf[pdf["unit"] != unit], seed)
            for name in worst:
                worst[name] = max(worst[name], float(np.abs(full[name] - less[name]).sum()))
    assert worst[bounding.ROWS] <= sens.count(c)
    assert worst[bounding.UNITS] <= sens.distinct_units(c)
    assert worst[bounding.SUM] <= sens.sum_of(c, sens.clamp(0.0, 10.0)) + 1e-9
    assert worst[bounding.ROWS] > 1  # (a row-level Δ = 1 would not hold: the test can fail)


def test_a_source_that_raises_on_its_second_evaluation_is_read_once(
        spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """A Python UDF that raises when it meets a row a second time: the query reads it once
    (the checkpoint), and releases. Negative control: without the checkpoint, the checks and
    the bounding evaluate the source again, and it raises."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType
    seen = tmp_path / "seen"
    seen.mkdir()

    def once(row, x):  # type: ignore[no-untyped-def]  # (Spark 4 reads hints as a pandas UDF's)
        mark = seen / str(row)
        if mark.exists():
            raise RuntimeError("second evaluation")
        mark.touch()
        return x

    pdf = small_table(1, units=4)
    base = _spark.frame(spark, pdf.assign(row=np.arange(len(pdf))))
    source = base.withColumn("x", F.udf(once, DoubleType())("row", "x")).drop("row")
    acc = dp.Accountant(limits={"t": dp.DatasetLimit(limit=dp.Budget(10.0),
                                                     privacy_unit="unit")}, rng=0)
    assert isinstance(table(acc, source, dataset="t").sum(
        "x", lower=0, upper=10, epsilon=1.0, max_rows_per_unit=3).release(), float)
    for mark in seen.iterdir():
        mark.unlink()
    monkeypatch.setattr(spark_keys, "copy", lambda native: native)
    with pytest.raises(InvalidDataError):
        table(acc, source, dataset="t").sum("x", lower=0, upper=10, epsilon=1.0,
                                            max_rows_per_unit=3).release()


def test_a_job_that_fails_after_the_debit_releases_nothing_once_and_hides_the_seed(
        spark: Any, monkeypatch: Any, caplog: Any, tmp_path: Path) -> None:
    """The bounding job fails on the executors (``raise_error``) after the debit: nothing is
    released, the budget stays spent, one record, the keys computed once (no retry); and the
    post-debit seed is in no record, ledger byte, log line or error."""
    from pyspark.sql import functions as F
    seeds, calls = [], []
    real = spark_keys.keys

    def failing(native: Any, rng: np.random.Generator, columns: Any, key: str) -> Any:
        seeds.append(copy.deepcopy(rng).bytes(32).hex())  # (the seed ``keys`` will draw)
        calls.append(1)
        out = real(native, rng, columns, key)
        return out.withColumn(key, F.when(F.col(key) >= 0, F.raise_error(F.lit("lost")))
                              .otherwise(F.col(key)).cast("double"))

    monkeypatch.setattr(spark_keys, "keys", failing)
    ledger = SqliteLedger(tmp_path / "ledger.db")
    acc = dp.Accountant(limits={"t": dp.DatasetLimit(limit=dp.Budget(10.0),
                                                     privacy_unit="unit")},
                        ledger=ledger)
    before = len(list(ledger.entries()))  # (the policy's record)
    t = table(acc, _spark.frame(spark, small_table(3, units=4)), dataset="t")
    query = t.group_by("group", keys=["a", "b", "c"]).count(epsilon=1.0, max_rows_per_unit=3)
    with caplog.at_level(logging.DEBUG), pytest.raises(InvalidDataError) as raised:
        query.release()
    assert "the debit stands" in str(raised.value) + " ".join(raised.value.__notes__ or [])
    assert acc.spent("t").epsilon == pytest.approx(1.0) and len(calls) == 1
    assert len(list(ledger.entries())) == before + 1
    seed = seeds[0]
    said = [str(raised.value), repr(raised.value), *(raised.value.__notes__ or []),
            caplog.text, repr(query), *(e.text for e in ledger.entries())]
    assert not any(seed[:16] in s for s in said)
    assert seed[:16].encode() not in (tmp_path / "ledger.db").read_bytes()
    assert "lost" not in str(raised.value)  # (the engine's message is withheld)


def test_a_spark_frame_is_read_through_narwhals_with_the_same_schema(spark: Any) -> None:
    pdf = small_table(0)
    opened = frames.open_frame(_spark.frame(spark, pdf))
    assert opened.kind == "spark"
    assert opened.schema == {"unit": nw.Int64(), "group": nw.String(), "x": nw.Float64()}


def test_negative_control_a_seed_passed_as_a_literal_is_in_the_debug_log(
        spark: Any, monkeypatch: Any, caplog: Any) -> None:
    """Why the seed reaches the executors as a row of data: as a literal of the expression
    (the first version of ``keys``), py4j's DEBUG log line of the call carries it."""
    seeds = []

    def literal(native: Any, rng: np.random.Generator, columns: Any, key: str) -> Any:
        seeds.append(copy.deepcopy(rng).bytes(32).hex())
        return _shared_keys(native, rng, columns, key)

    monkeypatch.setattr(spark_keys, "keys", literal)
    t = table(_acc(), _spark.frame(spark, small_table(3, units=4).rename(
        columns={"unit": PERSON})), dataset="events")
    with caplog.at_level(logging.DEBUG):
        t.count(epsilon=1.0, max_rows_per_unit=3).release()
    assert seeds[0][:16] in caplog.text
