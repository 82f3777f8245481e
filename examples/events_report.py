"""Five queries per PERSON on an events table (issue "Budgets per person"), each at ε = 1.

The events table (``dpbudget.examples.events``: ~10^6 rows, 1–40 rows per person) declares its
privacy unit, ``person_id``, and default bounds (20 rows per person) in its policy; every query
is released through ``dp.table`` as one step, bounded per person in the frame's own engine:

  Q1 count per region            Q2 sum and mean of amount per region (amount in [0, 1000])
  Q3 distinct persons per region (3 regions per person)
  Q4 median amount               Q5 count per day × region, keys selected privately (δ = 1e-6)

Run: ``python -m dpbudget.examples.events_report [--persons N] [--engine pandas|polars|duckdb]``.
It prints each answer's error against the true (unbounded, non-private) value and its wall time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import dpbudget as dp
from dpbudget.examples.events import REGIONS, events_frame, write_events
from dpbudget.policies.units import ContributionBounds


def queries(t: Any) -> dict[str, Any]:
    """The five queries on a ``dp.table`` (bounds: the policy's 20 rows per person)."""
    by_region = t.group_by("region", keys=REGIONS)
    return {"Q1 count per region": by_region.count(epsilon=1.0),
            "Q2 mean amount per region": by_region.mean("amount", lower=0, upper=1000,
                                                         epsilon=1.0),
            "Q3 persons per region": by_region.count_distinct_units(
                epsilon=1.0, max_groups_per_unit=3, max_rows_per_group=20),
            "Q4 median amount": t.median("amount", lower=0, upper=1000, bins=10_000,
                                         epsilon=1.0),
            "Q5 count per day x region": t.group_by("day", "region").count(epsilon=1.0,
                                                                           delta=1e-6)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--persons", type=int, default=200_000)
    parser.add_argument("--engine", choices=("pandas", "polars", "duckdb"), default="polars")
    args = parser.parse_args(argv)
    data = events_frame(args.persons)
    frame: Any = data if args.engine == "pandas" else None
    if args.engine == "polars":
        import polars as pl
        frame = pl.DataFrame(data)
    elif args.engine == "duckdb":  # a Parquet file, read by the embedded DuckDB
        frame = write_events(Path(tempfile.mkdtemp()) / "events.parquet", args.persons)
    acc = dp.Accountant(limits={"events": dp.DatasetLimit(
        limit=dp.Budget(5.0, 1e-6), privacy_unit="person_id",
        bounds=ContributionBounds(max_rows_per_unit=20))}, rng=0)
    t = dp.table(acc, frame, dataset="events")
    truth = {"Q1": data.groupby("region").size(), "Q2": data.groupby("region")["amount"].mean(),
             "Q3": data.groupby("region")["person_id"].nunique(),
             "Q5": data.groupby(["day", "region"]).size()}
    answers: dict[str, Any] = {}
    print(f"{len(data):,} rows, {args.persons:,} persons, engine {args.engine}")
    for name, query in queries(t).items():
        start = time.perf_counter()
        answer = query.release(label=name.split()[0])
        seconds = time.perf_counter() - start
        answers[name] = answer
        key = name.split()[0]
        if key == "Q4":
            error = abs(answer - float(np.median(data["amount"]))) / float(np.median(data["amount"]))
        elif key == "Q2":
            error = float(np.mean([abs(answer[r]["mean"] - truth[key][r]) / truth[key][r]
                                   for r in REGIONS]))
        else:
            true = truth[key]
            error = float(np.mean([abs(answer.get(k, 0) - true[k]) / true[k] for k in true.index]))
        print(f"{name:28s} mean relative error {error:7.2%}   {seconds:6.3f} s")
    spent = acc.spent("events")
    print(f"spent: ε = {spent.epsilon:.4f} per person, δ = {spent.delta:g}")
    return answers


if __name__ == "__main__":
    main()
