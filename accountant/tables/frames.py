"""The user's frame, as one lazy narwhals frame, with the random keys the bounding ranks by.

Invariant: whatever the user passes — a pandas DataFrame, a Polars DataFrame or LazyFrame, a
DuckDB relation, or a ``.parquet``/``.csv`` path (read by an embedded, in-memory DuckDB, the
default engine for files) — the table layer sees one ``narwhals.LazyFrame`` and runs the filters,
the bounding and the aggregation in the frame's own engine; only aggregates (one row per group,
or per candidate bin) are collected into Python. No value of the data appears in an error: a
column is named, with its type, never a value.

Why narwhals, not Ibis: narwhals is a thin, dependency-free layer over the user's own objects —
it runs a pandas frame in pandas, a Polars frame in Polars and a DuckDB relation in DuckDB, with
the window functions the bounding needs (``rank().over(...)``) — while Ibis would translate every
frame into an Ibis table and its own backend connection (pandas support was removed in Ibis 10:
a pandas frame would be copied into DuckDB first), and weighs tens of packages.

The keys. Every row gets an iid uniform key, drawn as a numpy column from the generator the gate
hands the query after its debit (``dpbudget.accountant.gate.bounded``), and attached by position:
a column for pandas and Polars, a horizontal concatenation for a Polars LazyFrame, a
``POSITIONAL JOIN`` for DuckDB. Not DuckDB's ``setseed``/``random()``: its seed is one double
and its per-thread generators make the keys depend on the thread schedule, so the same seed would
not bound the same rows in every engine; numpy keys do (tests/tables/test_frames.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataError,
                                               InvalidDataTypeError, InvalidTypeError)

__all__ = ["KEY", "Frame", "check_columns", "check_keys", "check_values", "collect",
           "open_frame"]

KEY = "__dpbudget_key"  # ranks a unit's rows, and (through each group's minimum) its groups


class Frame:
    """The user's frame, opened: its lazy narwhals form, and how to attach keys by position.

    Attributes:
        lazy: the frame as a ``narwhals.LazyFrame`` (without keys).
        kind: ``"pandas"``, ``"polars"``, ``"polars-lazy"`` or ``"duckdb"``.
    """

    def __init__(self, native: Any, kind: str) -> None:
        import narwhals as nw
        self.native = native
        self.kind = kind
        frame = nw.from_native(native)
        self.lazy: Any = frame.lazy() if isinstance(frame, nw.DataFrame) else frame
        self.schema: dict[str, Any] = dict(self.lazy.collect_schema())

    def rows(self) -> int:
        """The number of rows (one aggregate, in the engine)."""
        if self.kind in ("pandas", "polars"):
            return len(self.native)
        if self.kind == "polars-lazy":
            import polars as pl
            return int(self.native.select(pl.len()).collect().item())
        return int(self.native.aggregate("count(*)").fetchall()[0][0])

    def keyed(self, rng: np.random.Generator) -> Any:
        """The lazy frame with ``KEY``: an iid uniform [0, 1) key from ``rng`` for each row,
        attached by the row's position."""
        import narwhals as nw
        key = rng.random(self.rows())
        if self.kind in ("pandas", "polars"):
            eager = nw.from_native(self.native, eager_only=True)
            backend = nw.get_native_namespace(eager)
            return eager.with_columns(nw.new_series(KEY, key, nw.Float64(),
                                                    backend=backend)).lazy()
        if self.kind == "polars-lazy":
            import polars as pl
            keys = pl.LazyFrame({KEY: key})
            return nw.from_native(pl.concat([self.native, keys], how="horizontal"))
        import pyarrow as pa
        _keys = pa.table({KEY: key})  # (found by name by DuckDB's scan)
        return nw.from_native(self.native.query(
            "_dpbudget_rows", "SELECT * FROM _dpbudget_rows POSITIONAL JOIN _keys"))


