"""The table queries on Spark (dpbudget.accountant.tables.spark), local mode, one session.

The attacks: a Spark frame gives one unit more influence than its bounds (brute force, every
unit removed, with a row-level negative control); a recomputed stage keys a unit's rows
differently from the first computation (negative control: the row ids of a source that is not
the checkpoint); identical rows sharing one key change the bounding's law (negative control: the
shared key re-created, which keeps {A, A} of A, A, B half the time, not a third), and so do two
rows a microsecond apart (negative control: the old keys, a hash of the row's JSON); a source
evaluated twice (the frame raises on its second evaluation; negative control: no checkpoint); a
job failing after the debit releases something, retries and spends twice, or keeps the engine's
message as the error's context; a query's checkpoint left on the executors; the post-debit seed
in a record, a log line or an error.
A unit (or unit × group) of exactly L or L + 1 rows keeps other than min(n, L) rows under
Spark's one window (negative control: a window off by one). And the five queries answer alike
on pandas, DuckDB and Spark: identically where no bound truncates, with the same law where one
does.
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
from dpbudget.examples.events import events_frame

from tests import _spark
from tests.tables._tables import (PERSON, context_texts, events_accountant, five_queries,
                                  old_engine, small_table)

ALPHA = 1e-6
pytestmark = _spark.MARKS


_acc, _five = events_accountant, five_queries


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


def _shared_keys(native: Any, rng: np.random.Generator, key: str) -> Any:
    """The broken keys: a hash of the seed and the row alone (identical rows share a key)."""
    from pyspark.sql import functions as F
    text = F.concat_ws("|", F.lit(rng.bytes(32).hex()), F.to_json(F.struct(*native.columns)))
    bits = F.conv(F.substring(F.sha2(text, 256), 1, 13), 16, 10).cast("long")
    return native.withColumn(key, bits.cast("double") / float(1 << 52))


def _json_keys(native: Any, rng: np.random.Generator, key: str) -> Any:
    """The old keys: SHA-256 of the seed, the row's JSON and its occurrence index among rows
    equal in every column (``to_json`` writes a timestamp to the millisecond)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    copies = Window.partitionBy(*native.columns).orderBy(F.lit(0))
    text = F.concat_ws("|", F.lit(rng.bytes(32).hex()), F.row_number().over(copies).cast(
        "string"), F.to_json(F.struct(*native.columns)))
    bits = F.conv(F.substring(F.sha2(text, 256), 1, 13), 16, 10).cast("long")
    return native.withColumn(key, bits.cast("double") / float(1 << 52))


_L = 3
_N = frames.inner(["unit", "group", "id"])


