"""The user's frames (dpbudget.accountant.tables.frames): pandas, Polars (eager and lazy), a DuckDB
relation, Parquet and CSV paths all give the same bounded aggregates for the same keys; a bad
frame or column is refused with a typed error that names the column and never shows a value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datetime

import duckdb
import narwhals as nw
import numpy as np
import pandas as pd
import polars as pl
import pytest

from dpbudget.accountant.tables import bounding, frames
from dpbudget.accountant.tables.sensitivities import Contribution
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataError,
                                               InvalidDataTypeError, InvalidTypeError)
from dpbudget.examples.events import events_frame, write_events

from tests.tables._tables import context_texts, old_engine, old_keyed

CANARY = "CANARY-7f3a"
COLUMNS = ["person_id", "region", "amount"]
NAMES = frames.inner(["u", "g", "x"])


def _all_kinds(tmp_path: Path) -> dict[str, Any]:
    pdf = events_frame(persons=300, seed=3)
    parquet = write_events(tmp_path / "e.parquet", persons=300, seed=3)
    csv = write_events(tmp_path / "e.csv", persons=300, seed=3)
    return {"pandas": pdf, "polars": pl.DataFrame(pdf), "polars-lazy": pl.DataFrame(pdf).lazy(),
            "duckdb": duckdb.from_df(pdf), "parquet": parquet, "csv": str(csv)}


def _aggregates(frame: Any) -> dict[str, list[Any]]:
    opened = frames.open_frame(frame)
    keyed = frames.keyed(opened.read(COLUMNS), np.random.default_rng(42), opened.kind)
    unit, region, amount = frames.inner(COLUMNS).values()
    found = frames.collect(bounding.per_group(keyed, unit, [region],
                                              Contribution(3, 2, 6, True), amount, 0.0, 1000.0),
                           COLUMNS)
    order = np.argsort(found[region].astype(str))
    return {k: np.asarray(v)[order].tolist() for k, v in found.items()}


def test_every_engine_bounds_the_same_rows_for_the_same_keys(tmp_path: Path) -> None:
    kinds = _all_kinds(tmp_path)
    want = _aggregates(kinds["pandas"])
    for name, frame in kinds.items():
        got = _aggregates(frame)
        assert got[bounding.ROWS] == want[bounding.ROWS], name
        assert got[bounding.UNITS] == want[bounding.UNITS], name
        np.testing.assert_allclose(got[bounding.SUM], want[bounding.SUM], rtol=1e-12)


def test_the_keys_are_drawn_from_the_generator_handed_over() -> None:
    """A different draw keeps different rows; the same draw, the same rows."""
    frame = events_frame(persons=300, seed=3)
    a, b = _aggregates(frame), _aggregates(frame)
    assert a == b
    rows = frames.open_frame(frame).read(COLUMNS)
    k1 = frames.collect(frames.keyed(rows, np.random.default_rng(1), "pandas")
                        .select(frames.KEY), [])
    k2 = frames.collect(frames.keyed(rows, np.random.default_rng(2), "pandas")
                        .select(frames.KEY), [])
    assert not np.array_equal(k1[frames.KEY], k2[frames.KEY])


@pytest.mark.parametrize("bad", [[1, 2], {"a": [1]}, np.zeros(3), 42])
def test_a_frame_of_another_kind_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidTypeError):
        frames.open_frame(bad)


def test_a_path_must_be_parquet_or_csv_and_exist(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        frames.open_frame(tmp_path / "e.json")
    with pytest.raises(InvalidArgumentError):
        frames.open_frame(tmp_path / "missing.parquet")


def _frame(**columns: Any) -> frames.Frame:
    return frames.open_frame(pd.DataFrame(columns))


def _message(err: Exception) -> str:
    return f"{err} {err!r} {err.args} {vars(err)}"


def test_a_missing_column_is_named() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        frames.check_columns(_frame(u=[1], x=[1.0]), "person_id", [], "x")
    assert "person_id" in str(err.value)


def test_mixed_id_types_are_refused_naming_the_column_not_a_value() -> None:
    frame = _frame(u=pd.Series([1, CANARY], dtype=object), x=[1.0, 2.0])
    with pytest.raises(InvalidDataTypeError) as err:
        frames.check_columns(frame, "u", [], "x")
    assert "'u'" in str(err.value) and CANARY not in _message(err.value)


def test_a_value_column_must_be_numeric() -> None:
    with pytest.raises(InvalidDataTypeError) as err:
        frames.check_columns(_frame(u=[1], x=[CANARY]), "u", [], "x")
    assert "'x'" in str(err.value) and CANARY not in _message(err.value)


@pytest.mark.parametrize("kind", ["pandas", "polars", "duckdb"])
@pytest.mark.parametrize("column,values", [
    ("u", {"u": [1.0, None], "g": ["a", "b"], "x": [1.0, 2.0]}),
    ("g", {"u": [1, 2], "g": ["a", None], "x": [1.0, 2.0]}),
    ("x", {"u": [1, 2], "g": ["a", "b"], "x": [987654.321, float("nan")]}),
    ("x", {"u": [1, 2], "g": ["a", "b"], "x": [987654.321, float("inf")]}),
    ("x", {"u": [1, 2], "g": ["a", "b"], "x": [987654.321, None]})])
def test_null_ids_and_non_finite_values_are_refused_naming_the_column(
        kind: str, column: str, values: dict[str, list[Any]]) -> None:
    pdf = pd.DataFrame(values)
    native = {"pandas": pdf, "polars": pl.from_pandas(pdf),
              "duckdb": duckdb.from_df(pdf)}[kind]
    with pytest.raises(InvalidDataError) as err:
        frames.check_values(frames.open_frame(native).read(["u", "g", "x"]), NAMES, "u", ["g"],
                            "x")
    assert f"'{column}'" in str(err.value) and "987654" not in _message(err.value)


def test_clean_values_pass() -> None:
    frames.check_values(_frame(u=[1, 2], g=["a", "b"], x=[1.0, 2.0]).read(["u", "g", "x"]),
                        NAMES, "u", ["g"], "x")


def test_a_key_of_another_type_than_its_column_is_refused() -> None:
    frame = _frame(u=[1], g=["a"], d=[3], x=[1.0])
    frames.check_keys(frame, ["g", "d"], [("a", 3), ("b", 4)])
    with pytest.raises(InvalidTypeError):
        frames.check_keys(frame, ["g"], [1])
    with pytest.raises(InvalidTypeError):
        frames.check_keys(frame, ["d"], ["3"])


def test_the_copy_holds_only_the_columns_read_under_names_of_its_own(tmp_path: Path) -> None:
    """Second review, R1: no user name reaches the bounding, whatever its case (DuckDB matches
    names case-insensitively: ``__DPBUDGET_N`` would stand for ``__dpbudget_n``). The copy holds
    the columns read, each once, under ``inner`` names."""
    pdf = pd.DataFrame({"__DPBUDGET_N": [0, 1], "u": [1, 2], "x": [1.0, 2.0]})
    path = tmp_path / "t.parquet"
    pdf.to_parquet(path, index=False)
    for native in (pdf, pl.from_pandas(pdf), duckdb.from_df(pdf), path):
        frame = frames.open_frame(native)
        names = frames.inner(["u", "__DPBUDGET_N", "u"])
        assert list(names.values()) == [frames.PREFIX + "c0", frames.PREFIX + "c1"]
        rows = frame.read(["u", "__DPBUDGET_N", "u"])
        assert rows.columns == list(names.values())
        assert sorted(rows[names["__DPBUDGET_N"]].to_list()) == [0, 1]


def test_a_filter_constant_or_key_must_be_a_plain_scalar_of_its_column_type() -> None:
    """Review F2: any value passed for a Datetime, Date, Boolean or Object column, so an
    expression (``nw.col("day").max()``) ran as the "constant"; and keys of another type on a
    datetime column were charged and released as noisy zeros."""
    day = datetime.datetime(2026, 1, 1)
    frame = frames.open_frame(pl.DataFrame({"day": [day], "date": [day.date()], "flag": [True],
                                            "x": [1.0], "g": ["a"]}))
    frames.check_keys(frame, ["day", "date", "flag", "x", "g"],
                      [(day, day.date(), True, 2, "b"), (day, day.date(), np.bool_(False),
                                                         np.float64(0.5), "c")])
    for column, bad in [("day", nw.col("day").max()), ("flag", nw.col("x") > nw.col("x").mean()),
                        ("x", nw.col("x").mean()), ("g", nw.col("g")), ("day", "not-a-date"),
                        ("day", 3), ("date", day), ("x", True), ("x", np.array([1.0])),
                        ("g", pd.Series(["a"]))]:
        with pytest.raises(InvalidTypeError):
            frames.check_keys(frame, [column], [bad], argument="value")


def test_a_pandas_object_column_of_mixed_types_is_refused_on_all_its_rows() -> None:
    """Review F3: narwhals types an object column from its first 100 rows; 100 string ids then
    int 7 and str "7" passed as one string column, and person 7 counted as two. The whole
    column is checked (negative control: the schema alone still says String)."""
    ids = pd.Series([f"p{i}" for i in range(100)] + [7] * 30 + ["7"] * 30, dtype=object)
    frame = frames.open_frame(pd.DataFrame({"u": ids, "g": ids.astype(str), "x": 1.0}))
    frames.check_columns(frame, "u", ["g"], "x")  # the sniff is fooled: typed String
    with pytest.raises(InvalidDataTypeError) as err:
        frames.check_values(frame.read(["u", "g", "x"]), NAMES, "u", ["g"], "x")
    assert "'u'" in str(err.value) and "p1" not in _message(err.value)
    frame = frames.open_frame(pd.DataFrame({"u": 1, "g": pd.Series(["a"] * 100 + [1],
                                                                      dtype=object), "x": 1.0}))
    with pytest.raises(InvalidDataTypeError) as err:  # mixed groups: failed in sorted() after
        frames.check_values(frame.read(["u", "g", "x"]), NAMES, "u", ["g"], "x")  # the debit
    assert "'g'" in str(err.value)
    mixed = pd.Series(pd.Categorical([f"p{i}" for i in range(100)] + [7, "7"]))
    frame = frames.open_frame(pd.DataFrame({"u": mixed, "x": 1.0}))
    frames.check_columns(frame, "u", [], "x")  # categorical: typed as text
    with pytest.raises(InvalidDataTypeError):  # but its categories mix int 7 and str "7"
        frames.check_values(frame.read(["u", "x"]), frames.inner(["u", "x"]), "u", [], "x")
    objects = frames.open_frame(pl.DataFrame({"u": [1], "g": [[1, 2]], "x": [1.0]}))
    with pytest.raises(InvalidDataTypeError):  # a list column: no key order, refused unread
        frames.check_columns(objects, "u", ["g"], "x")


def test_a_late_csv_cell_of_another_type_is_refused_by_type_not_quoted(tmp_path: Path) -> None:
    """Review F4: DuckDB sniffed a CSV's types from a sample; a cell ``bob-secret`` in row
    60000 of a DOUBLE column then raised a cast error quoting the whole raw row. The whole
    file is sniffed: the column is text, refused by type, naming it. Negative control: read
    as before (default sample), the engine's own message carries the row."""
    path = tmp_path / "e.csv"
    lines = ["u,d,x"] + [f"{i},30,{i % 7}.5" for i in range(60_000)]
    lines[60_000] = "59999,30,bob-secret"
    path.write_text("\n".join(lines) + "\n")
    frame = frames.open_frame(path)
    with pytest.raises(InvalidDataTypeError) as err:
        frames.check_columns(frame, "u", [], "x")
    assert "'x'" in str(err.value) and "bob-secret" not in _message(err.value)
    with pytest.raises(Exception) as raw:
        duckdb.connect().read_csv(str(path)).select("x").fetchall()
    assert "bob-secret" in str(raw.value)


