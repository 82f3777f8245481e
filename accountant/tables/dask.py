"""A Dask DataFrame's read-once copy and its bounding: the existing pandas path, run per
partition, on partitions that each hold whole units.

Invariant: a query on a Dask frame reads the columns it names once, before the debit, into
Parquet files in a folder of its own (``copy``; the folder is removed when the query ends,
released or refused: ``scratch``); the checks and the filters, then after the debit the
bounding, read those files, never the source again. Not ``persist()``: a distributed persist
recomputes a lost partition from the source, which may have changed; a file that is lost fails
the job instead, and after the debit that releases nothing and leaves the budget spent
(``release_bounded``), never a second debit.

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
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from dpbudget.accountant.tables import frames
from dpbudget.accountant.tables.bounding import ROWS, SQUARES, SUM, UNITS
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["Frame", "collected", "copy", "opened", "read", "scratch"]

_SUMMED = (ROWS, UNITS, SUM, SQUARES)  # the partial aggregates; every other column is a key


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without narwhals' notice, on wrapping a Dask frame, that its Dask support moves to a
    plugin (a FutureWarning: an error under strict warning filters)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Dask support is moving", FutureWarning)
        yield


def _wrapped(native: Any) -> Any:
    """``narwhals.from_native`` on a Dask frame (``_quiet``)."""
    import narwhals as nw
    with _quiet():
        return nw.from_native(native)


class Frame(frames.Frame):
    """A Dask DataFrame, opened: kind ``"dask"``, its schema (nothing read yet)."""

    def __init__(self, native: Any) -> None:
        with _quiet():
            super().__init__(native, "dask")

    def read(self, columns: Sequence[str], scratch: str | None = None) -> Any:
        """The named columns under their ``inner`` names, read once into Parquet files under
        ``scratch`` (``copy``): a lazy narwhals frame over them.

        Raises:
            InvalidDataError: Dask failed to read or write the columns (nothing spent).
        """
        import narwhals as nw
        names = frames.inner(columns)
        selected = self.lazy.select(*(nw.col(c).alias(n) for c, n in names.items()))
        return frames.engine(lambda: copy(selected.to_native(), scratch), list(names))


def opened(frame: Any) -> Frame | None:
    """``frame`` opened if it is a Dask DataFrame, else None (``frames.open_frame`` opens the
    others)."""
    kind = type(frame)
    return Frame(frame) if kind.__module__.split(".")[0] == "dask" and \
        kind.__name__ == "DataFrame" else None


def read(frame: frames.Frame, columns: Sequence[str], scratch: str | None) -> Any:
    """``frame.read(columns)``; a Dask frame's copy goes under ``scratch``."""
    return frame.read(columns, scratch) if isinstance(frame, Frame) else frame.read(columns)


@contextlib.contextmanager
def scratch(kind: str) -> Iterator[str | None]:
    """The folder of one query's copy on Dask, removed when the query ends (None for the other
    engines). A cluster of several machines needs a folder they all read: ``TMPDIR`` (Python's
    ``tempfile``) on shared storage."""
    if kind != "dask":
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="dpbudget-dask-") as folder:
        yield folder


def copy(native: Any, folder: str | None) -> Any:
    """``native`` (the selected Dask columns) written once as Parquet under ``folder``, read back
    as a lazy narwhals frame: what every later step of the query reads."""
    import dask.dataframe as dd
    if folder is None:
        raise InvalidArgumentError("scratch", None, "a folder for the Dask copy (scratch)")
    path = os.path.join(folder, "copy")
    native.to_parquet(path, write_index=False)
    return _wrapped(dd.read_parquet(path))


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
    return native.shuffle(on=unit, npartitions=native.npartitions, shuffle_method="tasks")


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
