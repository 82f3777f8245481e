"""A Dask DataFrame's read-once copy and its bounding: the existing pandas path, run per
partition, on partitions that each hold whole units.

Invariant: a query on a Dask frame reads the columns it names once, before the debit, into
Parquet files in a folder of its own (``copy``; the folder is removed when the query ends,
released or refused: ``scratch``); the checks and the filters, then after the debit the
bounding, read those files, never the source again. Not ``persist()``: a distributed persist
recomputes a lost partition from the source, which may have changed; a file that is lost fails
the job instead, and after the debit that releases nothing and leaves the budget spent
(``release_bounded``), never a second debit. A copy the client reads with fewer parts than the
frame (workers writing into folders of their own) is refused before the debit, and the folder is
removed on every ``distributed`` worker too. An object column Dask made text as the frame was
built (``convert-string``: 7 and 7.0 become two ids) is refused as the pandas path refuses it
(``_one_type``).

After the debit (``collected``): the rows are shuffled by the unit (a hash of its value), so
that every unit lies in ONE partition; each partition is sorted by all its columns, keyed from a
numpy generator seeded from (a seed drawn from the generator ``release_bounded`` hands
``compute``, the partition's index) and bounded and aggregated by the same narwhals code as a
pandas frame (``bounding``). The per-group partial aggregates — rows, units, sums, squares, bin
counts — add exactly across partitions because no unit spans two, and are summed per group by
Dask; only those sums reach the driver. A task retried on a recomputed partition gets the same
rows (the shuffle puts a unit where its hash says), sorts them into the same order and draws the
same keys from the same seed: the same answer, whatever was lost. narwhals' Dask backend has no
``rank`` and no window in ``over``, which is why the bounding runs on pandas partitions; the
checks and the filters, which need neither, run through narwhals on Dask.

The seed reaches the tasks as data, never in a task's name or a graph key (``_Seed``: its token
is random, its repr withheld), so it is not in Dask's dashboard, logs or errors, nor in a
record (only the accountant's source derives it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from dpbudget.accountant.tables import frames
from dpbudget.accountant.tables.bounding import ROWS, SQUARES, SUM, UNITS
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataTypeError,
                                               InvalidTypeError)

__all__ = ["Frame", "collected", "copy", "opened", "scratch"]

_SUMMED = (ROWS, UNITS, SUM, SQUARES)  # the partial aggregates; every other column is a key


# narwhals' notice, on wrapping a Dask frame, that its Dask support moves to a plugin (a
# FutureWarning: an error under strict warning filters). Filtered once, for that one message, at
# import: ``warnings.catch_warnings`` per call would swap the process's filters under the query
# service's other threads.
warnings.filterwarnings("ignore", message="Dask support is moving", category=FutureWarning)


class Frame(frames.Frame):
    """A Dask DataFrame, opened: kind ``"dask"``, its schema (nothing read yet)."""

    def __init__(self, native: Any) -> None:
        try:
            super().__init__(native, "dask")
        except TypeError:  # (narwhals without its Dask support: a ``narwhals-dask`` plugin)
            raise InvalidTypeError("frame", "a Dask DataFrame", "a frame narwhals reads: "
                                   "pip install narwhals-dask") from None

    def read(self, columns: Sequence[str], scratch: str | None = None) -> Any:
        """The named columns under their ``inner`` names, read once into Parquet files under
        ``scratch`` (``copy``): a lazy narwhals frame over them.

        Raises:
            InvalidDataError: Dask failed to read or write the columns (nothing spent).
        """
        import narwhals as nw
        names = frames.inner(columns)
        selected = self.lazy.select(*(nw.col(c).alias(n) for c, n in names.items())).to_native()
        _one_type(selected)
        assert scratch is not None  # (the builder always passes ``scratch``'s folder)
        return frames.engine(lambda: copy(selected, scratch), list(names))


def _one_type(native: Any) -> None:
    """Refuse what Dask's ``dataframe.convert-string`` made text as the frame was built: an
    object column holding anything but strings (7 and 7.0, True and 1 become "7" and "7.0",
    "True" and "1": one person, two ids; the pandas path refuses the column as mixed). A
    ``FromPandas`` source is checked on its original rows (the columns the query reads, through
    renames: Dask's optimizer projects them down to the source); any other conversion of an
    object column (``from_delayed``, ``from_map``, ``from_array``, ...) is refused, its values
    unseen. Parquet and Arrow declare their types: no conversion, nothing to check.

    Raises:
        InvalidDataTypeError: naming the source column, never a value.
    """
    import pandas as pd
    from dask.dataframe.dask_expr._expr import ArrowStringConversion
    from dask.dataframe.dask_expr.io.io import FromPandas
    node: Any  # (dask's expressions: untyped)
    for node in native.expr.optimize(fuse=False).walk():
        if isinstance(node, FromPandas) and node.pyarrow_strings_enabled:
            source = node.frame._data
            mixed = [c for c in node._meta.columns if source[c].dtype == object and
                     pd.api.types.infer_dtype(source[c], skipna=True) not in ("string", "empty")]
        elif isinstance(node, ArrowStringConversion):
            mixed = [c for c, dtype in node.frame._meta.dtypes.items() if dtype == object]
        else:
            continue
        if mixed:
            import narwhals as nw
            raise InvalidDataTypeError(f"column {mixed[0]!r}", nw.Object(), "one type per "
                                       "column (integers or strings): Dask's convert-string "
                                       "makes an object column's values text (an int and the "
                                       "equal float become two ids)")


def opened(frame: Any) -> Frame | None:
    """``frame`` opened if it is a Dask DataFrame, else None (``frames.open_frame`` opens the
    others)."""
    kind = type(frame)
    return Frame(frame) if kind.__module__.split(".")[0] == "dask" and \
        kind.__name__ == "DataFrame" else None


@contextlib.contextmanager
def scratch(kind: str) -> Iterator[str | None]:
    """The folder of one query's copy on Dask, removed when the query ends (None for the other
    engines): on the client, and under a ``distributed`` client on every worker too (a worker
    that does not see the client's folder wrote its parts into its own, which ``copy`` refuses;
    they are removed here, not left behind). A cluster of several machines needs a folder they
    all read: ``TMPDIR`` (Python's ``tempfile``) on shared storage."""
    if kind != "dask":
        yield None
        return
    folder = tempfile.mkdtemp(prefix="dpbudget-dask-")
    try:
        yield folder
    finally:  # (best effort: a worker gone must not turn a paid answer into an error)
        shutil.rmtree(folder, ignore_errors=True)
        frames.tidy(lambda: _on_workers(folder), "a Dask copy's folder on the workers")


def _remove(folder: str) -> None:
    """``folder`` removed, on whichever machine runs this (a worker, under ``client.run``)."""
    shutil.rmtree(folder, ignore_errors=True)


def _on_workers(folder: str) -> None:
    """``folder`` removed on every worker of the current ``distributed`` client, if any."""
    try:
        from distributed import default_client
        client = default_client()  # type: ignore[no-untyped-call]  # (distributed's own)
    except (ImportError, ValueError):  # (no distributed, or no client: nothing elsewhere)
        return
    client.run(_remove, folder)


def copy(native: Any, folder: str) -> Any:
    """``native`` (the selected Dask columns) written once as Parquet under ``folder``, read back
    as a lazy narwhals frame: what every later step of the query reads.

    Raises:
        InvalidArgumentError: the client reads another number of parts than ``native`` has (its
            workers wrote into folders the client does not see: nothing spent, no subset).
    """
    import dask.dataframe as dd
    import narwhals as nw
    path = os.path.join(folder, "copy")
    native.to_parquet(path, write_index=False)
    _complete(path, native.npartitions)
    return nw.from_native(dd.read_parquet(path))


def _complete(path: str, parts: int) -> None:
    """Refuse a copy whose folder, as the client sees it, lacks one of the ``parts`` files."""
    found = sum(n.endswith(".parquet") for n in (os.listdir(path) if os.path.isdir(path) else ()))
    if found != parts:
        raise InvalidArgumentError("scratch", "a folder the workers do not share", "a folder "
                                   "every Dask worker writes and the client reads (TMPDIR on "
                                   "shared storage)")


class _Seed:
    """The post-debit seed, as task data: its Dask token is random (a graph key never derives
    from it) and its repr withholds it."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.words = [int(w) for w in np.frombuffer(rng.bytes(32), dtype=np.uint32)]
        self._token = os.urandom(16).hex()

    def __dask_tokenize__(self) -> str:
        return self._token

    def __repr__(self) -> str:
        return "<seed withheld>"


def collected(rows: Any, rng: np.random.Generator, kind: str, columns: Sequence[str],
              unit: str) -> Callable[..., dict[str, np.ndarray]]:
    """``run(step, *args, **kwargs)``: the aggregate ``step(keyed, *args, **kwargs)`` (a
    ``bounding`` function) of ``rows`` keyed from ``rng``, as numpy arrays (``frames.collect``);
    on Dask, per partition of whole units (the module's docstring). ``columns``: the user's
    names of the columns read, for errors; ``unit``: the unit's column in ``rows``."""
    if kind != "dask":
        keyed = frames.keyed(rows, rng, kind)
        return lambda step, *args, **kwargs: frames.collect(step(keyed, *args, **kwargs), columns)
    seed = _Seed(rng)

    def run(step: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        part = functools.partial(_partial, seed=seed, step=step, args=args, kwargs=kwargs)
        return frames.engine(lambda: _summed(rows.to_native(), unit, part), columns)
    return run


def _summed(native: Any, unit: str, part: Callable[..., Any]) -> dict[str, np.ndarray]:
    """The partials of ``part`` on ``native`` shuffled by ``unit``, summed per key by Dask."""
    meta = part(native._meta)  # (on the empty meta frame: no data, no fake rows)
    partials = _by_unit(native, unit).map_partitions(part, meta=meta)
    by = [c for c in meta.columns if c not in _SUMMED]
    if not by:
        total = partials.sum().compute()
        return {name: np.asarray([total[name]]) for name in meta.columns}
    out = partials.groupby(by, dropna=False, observed=True).sum().compute().reset_index()
    return {name: out[name].to_numpy() for name in out.columns}


def _by_unit(native: Any, unit: str) -> Any:
    """``native`` shuffled so that all rows of a unit lie in one partition (by a hash of the
    unit's value: the same partition in a retried task). In tasks, in memory: Dask's default
    without a distributed client is a shuffle on disk, whose files of rows outlive the query."""
    return native.shuffle(on=unit, shuffle_method="tasks")


def _partial(part: Any, *, seed: _Seed, step: Callable[..., Any], args: Sequence[Any],
             kwargs: dict[str, Any], partition_info: dict[str, Any] | None = None) -> Any:
    """One partition's partial aggregates (a pandas frame): its rows sorted by all columns (a
    retried task sees them in the same order), keyed from (seed, partition index), bounded."""
    import narwhals as nw
    index = 0 if partition_info is None else int(partition_info["number"])
    part = part.sort_values(list(part.columns), ignore_index=True, kind="stable")
    rng = np.random.default_rng([*seed.words, index])
    keyed = frames.keyed(nw.from_native(part, eager_only=True), rng, "pandas")
    return step(keyed, *args, **kwargs).collect().to_native()