def test_an_engine_error_is_typed_and_never_quotes_the_data(monkeypatch: Any) -> None:
    """Review F4: every engine call is wrapped; the error names the columns read, never the
    engine's text, not even chained: no ``__context__`` (negative controls: the raw engine
    error quotes the cell; the old wrapper, raising inside its handler, kept it there)."""
    con = duckdb.connect()
    rel = con.sql(f"SELECT u, CAST(s AS DOUBLE) AS x FROM (VALUES (1, '1.0'), (2, '{CANARY}'))"
                  " t(u, s)")
    frame = frames.open_frame(rel)
    with pytest.raises(InvalidDataError) as err:
        frame.read(["u", "x"])
    assert "'x'" in str(err.value) and CANARY not in _message(err.value)
    assert err.value.__cause__ is None and err.value.__context__ is None
    with pytest.raises(Exception) as raw:
        rel.fetchall()
    assert CANARY in str(raw.value)
    monkeypatch.setattr(frames, "engine", old_engine)
    with pytest.raises(InvalidDataError) as old:
        frame.read(["u", "x"])
    assert CANARY not in str(old.value) and CANARY in context_texts(old.value)


def test_a_source_that_changes_between_evaluations_is_read_once() -> None:
    """Review F6: a LazyFrame evaluated once per step (a count, the check, the keying) could
    pass the check on one version and be bounded on another. It is evaluated once per query:
    the check and the keys see the same copy. Negative control: two collects differ."""
    calls = []

    def changing(s: pl.Series) -> pl.Series:
        calls.append(1)  # clean on the first evaluation, NaN from the second on
        return s if len(calls) == 1 else s * float("nan")

    lazy = pl.LazyFrame({"u": [1, 2, 3], "x": [1.0, 2.0, 3.0]}).with_columns(
        pl.col("x").map_batches(changing, return_dtype=pl.Float64))
    frame = frames.open_frame(lazy)
    rows = frame.read(["u", "x"])
    names = frames.inner(["u", "x"])
    frames.check_values(rows, names, "u", [], "x")
    found = frames.collect(frames.keyed(rows, np.random.default_rng(0), frame.kind)
                           .select(nw.col(names["x"]).sum()))
    assert found[names["x"]][0] == 6.0 and len(calls) == 1
    assert lazy.collect()["x"].is_nan().all()  # the source did change


