"""A Spark DataFrame's read-once copy and its keys: the bounding on executors, one version of the
data, and keys that a retried task recomputes the same.

Invariant: a query on a Spark frame reads the columns it names once, before the debit, into a
``localCheckpoint`` (``copy``): the selected columns are computed once, stored in the executors'
block managers (memory, then disk) and their lineage cut, so every later stage — the checks, the
filters, and after the debit the keys, the bounding and the aggregation — reads those stored
blocks, never the source again; once the query has computed (or been refused) its blocks are
dropped (``free``). Nothing is collected to the driver but per-group aggregates
(``frames.collect``). Spark's own logs are not this layer's: a failed task's log4j ERROR line can
quote a cell, so they are as sensitive as the data (this layer's errors name columns only).

What the copy protects against: a Parquet file rewritten, or a source that draws at random (a
``rand()`` column, a UDF), between the checks and the bounding, or between two stages of the
bounding — they all read the one checkpoint. What it does not: a file rewritten DURING the
checkpoint's own job (each task reads its split once, but two splits may see two versions of
the data), and an executor lost after the checkpoint — its blocks are gone and Spark cannot
recompute them from the source (the lineage is cut on purpose), so the job fails: after the
debit, nothing is released and the budget stays spent (``release_bounded``), never a recompute
from a source that may have changed.

The keys (``keys``). A row's key is the first 52 bits of SHA-256 over a secret seed and the
row's id on the copy (``monotonically_increasing_id()``: its partition's index and its place in
that partition), over 2^52. On the checkpoint the partitions and the order of each one's rows
are fixed — stored blocks, read back as they were written; a lost block fails the job, never
recomputed — and the filters that run before the keys are deterministic, so every stage that
reads the keyed copy (the grouped bounding joins it to itself), and a task retried on its stored
block, gets the same id, hence the same key, for the same row: a unit's rows are bounded the
same in every stage. The ids are distinct, so the keys are iid uniform (a random oracle on distinct
inputs, the seed drawn after the ids are fixed): the law of the numpy keys of the in-memory
engines, duplicated rows included (a unit with rows A, A, B bounded to 2 keeps {A, A} with
probability 1/3), whatever the partitioning or order of the source — they change which row gets
which key, not the keys' law. The ids of a frame that is not a checkpoint are not stable (a
recomputed shuffle can reorder a partition), which is why the keys are computed on the copy
alone. Not a hash of the row's content: rows that differ (by a microsecond, which ``to_json``
drops) or that are identical would need an occurrence index over the hashed text, and a shuffle.

Why SHA-256 and not a seeded non-cryptographic hash (``xxhash64(seed, ...)``): the data is
chosen before the seed, but a seeded fast hash is not a pseudo-random function — inputs that
differ in a structured way can collide or correlate for every seed, and a table built to exploit
it would get keys that are not uniform (the bounding's sensitivity holds for every key draw, so
this costs accuracy of the law, not privacy). SHA-256 over the secret seed and a row id is a
random oracle for inputs fixed before the seed; length extension does not matter (no key is
shown to anyone). The seed is drawn from the accountant's source after the debit (the generator
``release_bounded`` hands ``compute``), and is never in a record, a log line, an error or a
repr: it reaches the executors as DATA, a one-row frame cross-joined to the rows, not as a
literal of the query — py4j logs every call's arguments at DEBUG, and Spark's UI and event log
show a plan's literals (tests/tables/test_spark.py shows the literal in the log). The driver
hands that row to the JVM as it hands any local frame: pickled through a temporary file in
Spark's local directory, deleted once read.

The in-memory engines keep numpy keys (``frames.keyed``): drawing 10^6 uniforms takes
milliseconds, hashing 10^6 rows tens of times more.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["copy", "free", "keys"]

_BITS = 52  # a key's bits: a double holds them exactly, uniform on [0, 1) in steps of 2^-52


def copy(native: Any) -> Any:
    """``native`` (a Spark DataFrame of the selected columns), computed once into the executors'
    block managers, its lineage cut (``localCheckpoint``, eager): what every later stage reads."""
    return native.localCheckpoint(eager=True)


def free(checkpoint: Any) -> None:
    """The blocks of ``checkpoint`` (a ``copy``) dropped from the executors, once its query has
    computed or been refused: a query's copy is read by that query alone. (``unpersist`` of the
    DataFrame does not drop them: the stored RDD is its plan, a ``LogicalRDD``.)"""
    plan = checkpoint._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":  # (else not a ``copy``: nothing stored)
        plan.rdd().unpersist(False)


def keys(native: Any, rng: np.random.Generator, key: str) -> Any:
    """``native`` (the copy, filtered) with ``key``: per row, SHA-256 of a fresh 256-bit seed
    from ``rng`` and the row's id on the copy, as a uniform on [0, 1) (its first 52 bits over
    2^52)."""
    from pyspark.sql import functions as F
    seed, row = key + "_seed", key + "_row"  # (the seed: a row of data, never a literal)
    secret = native.sparkSession.createDataFrame([(rng.bytes(32).hex(),)], f"`{seed}` string")
    text = F.concat_ws("|", F.col(seed), F.col(row).cast("string"))
    bits = F.conv(F.substring(F.sha2(text, 256), 1, _BITS // 4), 16, 10).cast("long")
    return native.withColumn(row, F.monotonically_increasing_id()) \
        .crossJoin(F.broadcast(secret)) \
        .withColumn(key, bits.cast("double") / float(1 << _BITS)).drop(seed, row)
