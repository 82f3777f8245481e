"""Two Spark jobs, one budget: the five events queries on Spark, charged to a shared ledger.

The events table (``dpbudget.examples.events``) is written as Parquet; two jobs — separate
processes, each with its own local SparkSession, as two notebooks or services would be — read it
with Spark and run the five queries of ``events_report`` per person (ε = 1 each) against ONE
ledger: SQLite by default (a file both open), or PostgreSQL (``--ledger postgresql://...``). The
dataset's limit is ε = 5 per person: together the two jobs get five queries through; every query
past the limit is refused, with nothing drawn and nothing debited. The bounding and the
aggregation run on Spark's executors; only per-group aggregates reach the driver, where the
accountant debits the ledger before any noise is drawn. ``dpbudget audit`` then verifies the
ledger and shows both jobs' releases.

Neither Spark session holds the budget: it lives in the ledger, so a third job, tomorrow, is held
to what these two left (ε = 0).

Run: ``python -m dpbudget.examples.spark_events [--persons N] [--ledger URL]``
(``pip install "dpbudget[spark]"`` and a Java runtime).
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import dpbudget as dp
from dpbudget.examples.events import write_events
from dpbudget.examples.events_report import queries
from dpbudget.policies.units import ContributionBounds

LIMIT = dp.Budget(5.0, 1e-5)


def accountant(ledger: str) -> Any:
    """The accountant both jobs open: the same policy, the same ledger (the OS CSPRNG: a
    durable ledger takes no seed)."""
    return dp.Accountant(limits={"events": dp.DatasetLimit(
        limit=LIMIT, privacy_unit="person_id",
        bounds=ContributionBounds(max_rows_per_unit=20))}, ledger=ledger)


def job(name: str, data: str, ledger: str, start: Any) -> dict[str, str]:
    """One job: a local SparkSession reads the Parquet file; the five queries, each released or
    refused. Returns what happened to each."""
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[1]").appName(name)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        acc = accountant(ledger)
        t = dp.table(acc, spark.read.parquet(data), dataset="events")
        start.wait()  # (both jobs query at once)
        out = {}
        for query_name, query in queries(t).items():
            try:
                query.release(label=f"{name} {query_name.split()[0]}")
                out[query_name] = "released"
            except dp.BudgetExceededError:
                out[query_name] = "refused"
        acc.close()
        return out
    finally:
        spark.stop()


def _run(name: str, data: str, ledger: str, start: Any, results: Any) -> None:
    results[name] = job(name, data, ledger, start)


def main(argv: list[str] | None = None) -> dict[str, dict[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--persons", type=int, default=20_000)
    parser.add_argument("--ledger", default=None, help="a ledger URL (default: a new SQLite "
                        "file); postgresql://... for a shared server")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp())
    data = str(write_events(folder / "events.parquet", args.persons))
    ledger = args.ledger or f"sqlite:///{folder / 'budget.db'}"
    accountant(ledger).close()  # (the policy's record, written once before the jobs start)
    context = multiprocessing.get_context("spawn")  # (a fresh interpreter, as a second job)
    with context.Manager() as manager:
        start, results = manager.Barrier(2), manager.dict()
        jobs = [context.Process(target=_run, args=(f"job-{i}", data, ledger, start, results))
                for i in (1, 2)]
        for p in jobs:
            p.start()
        for p in jobs:
            p.join()
        outcome = dict(results)
    for name in sorted(outcome):
        print(f"{name}: " + ", ".join(f"{q.split()[0]} {what}" for q, what in
                                        outcome[name].items()))
    released = sum(w == "released" for r in outcome.values() for w in r.values())
    acc = accountant(ledger)
    print(f"{released} queries released in all; spent ε = {acc.spent('events').epsilon:.4f} "
          f"of {LIMIT.epsilon} per person")
    acc.close()
    audit = subprocess.run([sys.executable, "-m", "dpbudget.accountant.cli", "audit", ledger],
                           capture_output=True, text=True, check=False)
    print(audit.stdout.rstrip())
    print(f"audit exit status: {audit.returncode}")
    return outcome


if __name__ == "__main__":
    main()
