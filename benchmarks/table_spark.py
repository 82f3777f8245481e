"""The five table queries on Spark: dpbudget, Tumult Analytics and the raw ``groupBy().agg()``
on the same SparkSession and the same cached frame, per number of local cores.

Run through ``benchmarks/tables.py --engine spark [--persons N] [--cores 1,2]`` in an
interpreter that has pyspark 3.5, Tumult Analytics and dpbudget. The events table is written
once as Parquet; for each core count a local SparkSession reads it and caches it (not timed);
then each query runs ``--seeds`` times per library, timed from the query to its answer on the
driver (dpbudget's time includes its read-once checkpoint of the columns the query reads). The
raw floor is the same aggregate with no bounding and no noise: the ratio dpbudget / raw is the
cost of the bounding and the noise. ``copy`` is the floor under the read-once guarantee: the
query's columns copied once (dpbudget's ``localCheckpoint``), then the raw aggregate on the copy.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import table_peers as peers  # noqa: E402

QUERIES = ("q1", "q2", "q3", "q4", "q5")


def session(cores: int) -> Any:
    """A local SparkSession on ``cores`` cores (a fresh one: the previous one is stopped)."""
    import os
    from pyspark.sql import SparkSession
    os.environ["PYSPARK_PYTHON"] = sys.executable
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    spark = SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false") \
        .config("spark.ui.showConsoleProgress", "false") \
        .config("spark.sql.shuffle.partitions", str(4 * cores)) \
        .config("spark.driver.memory", "6g").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def raw(frame: Any, q: str) -> Any:
    """The query's aggregate with no bounding and no noise, collected to the driver."""
    from pyspark.sql import functions as F
    if q == "q1":
        return frame.groupBy("region").count().collect()
    if q == "q2":
        return frame.groupBy("region").agg(F.sum("amount"), F.avg("amount")).collect()
    if q == "q3":
        return frame.groupBy("region").agg(F.countDistinct("person_id")).collect()
    if q == "q4":
        return frame.agg(F.percentile_approx("amount", 0.5, 10_000)).collect()
    return frame.groupBy("day", "region").count().collect()


# The columns each query reads (its unit included): what dpbudget's read-once copy holds.
COLUMNS = {"q1": ("person_id", "region"), "q2": ("person_id", "region", "amount"),
           "q3": ("person_id", "region"), "q4": ("person_id", "amount"),
           "q5": ("person_id", "day", "region")}


def copy_floor(frame: Any, q: str) -> Any:
    """The floor under the read-once guarantee: the query's columns copied once into a
    ``localCheckpoint`` (dpbudget's own ``copy``), the raw aggregate read from that copy, the
    copy freed. No check, key, bounding or noise: what any implementation that reads the source
    once and computes from that one version pays at least."""
    from dpbudget.accountant.tables import spark as copies
    checkpoint = copies.copy(frame.select(*COLUMNS[q]))
    try:
        return raw(checkpoint, q)
    finally:
        copies.free(checkpoint)


def run(path: str, cores: int, seeds: int, libs: tuple[str, ...]) -> dict[str, Any]:
    """``{lib: {q: median seconds}}`` on a local[``cores``] session."""
    import dpbudget as dp
    from dpbudget.policies.units import ContributionBounds
    spark = session(cores)
    frame = spark.read.parquet(path).cache()
    rows = frame.count()
    out: dict[str, Any] = {"rows": rows}
    for lib in libs:
        times: dict[str, list[float]] = {}
        for seed in range(seeds):
            if lib == "dpbudget":
                acc = dp.Accountant(limits={"events": dp.DatasetLimit(
                    limit=dp.Budget(5.0, peers.DELTA), privacy_unit="person_id",
                    bounds=ContributionBounds(max_rows_per_unit=peers.ROWS))}, rng=seed)
                context: Any = dp.table(acc, frame, dataset="events")
            elif lib == "tumult":  # (imported only when run: ``--only dpbudget`` needs no Tumult)
                from tmlt.analytics import AddRowsWithID, ApproxDPBudget, Session
                context = Session.from_dataframe(ApproxDPBudget(5.0, peers.DELTA), "events",
                                                 frame, protected_change=AddRowsWithID(
                                                     "person_id"))
            for q in QUERIES:
                start = time.perf_counter()
                if lib == "raw":
                    raw(frame, q)
                elif lib == "copy":
                    copy_floor(frame, q)
                else:
                    getattr(peers, f"{lib}_{q}")(context)
                seconds = time.perf_counter() - start
                times.setdefault(q, []).append(seconds)
                print(f"local[{cores}] {lib} seed {seed} {q}: {seconds:.2f} s", file=sys.stderr,
                      flush=True)
        out[lib] = {q: statistics.median(v) for q, v in times.items()}
    frame.unpersist()
    return out


def markdown(results: dict[int, Any]) -> str:
    """Seconds per query and library, per core count, with dpbudget's ratios."""
    lines = ["| cores | query | dpbudget s | Tumult s | raw s | copy + raw s | Tumult / dpbudget "
             "| dpbudget / raw | dpbudget / (copy + raw) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for cores, result in results.items():
        for q in QUERIES:
            d, t, r, c = (result.get(lib, {}).get(q) for lib in ("dpbudget", "tumult", "raw",
                                                                  "copy"))
            cell = [f"{x:.2f}" if x else "—" for x in (d, t, r, c)]
            ratios = [f"{a / b:.1f}×" if a and b else "—" for a, b in ((t, d), (d, r), (d, c))]
            lines.append(f"| local[{cores}] | {q.upper()} | " + " | ".join(cell + ratios) + " |")
    return "\n".join(lines) + "\n"


def main(persons: int, cores: list[int], seeds: int, libs: tuple[str, ...]) -> dict[int, Any]:
    import tempfile

    from dpbudget.examples.events import write_events
    path = str(write_events(Path(tempfile.mkdtemp()) / "events.parquet", persons))
    results = {c: run(path, c, seeds, libs) for c in cores}
    rows = next(iter(results.values()))["rows"]
    print(f"{rows:,} rows, {persons:,} persons, {seeds} runs per query (median)")
    print(markdown(results))
    return results
