"""Small tables and helpers shared by the table tests: coupled keys (the rows two neighbours
share keep their keys), and a generator that hands out given keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.values.budget import Budget
from dpbudget.policies.limits import DatasetLimit


class GivenKeys:
    """Stands for the generator ``Frame.keyed`` draws from: hands out the given key columns."""

    def __init__(self, *columns: np.ndarray) -> None:
        self.columns = list(columns)

    def random(self, n: int) -> np.ndarray:
        out = self.columns.pop(0)
        assert len(out) == n
        return out


def small_table(seed: int, units: int = 3, max_rows: int = 6, groups: int = 3) -> pd.DataFrame:
    """A table of a few units with 1 to ``max_rows`` rows each, groups "a", "b", ..., values on
    [−5, 15] (some outside the clamps used, [0, 10])."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, max_rows + 1, units)
    unit = np.repeat(np.arange(units), rows)
    return pd.DataFrame({"unit": unit,
                         "group": np.asarray(list("abcdefgh"[:groups]))[
                             rng.integers(0, groups, len(unit))],
                         "x": rng.uniform(-5, 15, len(unit)).round(2)})


def without(frame: pd.DataFrame, keys: tuple[np.ndarray, ...], unit: Any
            ) -> tuple[pd.DataFrame, tuple[np.ndarray, ...]]:
    """The neighbour without every row of ``unit``, with the shared rows' keys (the coupling)."""
    keep = (frame["unit"] != unit).to_numpy()
    return frame[keep].reset_index(drop=True), tuple(k[keep] for k in keys)


def accountant(eps: float = 100.0, delta: float = 1e-3, unit: str | None = "unit",
               rng: Any = 0) -> Accountant:
    return Accountant(limits={"t": DatasetLimit(limit=Budget(eps, delta), privacy_unit=unit)},
                      rng=rng)


def old_engine(call: Any, columns: Any) -> Any:
    """The broken ``frames.engine`` (negative controls): raised INSIDE its handler, the typed
    error keeps the engine's own (and its message, which may quote data) as ``__context__``."""
    from dpbudget.accountant.values.errors import InvalidDataError, PrivacyError
    try:
        return call()
    except PrivacyError:
        raise
    except Exception as error:
        raise InvalidDataError(f"columns {columns}", None, "readable data",
                               f" ({type(error).__name__})") from None


def old_keyed(rows: Any, rng: Any, kind: str) -> Any:
    """The broken ``frames.keyed`` for DuckDB (negative controls): narwhals' ``lazy(backend=
    "duckdb")`` registers the copy on DuckDB's one default connection."""
    import narwhals as nw
    from dpbudget.accountant.tables.frames import KEY
    key = nw.new_series(KEY, rng.random(len(rows)), nw.Float64(),
                        backend=nw.get_native_namespace(rows))
    return rows.with_columns(key).lazy(backend="duckdb")


def context_texts(error: BaseException) -> str:
    """The text of every error chained to ``error`` (``__context__`` and ``__cause__``)."""
    texts, seen = [], error.__context__ or error.__cause__
    while seen is not None:
        texts.append(f"{seen!s} {seen!r}")
        seen = seen.__context__ or seen.__cause__
    return " ".join(texts)


PERSON = "person_id"  # the events table's unit (dpbudget.examples.events)


def events_accountant(eps: float = 100.0, rng: Any = 0) -> Accountant:
    return Accountant(limits={"events": DatasetLimit(limit=Budget(eps, 1e-3),
                                                     privacy_unit=PERSON)}, rng=rng)


def five_queries(frame: Any, bound: int) -> dict[str, Any]:
    """The five queries of benchmarks/tables.py, each person's rows bounded to ``bound`` (Q5 per
    region at ε = 10: per day × region, no key of a small table clears the threshold)."""
    from dpbudget.accountant.tables.builder import table
    from dpbudget.examples.events import REGIONS
    t = table(events_accountant(), frame, dataset="events")
    by_region = t.group_by("region", keys=REGIONS)
    b = {"max_rows_per_unit": bound}
    return {"Q1": by_region.count(epsilon=1.0, **b).release(),
            "Q2": by_region.mean("amount", lower=0, upper=1000, epsilon=1.0, **b).release(),
            "Q3": by_region.count_distinct_units(epsilon=1.0, max_groups_per_unit=bound,
                                                 max_rows_per_group=bound).release(),
            "Q4": t.median("amount", lower=0, upper=1000, epsilon=1.0, **b).release(),
            "Q5": t.group_by("region").count(epsilon=10.0, delta=1e-3, **b).release()}
