"""The five table queries of ``benchmarks/tables.py`` written for each peer library.

Each library has a ``setup_<lib>(path, seed)`` that loads the Parquet file into its own frame
and opens its session (not timed) and one function per query (timed, its source counted as the
user's lines). A query function returns ``{name: {key: value}}``; keys are strings (``"r03"``,
``"17|r03"`` for day × region, ``""`` for a scalar). The same bounds everywhere: 20 rows per
person, 3 regions per person for Q3, amount in [0, 1000], ε = 1 per person per query, δ = 1e-6
where keys are selected privately (Q5). Peers draw noise from their own generators, which take
no seed; ``seed`` seeds only dpbudget's.

No top-level import of any peer: each runs in its own interpreter (they conflict on pandas).
"""

from __future__ import annotations

from typing import Any

REGIONS = tuple(f"r{i:02d}" for i in range(20))
EPSILON, DELTA, ROWS, GROUPS, LOWER, UPPER = 1.0, 1e-6, 20, 3, 0.0, 1000.0


def _keyed(pairs: Any) -> dict[str, float]:
    """``{"day|region" or "region": value}`` from (key..., value) rows."""
    return {"|".join(str(k) for k in row[:-1]): float(row[-1]) for row in pairs}


# -- dpbudget (the queries of examples/events_report.py, reused) -----------------------------------

def setup_dpbudget(path: str, seed: int) -> Any:
    import polars as pl

    import dpbudget as dp
    from dpbudget.policies.units import ContributionBounds
    acc = dp.Accountant(limits={"events": dp.DatasetLimit(
        limit=dp.Budget(5.0, DELTA), privacy_unit="person_id",
        bounds=ContributionBounds(max_rows_per_unit=ROWS))}, rng=seed)
    return dp.table(acc, pl.read_parquet(path), dataset="events")


def dpbudget_q1(t: Any) -> dict[str, Any]:
    return {"Q1": t.group_by("region", keys=REGIONS).count(epsilon=EPSILON).release()}


def dpbudget_q2(t: Any) -> dict[str, Any]:
    out = t.group_by("region", keys=REGIONS).mean("amount", lower=LOWER, upper=UPPER,
                                                   epsilon=EPSILON).release()
    return {"Q2 sum": {k: v["sum"] for k, v in out.items()},
            "Q2 mean": {k: v["mean"] for k, v in out.items()}}


def dpbudget_q3(t: Any) -> dict[str, Any]:
    return {"Q3": t.group_by("region", keys=REGIONS).count_distinct_units(
        epsilon=EPSILON, max_groups_per_unit=GROUPS, max_rows_per_group=ROWS).release()}


def dpbudget_q4(t: Any) -> dict[str, Any]:
    return {"Q4": {"": t.median("amount", lower=LOWER, upper=UPPER, bins=10_000,
                                epsilon=EPSILON).release()}}


def dpbudget_q5(t: Any) -> dict[str, Any]:
    out = t.group_by("day", "region").count(epsilon=EPSILON, delta=DELTA).release()
    return {"Q5": {f"{d}|{r}": v for (d, r), v in out.items()}}


# -- Tumult Analytics (Spark, local mode) ---------------------------------------------------------

def setup_tumult(path: str, seed: int) -> Any:
    import os
    import sys
    from pyspark.sql import SparkSession
    from tmlt.analytics import AddRowsWithID, ApproxDPBudget, Session
    os.environ["PYSPARK_PYTHON"] = sys.executable  # (Spark's Python workers: this venv)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
        .config("spark.sql.shuffle.partitions", "8").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    frame = spark.read.parquet(path).cache()
    frame.count()
    return Session.from_dataframe(ApproxDPBudget(5.0, DELTA), "events", frame,
                                  protected_change=AddRowsWithID("person_id"))


