"""The user's frame: opened as one narwhals frame, read once per query, keyed after the debit.

Invariant: whatever the user passes — a pandas DataFrame, a Polars DataFrame or LazyFrame, a
DuckDB relation, a PySpark DataFrame, or a ``.parquet``/``.csv`` path (read by an embedded,
in-memory DuckDB, the default engine for files) — a query reads the columns it names ONCE, before
the debit, into one copy (``Frame.read``: in memory; on Spark a ``localCheckpoint`` on the
executors, ``dpbudget.accountant.tables.spark``); that copy is checked (``check_values``, on
every row read) and filtered, and after the debit the same copy is keyed (``keyed``) and
bounded and aggregated in the frame's own engine (pandas, Polars, DuckDB over the Arrow copy, or
Spark). A source that changes between evaluations (a LazyFrame with a random step, a file
rewritten) cannot pass the checks on one version and be bounded on another, and a filter the
engine cannot run is a refusal that spends nothing (on Spark, whose filter is lazy, only one it
cannot analyse: one that fails while running fails after the debit). Only aggregates reach
Python; the copy is freed once the query is done (``free``). No value of the data appears in an
error, nor in its ``__context__``: every engine call is wrapped (``engine``), and its error
re-raised typed, naming columns, never a value (a DuckDB cast error carries whole raw rows).

No user column name reaches the bounding: the copy holds only the columns the query reads,
each under a name of this layer's own (``inner``: ``PREFIX`` + ``c0``, ``c1``, ...), so a user
column can never stand in for a helper column (``__dpbudget_n`` once did, and kept every unit
whole; DuckDB matches names case-insensitively, so no check of the user's names could be
complete).

Why narwhals, not Ibis: narwhals is a thin, dependency-free layer over the user's own objects —
it runs a pandas frame in pandas, a Polars frame in Polars and a DuckDB relation in DuckDB, with
the window functions the bounding needs (``rank().over(...)``) — while Ibis would translate every
frame into an Ibis table and its own backend connection (pandas support was removed in Ibis 10:
a pandas frame would be copied into DuckDB first), and weighs tens of packages.

The keys. Every row gets an iid uniform key, drawn as a numpy column from the generator the gate
hands the query after its debit (``dpbudget.accountant.gate.bounded``), and attached to the
in-memory copy as a column. Not DuckDB's ``setseed``/``random()``: its seed is one double and
its per-thread generators make the keys depend on the thread schedule, so the same seed would
not bound the same rows in every engine; numpy keys do (tests/tables/test_frames.py). A DuckDB
copy is queried on a connection of the query's own, never DuckDB's default one (threads' queries
would collide there, after their debit). On Spark: ``dpbudget.accountant.tables.spark``.

Dask frames are opened by ``dpbudget.accountant.tables.dask`` (a ``Frame`` whose copy is
Parquet files): narwhals' Dask backend has no ``rank`` and no window in ``over``, so the
bounding runs per partition of whole units, on pandas, with numpy keys seeded per partition.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataError,
                                               InvalidDataTypeError, InvalidTypeError,
                                               PrivacyError)

__all__ = ["KEY", "PREFIX", "Frame", "check_columns", "check_keys", "check_values", "collect",
           "engine", "free", "inner", "keyed", "open_frame", "tidy"]

PREFIX = "__dpbudget_"  # the copy's columns: each one this layer's own (``inner``)
KEY = PREFIX + "key"  # ranks a unit's rows, and (through each group's minimum) its groups

_T = TypeVar("_T")


def engine(call: Callable[[], _T], columns: Sequence[str]) -> _T:
    """``call()``, an engine step; its error re-raised typed, naming ``columns``, never its text
    (an engine's message can quote raw rows: DuckDB's ``Original Line: ...``).

    Raises:
        InvalidDataError: the engine failed on the data of ``columns``.
    """
    try:
        return call()
    except PrivacyError:
        raise
    except Exception as error:  # noqa: BLE001 (whatever the engine raises: named by type only)
        kind = type(error).__name__  # (only the name leaves the handler: raised inside it, the
        # new error would carry the engine's, and its message, as ``__context__``)
    raise InvalidDataError(f"columns {', '.join(map(repr, columns))}", None,
                           "data the engine can read as their declared types",
                           f" ({kind}; its message, which may quote the data, is not shown)") \
        from None


class Frame:
    """The user's frame, opened: its lazy narwhals form and its schema (nothing read yet).

    Attributes:
        lazy: the frame as a ``narwhals.LazyFrame``.
        kind: ``"pandas"``, ``"polars"``, ``"duckdb"``, ``"spark"`` or ``"dask"``.
        schema: each column's narwhals dtype.
    """

    def __init__(self, native: Any, kind: str) -> None:
        import narwhals as nw
        self.kind = kind
        frame = nw.from_native(native)
        self.lazy: Any = frame.lazy() if isinstance(frame, nw.DataFrame) else frame
        self.schema: dict[str, Any] = dict(engine(self.lazy.collect_schema, ["*"]))

    def read(self, columns: Sequence[str], scratch: str | None = None) -> Any:
        """The named columns, read once under their ``inner`` names: an eager narwhals DataFrame
        in memory (pandas, Polars, or Arrow for DuckDB), or on Spark a lazy one over a
        checkpoint (``spark.copy``). Every later step of the query works on this one copy.
        (``scratch``: a folder for a copy on disk, which only Dask's ``Frame`` uses.)

        Raises:
            InvalidDataError: the engine failed to read the columns (nothing spent).
        """
        import narwhals as nw
        names = inner(columns)
        selected = self.lazy.select(*(nw.col(c).alias(n) for c, n in names.items()))
        if self.kind == "spark":
            from dpbudget.accountant.tables import spark
            return engine(lambda: nw.from_native(spark.copy(selected.to_native())), list(names))
        return engine(selected.collect, list(names))


def inner(columns: Sequence[str]) -> dict[str, str]:
    """Each distinct column a query reads, mapped to its name in the copy: ``PREFIX`` + ``c0``,
    ``c1``, ... in order of first mention."""
    return {c: f"{PREFIX}c{i}" for i, c in enumerate(dict.fromkeys(columns))}


def keyed(rows: Any, rng: np.random.Generator, kind: str) -> Any:
    """``rows`` (``Frame.read``) as a lazy frame with ``KEY``: an iid uniform [0, 1) key from
    ``rng`` per row, attached by position (a DuckDB source's Arrow copy is queried by DuckDB,
    on a connection of this query's own); on Spark a keyed hash of each row, on the executors
    (``spark.keys``)."""
    import narwhals as nw
    if kind == "spark":
        from dpbudget.accountant.tables import spark
        return nw.from_native(spark.keys(rows.to_native(), rng, KEY))
    key = nw.new_series(KEY, rng.random(len(rows)), nw.Float64(),
                        backend=nw.get_native_namespace(rows))
    out = rows.with_columns(key)
    if kind == "duckdb":  # (not ``lazy(backend="duckdb")``: it registers the copy as "_df" on
        import duckdb     # DuckDB's one default connection, and two threads' queries collide)
        return nw.from_native(duckdb.connect().from_arrow(out.to_native()))
    return out.lazy()


def free(copy: Any, kind: str) -> None:
    """``copy`` (``Frame.read``'s; None: none was made), dropped once its query has computed or
    been refused: on Spark its checkpoint's blocks (``spark.free``); in memory, nothing to do."""
    if kind == "spark" and copy is not None:
        from dpbudget.accountant.tables import spark
        tidy(lambda: spark.free(copy.to_native()), "a Spark checkpoint")


def tidy(step: Callable[[], object], what: str) -> None:
    """``step()``, a clean-up after a query: its failure is logged (its type, never its text)
    and goes no further — an answer already paid for, or a refusal, is what the caller gets."""
    try:
        step()
    except Exception as error:
        logging.getLogger("dpbudget.tables").warning("%s was not freed (%s)", what,
                                                     type(error).__name__)


def open_frame(frame: Any) -> Frame:
    """The user's frame, opened (nothing is read yet but the schema; a CSV file's types are
    inferred from all its rows, so a late cell of another type makes the column text, refused
    by type before anything is spent, not a cast error after).

    Raises:
        InvalidDataTypeError: not a frame this layer reads (an ``InvalidTypeError`` that shows
            its type and size, never its repr: a Series or a list prints its cells).
        InvalidArgumentError: a path that does not end in ``.parquet`` or ``.csv``, or that does
            not exist.
        InvalidDataError: a file the engine cannot read (its message is not shown).
    """
    if isinstance(frame, (str, os.PathLike)):
        path = Path(frame)
        if path.suffix not in (".parquet", ".csv"):
            raise InvalidArgumentError("frame", "a path", "a path ending in .parquet or .csv")
        if not path.is_file():
            raise InvalidArgumentError("frame", "a path", "a file that exists")
        import duckdb
        con = duckdb.connect()  # embedded, in memory: the file is scanned, never loaded whole
        rel = engine(lambda: con.read_parquet(str(path)) if path.suffix == ".parquet" else
                     con.read_csv(str(path), sample_size=-1), ["*"])
        return Frame(rel, "duckdb")
    module = type(frame).__module__.split(".")[0]
    name = type(frame).__name__
    if module == "pandas" and name == "DataFrame":
        return Frame(frame, "pandas")
    if module == "polars" and name in ("DataFrame", "LazyFrame"):
        return Frame(frame, "polars")
    if module in ("duckdb", "_duckdb") and name == "DuckDBPyRelation":
        return Frame(frame, "duckdb")
    if module == "pyspark" and name == "DataFrame" and ".connect." not in type(frame).__module__:
        # (classic Spark: Spark Connect's DataFrame has no localCheckpoint before Spark 4)
        return Frame(frame, "spark")
    raise InvalidDataTypeError("frame", frame, "a pandas DataFrame, a Polars DataFrame or "
                               "LazyFrame, a DuckDB relation, a PySpark or Dask DataFrame, or "
                               "a .parquet or .csv path")


def check_columns(frame: Frame, unit: str, groups: Sequence[str], value: str | None) -> None:
    """The columns a query names exist and have types it can use: the schema only, nothing is
    read.

    Raises:
        InvalidArgumentError: a column the frame does not have.
        InvalidDataTypeError: a unit column of mixed or non-id type (ids are integers or
            strings), a group column of a type that has no order (objects, lists), or a value
            column that is not numeric.
    """
    import narwhals as nw
    for column in (unit, *groups, *(() if value is None else (value,))):
        if column not in frame.schema:
            raise InvalidArgumentError("column", column, "a column of the frame")
    for column in groups:  # (an Object, List or Struct key would fail after the debit)
        kind = frame.schema[column]
        if not (_is_text(kind) or kind.is_numeric() or kind in (nw.Boolean, nw.Date,
                                                                 nw.Datetime)):
            raise InvalidDataTypeError(f"column {column!r}", kind, "a group column of strings, "
                                       "numbers, booleans, dates or datetimes")
    dtype = frame.schema[unit]
    if not (dtype.is_integer() or _is_text(dtype)):
        raise InvalidDataTypeError(f"column {unit!r}", dtype, "one id type per "
                                   "unit column: integers or strings, not mixed or other types "
                                   "(a pandas integer column with nulls is float: drop or fill "
                                   "the nulls, or use the nullable Int64)")
    if value is not None and not frame.schema[value].is_numeric():
        raise InvalidDataTypeError(f"column {value!r}", frame.schema[value],
                                   "a numeric column")


def _is_text(dtype: Any) -> bool:
    import narwhals as nw
    return bool(dtype in (nw.String, nw.Categorical, nw.Enum))


def _constant_ok(dtype: Any, part: Any) -> bool:
    """A plain Python or numpy scalar of ``dtype``'s kind (never an expression, a series or an
    object of another type: an aggregate "constant" would let one unit move another's rows)."""
    import narwhals as nw
    if isinstance(part, (bool, np.bool_)):
        return bool(dtype == nw.Boolean)
    if _is_text(dtype):
        return isinstance(part, str)
    if dtype.is_integer():
        return isinstance(part, (int, np.integer))
    if dtype.is_numeric():
        return isinstance(part, (int, float, np.integer, np.floating))
    if bool(dtype == nw.Datetime):  # aware for a column with a time zone, naive without (the
        naive = getattr(dtype, "time_zone", None) is None  # engines refuse to compare them)
        return isinstance(part, datetime.datetime) and (part.tzinfo is None) == naive
    if bool(dtype == nw.Date):
        return isinstance(part, datetime.date) and not isinstance(part, datetime.datetime)
    return False


def check_keys(frame: Frame, groups: Sequence[str], keys: Sequence[Any],
               argument: str = "keys") -> None:
    """Each public key (or filter constant: ``argument``) is a plain scalar of its column's type
    (a str for a string column, an int for an integer one, a real number for a float one, a bool,
    a ``datetime`` — aware for a column with a time zone, naive without — or a ``date``; a column
    of any other type takes none; never NaN, which equals nothing): a key of another type
    would match no row, and its noisy 0 would hide the mistake; an expression (``nw.col("x")
    .max()``) would be evaluated over the table, and one unit's rows would move another's.

    Raises:
        InvalidTypeError: a key of another type, naming the column (a key is public: shown).
    """
    for key in keys:
        parts = key if len(groups) > 1 else (key,)
        for column, part in zip(groups, parts):
            dtype = frame.schema[column]
            if not _constant_ok(dtype, part) or (isinstance(part, float) and part != part):
                raise InvalidTypeError(argument, type(part).__name__, f"plain values of column "
                                       f"{column!r}'s type ({dtype})")


def check_values(rows: Any, names: Mapping[str, str], unit: str, groups: Sequence[str],
                 value: str | None) -> None:
    """On the copy ``Frame.read`` made, before its filters and the debit: no null unit or group,
    no null, NaN or infinite value, and (pandas) each object column it reads (or a categorical's
    categories) holds one type throughout (narwhals infers an object column's type from its
    first rows). ``names``: each column's name in the copy (``inner``); errors name the user's
    column. Every row read is checked, the filters' too: a refusal is free, and checked after
    the filters it would answer "does the row of person 7 hold a null?" for any row a filter
    can single out (tests/tables/test_builder.py).

    Raises:
        InvalidDataError: naming the column and what it holds (a count of bad rows is not
            shown: it is data).
        InvalidDataTypeError: a pandas object column of mixed types.
    """
    import narwhals as nw
    native = rows.to_native()
    schema = rows.collect_schema()
    lazy = rows if isinstance(rows, nw.LazyFrame) else rows.lazy()
    if type(native).__module__.split(".")[0] == "pandas":
        import pandas as pd
        for column, name in names.items():
            values = native[name]
            if isinstance(values.dtype, pd.CategoricalDtype):  # (its categories may mix types)
                values = values.cat.categories
            if values.dtype == object:
                kind = pd.api.types.infer_dtype(values, skipna=True)
                want = "string" if _is_text(schema[name]) else \
                    "integer" if schema[name].is_integer() else None
                if kind != want and kind != "empty":
                    raise InvalidDataTypeError(f"column {column!r}", schema[name],
                                               "one type per column (integers or strings, "
                                               "not mixed)")
    checks = {names[c]: (c, "null values") for c in (unit, *groups)}  # (keyed by inner name)
    exprs = []
    for name in checks:  # a NaN unit or group matches no key, not even itself: refused as null
        col = nw.col(name)
        missing = col.is_null()
        if schema[name].is_float():
            missing = missing | col.is_nan()
            checks[name] = (checks[name][0], "null or NaN values")
        exprs.append(missing.fill_null(True).cast(nw.Int64()).sum().alias(name))
    if value is not None:  # (its own alias: the value column may also be a group column)
        x = nw.col(names[value])
        bad = x.is_null() | ~x.cast(nw.Float64()).is_finite()
        exprs.append(bad.fill_null(True).cast(nw.Int64()).sum().alias(PREFIX + "value"))
        checks[PREFIX + "value"] = (value, "null, NaN or infinite values")
    found = collect(lazy.select(*exprs), list(names))
    for alias, counts in found.items():
        if int(counts[0] or 0):
            column, what = checks[alias]
            raise InvalidDataError(f"column {column!r}", schema[names[column]], f"a column with "
                                   f"no {what}")


def collect(lazy: Any, columns: Sequence[str] = ("*",)) -> dict[str, np.ndarray]:
    """An aggregate's columns as numpy arrays (the only data that reaches Python); an engine
    error is re-raised typed, naming ``columns`` (``engine``)."""
    def run() -> dict[str, np.ndarray]:
        frame = lazy.collect()
        return {name: frame[name].to_numpy() for name in frame.columns}
    return engine(run, columns)