def _threads_of_queries(path: Path, threads: int = 8, each: int = 10) -> tuple[int, list[str]]:
    """``threads`` threads of ``each`` mixed table queries on the Parquet file ``path`` through
    one accountant: (records debited, the notes of every query that failed after its debit)."""
    import concurrent.futures

    import dpbudget as dp
    from dpbudget.accountant.tables.builder import table
    acc = dp.Accountant(limits={"e": dp.DatasetLimit(limit=dp.Budget(1e6, 0.5),
                                                     privacy_unit="person_id")}, rng=0)
    queries = [lambda t: t.count(epsilon=1.0, max_rows_per_unit=3),
               lambda t: t.sum("amount", lower=0, upper=100, epsilon=1.0, max_rows_per_unit=3),
               lambda t: t.group_by("region").count(epsilon=1.0, delta=1e-6,
                                                    max_rows_per_unit=3),
               lambda t: t.median("amount", lower=0, upper=100, epsilon=1.0,
                                  max_rows_per_unit=3)]

    def run(worker: int) -> list[str]:
        failed = []
        for i in range(each):
            query = queries[(worker + i) % len(queries)](table(acc, path, dataset="e"))
            try:
                query.release()
            except InvalidDataError as error:  # (after the debit: "the debit stands")
                failed.append(" ".join([str(error), *getattr(error, "__notes__", [])]))
        return failed

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        failures = [note for notes in pool.map(run, range(threads)) for note in notes]
    return len(list(acc.ledger.entries())), failures


def test_concurrent_duckdb_queries_of_one_process_never_fail_after_their_debit(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Issue 35: 8 threads × 10 mixed queries on a DuckDB source (a Parquet file, as the query
    service serves) through one accountant: every one answers, none fails after its debit —
    each query's DuckDB step runs on a connection of its own. Negative control: the old keying
    (narwhals' ``lazy(backend="duckdb")``, the copy registered as "_df" on DuckDB's default
    connection) makes threads' queries collide, and some fail with the debit standing."""
    path = write_events(tmp_path / "e.parquet", persons=300, seed=3)
    records, failures = _threads_of_queries(path)
    assert failures == [] and records == 80  # (one record per query)
    monkeypatch.setattr(frames, "keyed", old_keyed)
    records, failures = _threads_of_queries(path)
    assert failures and all("the debit stands" in note for note in failures)