def tumult_q1(session: Any) -> dict[str, Any]:
    from tmlt.analytics import KeySet, MaxRowsPerID, PureDPBudget, QueryBuilder
    query = QueryBuilder("events").enforce(MaxRowsPerID(ROWS)) \
        .groupby(KeySet.from_dict({"region": list(REGIONS)})).count()
    return {"Q1": _keyed(session.evaluate(query, PureDPBudget(EPSILON)).collect())}


def tumult_q2(session: Any) -> dict[str, Any]:
    from tmlt.analytics import KeySet, MaxRowsPerID, PureDPBudget, QueryBuilder
    grouped = QueryBuilder("events").enforce(MaxRowsPerID(ROWS)) \
        .groupby(KeySet.from_dict({"region": list(REGIONS)}))
    sums = session.evaluate(grouped.sum("amount", LOWER, UPPER), PureDPBudget(EPSILON / 2))
    means = session.evaluate(grouped.average("amount", LOWER, UPPER), PureDPBudget(EPSILON / 2))
    return {"Q2 sum": _keyed(sums.collect()), "Q2 mean": _keyed(means.collect())}


def tumult_q3(session: Any) -> dict[str, Any]:
    from tmlt.analytics import KeySet, MaxGroupsPerID, PureDPBudget, QueryBuilder
    query = QueryBuilder("events").enforce(MaxGroupsPerID("region", GROUPS)) \
        .groupby(KeySet.from_dict({"region": list(REGIONS)})).count_distinct(["person_id"])
    return {"Q3": _keyed(session.evaluate(query, PureDPBudget(EPSILON)).collect())}


def tumult_q4(session: Any) -> dict[str, Any]:
    from tmlt.analytics import MaxRowsPerID, PureDPBudget, QueryBuilder
    query = QueryBuilder("events").enforce(MaxRowsPerID(ROWS)).median("amount", LOWER, UPPER)
    return {"Q4": {"": float(session.evaluate(query, PureDPBudget(EPSILON)).collect()[0][0])}}


def tumult_q5(session: Any) -> dict[str, Any]:
    from tmlt.analytics import (ApproxDPBudget, KeySet, MaxRowsPerID, PureDPBudget,
                                QueryBuilder)
    bounded = QueryBuilder("events").enforce(MaxRowsPerID(ROWS))
    groups = session.evaluate(bounded.get_groups(["day", "region"]),
                              ApproxDPBudget(EPSILON / 2, DELTA))
    query = QueryBuilder("events").enforce(MaxRowsPerID(ROWS)) \
        .groupby(KeySet.from_dataframe(groups)).count()
    return {"Q5": _keyed(session.evaluate(query, PureDPBudget(EPSILON / 2)).collect())}


# -- PipelineDP (local backend) -------------------------------------------------------------------

def setup_pipelinedp(path: str, seed: int) -> Any:
    import pandas as pd
    frame = pd.read_parquet(path)
    return list(zip(frame["person_id"].tolist(), frame["region"].tolist(),
                    frame["day"].tolist(), frame["amount"].tolist()))


def _pipelinedp(rows: Any, metrics: Any, key: Any, value: Any, epsilon: float, delta: float,
                keys: Any, **bounds: Any) -> list[Any]:
    import pipeline_dp
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(metrics=metrics, min_value=LOWER, max_value=UPPER,
                                         **bounds)
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                            partition_extractor=key, value_extractor=value)
    result = engine.aggregate(rows, params, extractors, public_partitions=keys)
    accountant.compute_budgets()
    return list(result)


def pipelinedp_q1(rows: Any) -> dict[str, Any]:
    import pipeline_dp
    out = _pipelinedp(rows, [pipeline_dp.Metrics.COUNT], lambda r: r[1], lambda r: 0, EPSILON,
                      0.0, list(REGIONS), max_contributions=ROWS)
    return {"Q1": {k: m.count for k, m in out}}


