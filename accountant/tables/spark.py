"""A Spark DataFrame's read-once copy and its keys: the bounding on executors, one version of the
data, and keys that a retried task recomputes the same.

Invariant: a query on a Spark frame reads the columns it names once, before the debit, into a
``localCheckpoint`` (``copy``): the selected columns are computed once, stored in the executors'
block managers (memory, then disk) and their lineage cut, so every later stage — the checks, the
filters, and after the debit the keys, the bounding and the aggregation — reads those stored
blocks, never the source again. Nothing is collected to the driver but per-group aggregates
(``frames.collect``).

What the copy protects against: a Parquet file rewritten, or a source that draws at random (a
``rand()`` column, a UDF), between the checks and the bounding, or between two stages of the
bounding — they all read the one checkpoint. What it does not: a file rewritten DURING the
checkpoint's own job (each task reads its split once, but two splits may see two versions of
the data), and an executor lost after the checkpoint — its blocks are gone and Spark cannot
recompute them from the source (the lineage is cut on purpose), so the job fails: after the
debit, nothing is released and the budget stays spent (``release_bounded``), never a recompute
from a source that may have changed.

The keys (``keys``). A row's key is a deterministic function of a secret seed and the row: the
first 52 bits of SHA-256 over the seed and the row's columns as JSON (``to_json`` of a struct:
unambiguous, whatever a string holds), with its occurrence index among identical rows, over 2^52.
A task retried on a recomputed partition (an executor lost in the bounding's shuffle) gets the
SAME keys, so a unit's rows are bounded the same in every stage — never ``rand(seed)``, whose
values depend on the partition index and the row order of a partition, which a recomputation
can change. Identical rows get distinct occurrence indices (1, 2, ... in any order: the rows are
identical, so which one carries which index changes no aggregate), so that a unit's duplicated
rows get distinct keys: iid-like keys, the same law as the numpy keys of the in-memory engines
(a unit with rows A, A, B bounded to 2 keeps {A, A} with probability 1/3, not the 1/2 one
shared key per distinct row would give: tests/tables/test_spark.py).

Why SHA-256 and not a seeded non-cryptographic hash (``xxhash64(seed, ...)``): the data is
chosen before the seed, but a seeded fast hash is not a pseudo-random function — inputs that
differ in a structured way can collide or correlate for every seed, and a table built to exploit
it would get keys that are not uniform (the bounding's sensitivity holds for every key draw, so
this costs accuracy of the law, not privacy). SHA-256 over the secret seed and the row is a
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

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["copy", "keys"]

_BITS = 52  # a key's bits: a double holds them exactly, uniform on [0, 1) in steps of 2^-52


def copy(native: Any) -> Any:
    """``native`` (a Spark DataFrame of the selected columns), computed once into the executors'
    block managers, its lineage cut (``localCheckpoint``, eager): what every later stage reads."""
    return native.localCheckpoint(eager=True)


def keys(native: Any, rng: np.random.Generator, columns: Sequence[str], key: str) -> Any:
    """``native`` with ``key``: per row, SHA-256 of a fresh 256-bit seed from ``rng`` and the
    row's ``columns`` (as JSON) and its occurrence index among identical rows, as a uniform on
    [0, 1) (its first 52 bits over 2^52)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    seed = key + "_seed"  # (a row of data, never a literal: see the module's docstring)
    secret = native.sparkSession.createDataFrame([(rng.bytes(32).hex(),)], f"`{seed}` string")
    row = F.to_json(F.struct(*(F.col(c) for c in columns)))
    copies = Window.partitionBy(*columns).orderBy(F.lit(0))
    text = F.concat_ws("|", F.col(seed), F.row_number().over(copies).cast("string"), row)
    bits = F.conv(F.substring(F.sha2(text, 256), 1, _BITS // 4), 16, 10).cast("long")
    return native.crossJoin(F.broadcast(secret)) \
        .withColumn(key, bits.cast("double") / float(1 << _BITS)).drop(seed)