def _kept_per_partition(spark: Any, by_group: bool, tied: bool, seed: int) -> tuple[Any, ...]:
    """Per unit (× group with ``by_group``) of 1..L+2 rows — exactly L and L+1 among them — with
    given keys (distinct, or ``tied`` on a grid of 4): the rows kept on Spark per partition, the
    partition's min(n, L), and the ids Spark and pandas' split keep for the same keys."""
    rng, rows = np.random.default_rng(seed), []
    for u in range(40):
        for g, n in zip("ab", (u % (_L + 2) + 1, (u // (_L + 2)) % (_L + 2) + 1)):
            rows += [(u, g)] * n
    pdf = pd.DataFrame(rows, columns=[_N["unit"], _N["group"]])
    pdf[_N["id"]] = np.arange(len(pdf))
    pdf[KEY] = rng.integers(0, 4, len(pdf)) / 4 if tied else rng.permutation(len(pdf)) / len(pdf)
    part = [_N["unit"], _N["group"]] if by_group else [_N["unit"]]
    c = Contribution(groups=2, per_group=_L, total=_L, by_group=by_group)

    def kept(keyed: Any) -> list[int]:
        found = frames.collect(bounding.kept_rows(keyed, _N["unit"], part[1:], c).select(
            _N["id"]))
        return sorted(int(i) for i in found[_N["id"]])

    on_spark = kept(nw.from_native(_spark.frame(spark, pdf)))
    counts = pdf.set_index(_N["id"]).loc[on_spark].groupby(part).size().to_dict()
    bound = pdf.groupby(part).size().clip(upper=_L).to_dict()
    return counts, bound, on_spark, kept(nw.from_native(pdf).lazy())


@pytest.mark.parametrize("by_group", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_each_partition_keeps_min_of_its_rows_and_the_bound(spark: Any, by_group: bool,
                                                            tied: bool) -> None:
    """Spark ranks every row with one window (the in-memory engines keep partitions of at most L
    rows whole, unranked): each unit (or unit × group) of n rows keeps exactly min(n, L), at
    n = L and L + 1 too and with tied keys; with distinct keys, the very rows pandas keeps."""
    for seed in range(3):
        counts, bound, on_spark, in_pandas = _kept_per_partition(spark, by_group, tied, seed)
        assert counts == bound
        if not tied:
            assert on_spark == in_pandas


def test_a_window_keeping_one_row_less_is_caught(spark: Any, monkeypatch: Any) -> None:
    """Negative control for the test above: a Spark window that keeps rank < L (a unit of L rows
    loses one) fails it, as does one keeping rank <= L + 1."""
    first = bounding._first
    for shift in (-1, 1):
        monkeypatch.setattr(bounding, "_first",
                            lambda rows, part, limit, s=shift: first(rows, part, limit + s))
        counts, bound, _, _ = _kept_per_partition(spark, True, False, 0)
        assert counts != bound


@pytest.mark.statistical
def test_duplicated_rows_are_bounded_with_the_law_of_iid_keys(spark: Any,
                                                              monkeypatch: Any) -> None:
    """600 units of rows A, A, B (x = 1, 1, 5), two rows kept: {A, A} (sum 2) with probability
    1/3, as with numpy's iid keys on pandas; a binomial test at α = 1e-6. Which of the two A's
    is kept changes no sum. The same law from the same rows in other partitions and another
    order (which row gets which key changes, not the law). Negative control: one key per
    distinct row keeps {A, A} half the time, and the same test rejects it."""
    units = 600
    pdf = pd.DataFrame({"unit": np.repeat(np.arange(units), 3),
                        "x": np.tile([1.0, 1.0, 5.0], units)})
    c = Contribution(groups=2, per_group=2, total=2, by_group=False)
    source = _spark.frame(spark, pdf)
    rows = frames.open_frame(source).read(["unit", "x"])
    sums = _kept_sums(frames.keyed(rows, np.random.default_rng(1), "spark"), c)
    assert set(sums) <= {2.0, 6.0}
    assert stats.binomtest(int((sums == 2.0).sum()), units, 1 / 3).pvalue > ALPHA
    from pyspark.sql import functions as F
    moved = frames.open_frame(source.repartition(3, "x").orderBy(F.col("unit").desc())).read(
        ["unit", "x"])
    moved_sums = _kept_sums(frames.keyed(moved, np.random.default_rng(1), "spark"), c)
    assert stats.binomtest(int((moved_sums == 2.0).sum()), units, 1 / 3).pvalue > ALPHA
    local = frames.open_frame(pdf).read(["unit", "x"])
    numpy_sums = _kept_sums(frames.keyed(local, np.random.default_rng(1), "pandas"),
                            c)
    assert stats.binomtest(int((numpy_sums == 2.0).sum()), units, 1 / 3).pvalue > ALPHA
    monkeypatch.setattr(spark_keys, "keys", _shared_keys)
    shared = _kept_sums(frames.keyed(rows, np.random.default_rng(1), "spark"), c)
    assert stats.binomtest(int((shared == 2.0).sum()), units, 1 / 3).pvalue < ALPHA


def test_a_recomputed_stage_gets_the_same_keys_from_the_checkpoint(spark: Any,
                                                                  tmp_path: Path) -> None:
    """The keys of the filtered copy, computed by two jobs (what two stages of the bounding, or
    a task retried on its stored block, do), are the same row by row, and distinct (identical
    rows too); another seed, other keys. Negative control: on a source that is not a checkpoint
    and whose row order changes between evaluations (sorted by a nondeterministic UDF), the row
    ids, hence the keys, of the same rows differ between two jobs."""
    import random

    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType
    pdf = small_table(5, units=6, max_rows=8)
    pdf = pd.concat([pdf, pdf.head(3)], ignore_index=True)  # (identical rows too)
    copy_ = spark_keys.copy(_spark.frame(spark, pdf)).filter(F.col("x") > 0)

    def keyed(frame: Any, seed: int) -> list[tuple[Any, ...]]:
        out = spark_keys.keys(frame, np.random.default_rng(seed), KEY)
        return sorted(tuple(r) for r in out.collect())

    first = keyed(copy_, 4)
    assert first == keyed(copy_, 4) and len(first) == int((pdf["x"] > 0).sum())
    assert len({k for *_, k in first}) == len(first)  # (identical rows: distinct keys)
    assert first != keyed(copy_, 5)  # (another seed, other keys)
    shuffled = _spark.frame(spark, pdf.drop_duplicates()).orderBy(
        F.udf(lambda _: random.random(), DoubleType()).asNondeterministic()("x"))
    assert keyed(shuffled, 4) != keyed(shuffled, 4)


def test_one_unit_moves_each_spark_aggregate_by_at_most_its_sensitivity(spark: Any) -> None:
    """Brute force on Spark: every unit of a small table removed, for two seeds, moves each
    aggregate vector by at most its formula; coupled keys (the rows both tables share keep
    their keys: the neighbour is the keyed table less the unit's rows). Negative control: the
    change exceeds 1, the row-level sensitivity of a count."""
    from pyspark.sql import functions as F
    c = Contribution(groups=2, per_group=2, total=4, by_group=True)
    pdf = small_table(2, units=3, max_rows=8)
    n = frames.inner(["unit", "group", "x"])
    rows = frames.open_frame(_spark.frame(spark, pdf)).read(["unit", "group", "x"])

    def per_group(seed: int, unit: Any = None) -> dict[str, np.ndarray]:
        keyed = frames.keyed(rows, np.random.default_rng(seed), "spark")
        if unit is not None:
            keyed = nw.from_native(keyed.to_native().filter(F.col(n["unit"]) != int(unit)))
        found = frames.collect(bounding.per_group(keyed, n["unit"], [n["group"]], c, n["x"],
                                                  0.0, 10.0))
        at = {g: i for i, g in enumerate(found[n["group"]].tolist())}
        return {name: np.array([float(found[name][at[g]]) if g in at else 0.0
                                for g in "abc"])
                for name in (bounding.ROWS, bounding.UNITS, bounding.SUM)}

    worst = dict.fromkeys((bounding.ROWS, bounding.UNITS, bounding.SUM), 0.0)
    for seed in (0, 1):
        full = per_group(seed)
        for unit in pdf["unit"].unique():
            less = per_group(seed, unit)
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

    def failing(native: Any, rng: np.random.Generator, key: str) -> Any:
        seeds.append(copy.deepcopy(rng).bytes(32).hex())  # (the seed ``keys`` will draw)
        calls.append(1)
        out = real(native, rng, key)
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
    assert "lost" not in str(raised.value)  # (the engine's message is withheld, and not
    assert raised.value.__context__ is None and raised.value.__cause__ is None  # chained)
    monkeypatch.setattr(frames, "engine", old_engine)  # (negative control: raised in the
    with pytest.raises(InvalidDataError) as old:       # handler, the context keeps the text)
        t.group_by("group", keys=["a", "b", "c"]).count(epsilon=1.0,
                                                        max_rows_per_unit=3).release()
    assert "lost" in context_texts(old.value)


def test_a_spark_error_before_the_debit_keeps_no_data_in_its_context(spark: Any,
                                                                    monkeypatch: Any) -> None:
    """A Spark job that fails on a cell while reading the copy (its message quotes the cell,
    as ``[CAST_INVALID_INPUT] The value '...'`` does): refused, nothing spent, and neither the
    message nor ``__context__`` nor ``__cause__`` holds the cell. Negative control: the old
    wrapper keeps it in ``__context__``."""
    from pyspark.sql import functions as F
    secret = "SSN-123-45-6789"
    source = _spark.frame(spark, pd.DataFrame({"unit": [1, 2], "s": ["1.5", secret]}))
    source = source.withColumn("x", F.when(F.col("s") == secret, F.raise_error(F.concat(
        F.lit("The value '"), F.col("s"), F.lit("' cannot be cast")))).otherwise(
        F.col("s").cast("double"))).drop("s")
    acc = _acc()
    query = table(acc, source.withColumnRenamed("unit", PERSON), dataset="events").sum(
        "x", lower=0, upper=10, epsilon=1.0, max_rows_per_unit=1)
    with pytest.raises(InvalidDataError) as raised:
        query.release()
    assert secret not in str(raised.value) and acc.spent("events").epsilon == 0.0
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    monkeypatch.setattr(frames, "engine", old_engine)
    with pytest.raises(InvalidDataError) as old:
        query.release()
    assert secret in context_texts(old.value)


def test_each_query_frees_its_checkpoint(spark: Any, monkeypatch: Any) -> None:
    """Five queries, two of them refused (the budget is spent), leave no checkpoint on the
    executors. Negative control: without ``frames.free`` each query's copy stays (five more
    persistent RDDs)."""
    def persistent() -> set[int]:
        return set(dict(spark.sparkContext._jsc.getPersistentRDDs()))

    def five() -> int:  # (the RDDs persisted by these queries alone: other tests' copies may be
        before = persistent()  # cleaned meanwhile, once their frames are garbage-collected)
        acc = dp.Accountant(limits={"t": dp.DatasetLimit(limit=dp.Budget(3.0),
                                                         privacy_unit="unit")}, rng=0)
        t = table(acc, _spark.frame(spark, small_table(3, units=4)), dataset="t")
        for _ in range(5):
            try:
                t.count(epsilon=1.0, max_rows_per_unit=3).release()
            except dp.BudgetExceededError:
                pass
        assert acc.spent("t").epsilon == pytest.approx(3.0)
        return len(persistent() - before)

    assert five() == 0
    kept: list[Any] = []  # (held, as a long-lived caller would: else Spark's cleaner may drop
    monkeypatch.setattr(frames, "free", lambda copy, kind: kept.append(copy))  # a collected one)
    assert five() == 5


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

    def literal(native: Any, rng: np.random.Generator, key: str) -> Any:
        seeds.append(copy.deepcopy(rng).bytes(32).hex())
        return _shared_keys(native, rng, key)

    monkeypatch.setattr(spark_keys, "keys", literal)
    t = table(_acc(), _spark.frame(spark, small_table(3, units=4).rename(
        columns={"unit": PERSON})), dataset="events")
    with caplog.at_level(logging.DEBUG):
        t.count(epsilon=1.0, max_rows_per_unit=3).release()
    assert seeds[0][:16] in caplog.text


def test_two_rows_a_microsecond_apart_get_distinct_keys(spark: Any, monkeypatch: Any) -> None:
    """Two rows of one unit whose timestamps differ by a microsecond: distinct keys (each
    row's id on the copy). Negative control: the old keys — the row's JSON, which writes a
    timestamp to the millisecond, and its occurrence index among rows equal in every column
    (1 for both) — give the two rows one key."""
    import datetime
    at = datetime.datetime(2026, 11, 27, 12, 0, 0, 1000)
    source = spark.createDataFrame([(1, at), (1, at + datetime.timedelta(microseconds=1))],
                                   "unit bigint, ts timestamp")
    rows = frames.open_frame(source).read(["unit", "ts"])

    def keys() -> set[float]:
        out = frames.keyed(rows, np.random.default_rng(0), "spark").to_native()
        return {r[KEY] for r in out.select(KEY).collect()}

    assert len(keys()) == 2
    monkeypatch.setattr(spark_keys, "keys", _json_keys)
    assert len(keys()) == 1