def pipelinedp_q2(rows: Any) -> dict[str, Any]:
    import pipeline_dp
    out = _pipelinedp(rows, [pipeline_dp.Metrics.SUM, pipeline_dp.Metrics.MEAN], lambda r: r[1],
                      lambda r: r[3], EPSILON, 0.0, list(REGIONS), max_contributions=ROWS)
    return {"Q2 sum": {k: m.sum for k, m in out}, "Q2 mean": {k: m.mean for k, m in out}}


def pipelinedp_q3(rows: Any) -> dict[str, Any]:
    import pipeline_dp
    out = _pipelinedp(rows, [pipeline_dp.Metrics.PRIVACY_ID_COUNT], lambda r: r[1],
                      lambda r: 0, EPSILON, 0.0, list(REGIONS),
                      max_partitions_contributed=GROUPS, max_contributions_per_partition=ROWS)
    return {"Q3": {k: m.privacy_id_count for k, m in out}}


def pipelinedp_q4(rows: Any) -> dict[str, Any]:
    import pipeline_dp
    # (max_contributions is refused for percentiles: one partition, 20 rows in it)
    out = _pipelinedp(rows, [pipeline_dp.Metrics.PERCENTILE(50)], lambda r: "all",
                      lambda r: r[3], EPSILON, 0.0, ["all"], max_partitions_contributed=1,
                      max_contributions_per_partition=ROWS)
    return {"Q4": {"": float(out[0][1].percentile_50)}}


def pipelinedp_q5(rows: Any) -> dict[str, Any]:
    import pipeline_dp
    # its partition selection needs max_partitions_contributed: 20 partitions, 1 row in each
    # (the same L1 bound, 20, as the others; a second row in one day × region is dropped)
    out = _pipelinedp(rows, [pipeline_dp.Metrics.COUNT], lambda r: (r[2], r[1]), lambda r: 0,
                      EPSILON, DELTA, None, max_partitions_contributed=ROWS,
                      max_contributions_per_partition=1)
    return {"Q5": {f"{d}|{r}": m.count for (d, r), m in out}}


# -- SmartNoise SQL (pandas reader) ---------------------------------------------------------------

def setup_smartnoise(path: str, seed: int) -> Any:
    import pandas as pd
    return pd.read_parquet(path).rename(columns={"day": "event_day"})  # (DAY: a SQL keyword)


def _smartnoise(frame: Any, sql: str, epsilon: float, delta: float, censor: bool) -> list[Any]:
    import snsql
    meta = {"events": {"events": {"events": {
        "row_privacy": False, "max_ids": ROWS, "censor_dims": censor, "sample_max_ids": True,
        "person_id": {"type": "int", "private_id": True}, "region": {"type": "string"},
        "event_day": {"type": "int"}, "amount": {"type": "float", "lower": LOWER, "upper": UPPER}}}}}
    reader = snsql.from_df(frame, privacy=snsql.Privacy(epsilon=epsilon, delta=delta),
                           metadata=meta)
    return list(reader.execute(sql))[1:]  # (the first row: the column names)


def smartnoise_q1(frame: Any) -> dict[str, Any]:
    rows = _smartnoise(frame, "SELECT region, COUNT(*) FROM events.events GROUP BY region",
                       EPSILON, 0.0, censor=False)
    return {"Q1": _keyed(rows)}


def smartnoise_q2(frame: Any) -> dict[str, Any]:
    # SUM and AVG share one noisy SUM and one noisy COUNT: each is charged ε, so ε/2 here
    rows = _smartnoise(frame, "SELECT region, SUM(amount), AVG(amount) FROM events.events "
                       "GROUP BY region", EPSILON / 2, 0.0, censor=False)
    return {"Q2 sum": _keyed([(r[0], r[1]) for r in rows]),
            "Q2 mean": _keyed([(r[0], r[2]) for r in rows])}


