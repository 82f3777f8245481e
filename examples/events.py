"""A synthetic events table: many rows per person, the shape real tables have.

``events_columns(persons=200_000)`` draws about 10^6 rows: one person has 1 to 40 rows (a
geometric count, mean about 5, capped at 40), each with a ``region`` (one of 20; four rows in five
in the person's home region), a ``day`` (0 to 29) and an ``amount`` (log-normal, a long right tail
past 1,000). It is the table of issue "Budgets per person": a count per region released at ε per
*row* costs a person with 40 rows 40·ε; released per *person* (a privacy unit with contribution
bounds) it costs ε.

The columns are numpy arrays, the same for the same seed, so that every engine and every peer
library reads the same data: ``events_frame`` builds a pandas or Polars frame from them, and
``write_events`` writes a Parquet or CSV file for DuckDB.

>>> cols = events_columns(persons=1000, seed=1)
>>> sorted(cols)
['amount', 'day', 'person_id', 'region']
>>> counts = np.bincount(cols["person_id"])
>>> int(counts.min()) >= 1 and int(counts.max()) <= MAX_ROWS
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DAYS", "MAX_ROWS", "REGIONS", "events_columns", "events_frame", "write_events"]

REGIONS = tuple(f"r{i:02d}" for i in range(20))
DAYS = 30
MAX_ROWS = 40


def events_columns(persons: int = 200_000, seed: int = 20261127) -> dict[str, np.ndarray]:
    """The events table as columns: ``person_id`` (int64), ``region`` (str), ``day`` (int64),
    ``amount`` (float64, rounded to cents). The same for the same ``persons`` and ``seed``."""
    if isinstance(persons, bool) or not isinstance(persons, int) or persons < 1:
        raise ValueError("persons must be a positive int")
    rng = np.random.default_rng(seed)
    rows = np.minimum(rng.geometric(0.2, persons), MAX_ROWS)
    person = np.repeat(np.arange(persons, dtype=np.int64), rows)
    n = len(person)
    home = rng.integers(0, len(REGIONS), persons)[person]
    away = rng.integers(0, len(REGIONS), n)
    region_index = np.where(rng.random(n) < 0.8, home, away)
    day = rng.integers(0, DAYS, n).astype(np.int64)
    amount = np.round(np.exp(rng.normal(4.5, 1.0, n)), 2)
    order = rng.permutation(n)  # rows of one person are not adjacent in a real log
    return {"person_id": person[order], "region": np.asarray(REGIONS)[region_index[order]],
            "day": day[order], "amount": amount[order]}


def events_frame(persons: int = 200_000, seed: int = 20261127, *, backend: str = "pandas") -> Any:
    """The events table as a ``"pandas"`` or ``"polars"`` DataFrame."""
    cols = events_columns(persons, seed)
    if backend == "pandas":
        import pandas as pd
        return pd.DataFrame(cols)
    if backend == "polars":
        import polars as pl
        return pl.DataFrame(cols)
    raise ValueError("backend must be 'pandas' or 'polars'")


def write_events(path: str | Path, persons: int = 200_000, seed: int = 20261127) -> Path:
    """Write the events table to ``path`` (``.parquet`` or ``.csv``, by its suffix)."""
    path = Path(path)
    frame = events_frame(persons, seed)
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        raise ValueError("path must end in .parquet or .csv")
    return path


if __name__ == "__main__":
    cols = events_columns()
    print(f"{len(cols['person_id']):,} rows, {len(np.unique(cols['person_id'])):,} persons")
