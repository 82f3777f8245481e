"""The user's frames (dpbudget.accountant.tables.frames): pandas, Polars (eager and lazy), a DuckDB
relation, Parquet and CSV paths all give the same bounded aggregates for the same keys; a bad
frame or column is refused with a typed error that names the column and never shows a value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pytest

from dpbudget.accountant.tables import bounding, frames
from dpbudget.accountant.tables.sensitivities import Contribution
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataError,
                                               InvalidDataTypeError, InvalidTypeError)
from dpbudget.examples.events import events_frame, write_events

CANARY = "CANARY-7f3a"


def _all_kinds(tmp_path: Path) -> dict[str, Any]:
    pdf = events_frame(persons=300, seed=3)
    parquet = write_events(tmp_path / "e.parquet", persons=300, seed=3)
    csv = write_events(tmp_path / "e.csv", persons=300, seed=3)
    return {"pandas": pdf, "polars": pl.DataFrame(pdf), "polars-lazy": pl.DataFrame(pdf).lazy(),
            "duckdb": duckdb.from_df(pdf), "parquet": parquet, "csv": str(csv)}


def _aggregates(frame: Any) -> dict[str, list[Any]]:
    opened = frames.open_frame(frame)
    keyed = opened.keyed(np.random.default_rng(42))
    pairs = bounding.unit_groups(keyed, "person_id", ["region"], Contribution(3, 2, 6, True),
                                 "amount", 0.0, 1000.0)
    found = frames.collect(bounding.per_group(pairs, ["region"]))
    order = np.argsort(found["region"].astype(str))
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
    opened = frames.open_frame(frame)
    k1 = frames.collect(opened.keyed(np.random.default_rng(1)).select(frames.KEY))
    k2 = frames.collect(opened.keyed(np.random.default_rng(2)).select(frames.KEY))
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
        frames.check_values(frames.open_frame(native), "u", ["g"], "x")
    assert f"'{column}'" in str(err.value) and "987654" not in _message(err.value)


def test_clean_values_pass() -> None:
    frames.check_values(_frame(u=[1, 2], g=["a", "b"], x=[1.0, 2.0]), "u", ["g"], "x")


def test_a_key_of_another_type_than_its_column_is_refused() -> None:
    frame = _frame(u=[1], g=["a"], d=[3], x=[1.0])
    frames.check_keys(frame, ["g", "d"], [("a", 3), ("b", 4)])
    with pytest.raises(InvalidTypeError):
        frames.check_keys(frame, ["g"], [1])
    with pytest.raises(InvalidTypeError):
        frames.check_keys(frame, ["d"], ["3"])