def smartnoise_q3(frame: Any) -> dict[str, Any]:
    # its bound is rows per person (max_ids), not regions per person: no way to state 3 groups
    rows = _smartnoise(frame, "SELECT region, COUNT(DISTINCT person_id) FROM events.events "
                       "GROUP BY region", EPSILON, 0.0, censor=False)
    return {"Q3": _keyed(rows)}


def smartnoise_q5(frame: Any) -> dict[str, Any]:
    rows = _smartnoise(frame, "SELECT event_day, region, COUNT(*) FROM events.events "
                       "GROUP BY event_day, region", EPSILON, DELTA, censor=True)
    return {"Q5": _keyed(rows)}


# -- OpenDP (Polars front end) --------------------------------------------------------------------

def setup_opendp(path: str, seed: int) -> Any:
    import polars as pl
    return pl.read_parquet(path).lazy()


def _opendp(frame: Any, delta: float = 0.0) -> Any:
    import opendp.prelude as dp
    dp.enable_features("contrib")
    # max_length: a public upper bound on rows (in all, and per region), which float sums and
    # quantiles need; 10^7 is ten times the table
    margins = [dp.polars.Margin(by=[], max_length=10**7),
               dp.polars.Margin(by=["region"], max_length=10**7)]
    return dp.Context.compositor(
        data=frame, privacy_unit=dp.unit_of(contributions=1, identifier="person_id"),
        privacy_loss=dp.loss_of(epsilon=EPSILON, delta=delta), split_evenly_over=1,
        margins=margins)


def opendp_q1(frame: Any) -> dict[str, Any]:
    import polars as pl
    query = _opendp(frame).query().truncate_per_group(ROWS).group_by("region") \
        .agg(pl.len().dp.noise()).with_keys(pl.LazyFrame({"region": REGIONS}))
    return {"Q1": _keyed(query.release().collect().iter_rows())}


def opendp_q2(frame: Any) -> dict[str, Any]:
    import polars as pl
    query = _opendp(frame).query().truncate_per_group(ROWS).group_by("region").agg(
        pl.col("amount").fill_null(0).dp.sum((LOWER, UPPER)).alias("sum"),
        pl.len().dp.noise().alias("n")).with_keys(pl.LazyFrame({"region": REGIONS}))
    out = query.release().collect()
    return {"Q2 sum": _keyed(out.select("region", "sum").iter_rows()),
            "Q2 mean": _keyed(out.select("region", pl.col("sum") / pl.col("n")).iter_rows())}


def opendp_q3(frame: Any) -> dict[str, Any]:
    import polars as pl
    # one row per person and region, then 3 regions per person: a count of rows is of persons
    # (keep="sample" fails in 0.14.2: "multiple fields with name 'region'"; "first" keeps the
    # first 3 regions by name, a valid bound, biased towards low names)
    query = _opendp(frame).query().truncate_per_group(1, by=["region"]) \
        .truncate_num_groups(GROUPS, by=["region"], keep="first").group_by("region").agg(pl.len().dp.noise()) \
        .with_keys(pl.LazyFrame({"region": REGIONS}))
    return {"Q3": _keyed(query.release().collect().iter_rows())}


def opendp_q4(frame: Any) -> dict[str, Any]:
    import polars as pl
    candidates = [LOWER + i * (UPPER - LOWER) / 10_000 for i in range(10_001)]
    query = _opendp(frame).query().truncate_per_group(ROWS).select(
        pl.col("amount").fill_null(0).dp.median(candidates))
    return {"Q4": {"": float(query.release().collect().item())}}


def opendp_q5(frame: Any) -> dict[str, Any]:
    import polars as pl
    query = _opendp(frame, DELTA).query().truncate_per_group(ROWS) \
        .group_by("day", "region").agg(pl.len().dp.noise())
    return {"Q5": _keyed(query.release().collect().iter_rows())}


LIBRARIES = ("dpbudget", "tumult", "pipelinedp", "smartnoise", "opendp")
UNSUPPORTED = {("smartnoise", "q4"): "no median (no quantiles in SmartNoise SQL)"}