def open_frame(frame: Any) -> Frame:
    """The user's frame, opened (nothing is read yet but the schema).

    Raises:
        InvalidTypeError: not a frame this layer reads.
        InvalidArgumentError: a path that does not end in ``.parquet`` or ``.csv``, or that does
            not exist.
    """
    if isinstance(frame, (str, os.PathLike)):
        path = Path(frame)
        if path.suffix not in (".parquet", ".csv"):
            raise InvalidArgumentError("frame", "a path", "a path ending in .parquet or .csv")
        if not path.is_file():
            raise InvalidArgumentError("frame", "a path", "a file that exists")
        import duckdb
        con = duckdb.connect()  # embedded, in memory: the file is scanned, never loaded whole
        rel = con.read_parquet(str(path)) if path.suffix == ".parquet" else \
            con.read_csv(str(path))
        return Frame(rel, "duckdb")
    module = type(frame).__module__.split(".")[0]
    name = type(frame).__name__
    if module == "pandas" and name == "DataFrame":
        return Frame(frame, "pandas")
    if module == "polars" and name in ("DataFrame", "LazyFrame"):
        return Frame(frame, "polars" if name == "DataFrame" else "polars-lazy")
    if module in ("duckdb", "_duckdb") and name == "DuckDBPyRelation":
        return Frame(frame, "duckdb")
    raise InvalidTypeError("frame", frame, "a pandas DataFrame, a Polars DataFrame or "
                           "LazyFrame, a DuckDB relation, or a .parquet or .csv path")


def check_columns(frame: Frame, unit: str, groups: Sequence[str], value: str | None) -> None:
    """The columns a query names exist and have types it can use (the schema only: nothing is
    read, nothing depends on a value).

    Raises:
        InvalidArgumentError: a column the frame does not have.
        InvalidDataTypeError: a unit column of mixed or non-id type (ids are integers or
            strings), or a value column that is not numeric.
    """
    import narwhals as nw
    for column in (unit, *groups, *(() if value is None else (value,))):
        if column not in frame.schema:
            raise InvalidArgumentError("column", column, "a column of the frame")
    dtype = frame.schema[unit]
    if not (dtype.is_integer() or dtype in (nw.String, nw.Categorical, nw.Enum)):
        raise InvalidDataTypeError(f"column {unit!r}", dtype, "one id type per "
                                   "unit column: integers or strings, not mixed or other types "
                                   "(a pandas integer column with nulls is float: drop or fill "
                                   "the nulls, or use the nullable Int64)")
    if value is not None and not frame.schema[value].is_numeric():
        raise InvalidDataTypeError(f"column {value!r}", frame.schema[value],
                                   "a numeric column")


def check_keys(frame: Frame, groups: Sequence[str], keys: Sequence[Any],
               argument: str = "keys") -> None:
    """Each public key (or filter constant: ``argument``) has the type of its column (a str for a
    string column, an int for an integer one, a real number for a float one): a key of another
    type would match no row, and its noisy 0 would hide the mistake; a filter constant of another
    type would fail in the engine after the debit.

    Raises:
        InvalidTypeError: a key of another type, naming the column (a key is public: shown).
    """
    import numbers

    import narwhals as nw
    for key in keys:
        parts = key if len(groups) > 1 else (key,)
        for column, part in zip(groups, parts):
            dtype = frame.schema[column]
            ok = isinstance(part, str) if dtype in (nw.String, nw.Categorical, nw.Enum) else \
                isinstance(part, numbers.Integral) and not isinstance(part, bool) \
                if dtype.is_integer() else isinstance(part, numbers.Real) \
                if dtype.is_numeric() else True
            if not ok:
                raise InvalidTypeError(argument, part, f"values of column {column!r}'s type "
                                       f"({dtype})")


def check_values(frame: Frame, unit: str, groups: Sequence[str], value: str | None) -> None:
    """No null unit or group, and no null, NaN or infinite value: one aggregate pass in the
    engine, before the debit (a bad frame is refused with nothing spent).

    Raises:
        InvalidDataError: naming the column and what it holds (a count of bad rows is not
            shown: it is data).
    """
    import narwhals as nw
    exprs = [nw.col(c).is_null().sum().alias(c) for c in (unit, *groups)]
    if value is not None:
        bad = nw.col(value).is_null() | ~nw.col(value).cast(nw.Float64()).is_finite()
        exprs.append(bad.fill_null(True).sum().alias(value))
    found = collect(frame.lazy.select(*exprs))
    for column, counts in found.items():
        if int(counts[0] or 0):
            what = "null, NaN or infinite values" if column == value else "null values"
            raise InvalidDataError(f"column {column!r}", frame.schema[column], f"a column with "
                                   f"no {what}")


def collect(lazy: Any) -> dict[str, np.ndarray]:
    """An aggregate's columns as numpy arrays (the only data that reaches Python)."""
    frame = lazy.collect()
    return {name: frame[name].to_numpy() for name in frame.columns}
