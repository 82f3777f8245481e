"""Contribution bounding in the frame's engine: each unit keeps a uniformly random subset of its
rows — at most L0 groups and L∞ rows in each, or at most C rows in all.

Invariant: which rows of a unit are kept is a function of that unit's own rows and their keys
alone (sizes, minima and ranks are taken within the unit, or within unit × group), so removing a
unit leaves every other unit's kept rows as they were; each unit keeps at most the
``Contribution``'s rows, groups and rows per group, for every key draw (ranks are ordinal: ties
never keep an extra row). Wilson et al., "Differentially Private SQL with Bounded User
Contribution", PoPETs 2020, §3; Amin et al., "Bounding User Contributions", ICML 2019.

The keys (``dpbudget.accountant.tables.frames``) are iid uniform, so the L rows of smallest key
are a uniformly random subset. In memory, a partition (unit, or unit × group) of at most L rows
is kept whole without ranking: the same rows, and on real tables most partitions (ranking every
row costs three to four times as much on 10^6 rows: 0.26 s against 0.09–0.16 s in Polars, 0.60 s
against 0.19 s in pandas). On Spark the other way round: one window ranks every row, the same
rows again, where the sizes' shuffle, join and union cost more than sorting the small partitions
(a query takes 0.72–0.93× the time on 10^7 rows: benchmarks/README.md). The partition sizes are
a helper column, and every helper column is named with ``frames.PREFIX``; the rows bounded are
the copy ``frames.Frame.read`` made, whose every column is named by ``frames.inner`` (``PREFIX``
+ ``c0``, ...), never by the user: a user column can never stand in for a size or a rank (one
once did, and kept every unit whole). A unit's groups are ranked by g = 1 − (1 − k_min)^n, k_min
the smallest key of the group's n rows: the probability integral transform of the minimum of n
uniforms, itself uniform whatever n, so each of a unit's groups is equally likely to be kept
(``group_key``; ranking by k_min itself would favour large groups). No user column (``rows``,
``sum``, ...) collides with an aggregate's name either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpbudget.accountant.tables.frames import KEY, PREFIX
from dpbudget.accountant.tables.sensitivities import Contribution

__all__ = ["BIN", "ROWS", "SUM", "SQUARES", "UNITS", "bin_counts", "group_key", "kept_rows",
           "per_group", "unit_groups"]

ROWS, SUM, SQUARES, UNITS, BIN = (PREFIX + name for name in ("rows", "sum", "squares", "units",
                                                             "bin"))
_N, _KMIN, _GK, _RANK, _X, _X2 = (PREFIX + name for name in ("n", "kmin", "gk", "rank", "x",
                                                             "x2"))


def group_key(kmin: Any, n: Any) -> Any:
    """g = 1 − (1 − k_min)^n: uniform on [0, 1) for the minimum of n iid uniform keys."""
    return 1 - (1 - kmin) ** n


def _spark(rows: Any) -> bool:
    """Whether ``rows`` is a Spark frame, where ``_first`` ranks every row with one window."""
    import narwhals as nw
    return bool(rows.implementation is nw.Implementation.PYSPARK)


def _first(rows: Any, partition: Sequence[str], limit: int) -> Any:
    """The rows among the ``limit`` smallest keys of their partition (ordinal ranks: ties never
    keep an extra row). In memory ``rows`` carries each partition's size in ``_N``: partitions
    of at most ``limit`` rows whole, the others ranked; on Spark every row ranked."""
    import narwhals as nw
    rank = nw.col(KEY).rank("ordinal").over(*partition).alias(_RANK)
    if _spark(rows):
        return rows.with_columns(rank).filter(nw.col(_RANK) <= limit).drop(_RANK, _N,
                                                                             strict=False)
    small = rows.filter(nw.col(_N) <= limit)
    big = rows.filter(nw.col(_N) > limit).with_columns(rank) \
        .filter(nw.col(_RANK) <= limit).drop(_RANK)
    return nw.concat([small, big], how="vertical").drop(_N)


def kept_rows(keyed: Any, unit: str, groups: Sequence[str], c: Contribution) -> Any:
    """The rows kept. ``keyed``: a lazy frame with ``KEY`` (``frames.keyed``; its other columns
    named by ``frames.inner``)."""
    import narwhals as nw
    if not c.by_group:  # C rows per unit, the first C by key
        if _spark(keyed):
            return _first(keyed, [unit], c.total)
        sizes = keyed.group_by(unit).agg(nw.len().alias(_N))
        return _first(keyed.join(sizes, on=unit), [unit], c.total)
    within = [unit, *groups]
    return _first(keyed.join(_kept_groups(keyed, unit, groups, c), on=within), within,
                  c.per_group)


def _kept_groups(keyed: Any, unit: str, groups: Sequence[str], c: Contribution) -> Any:
    """The unit × group pairs kept (at most L0 per unit, by smallest g), with their rows in
    ``_N`` (before the L∞ cap)."""
    import narwhals as nw
    within = [unit, *groups]
    sizes = keyed.group_by(*within).agg(nw.len().alias(_N), nw.col(KEY).min().alias(_KMIN))
    if groups:  # the unit's L0 groups of smallest g
        sizes = sizes.with_columns(group_key(nw.col(_KMIN), nw.col(_N)).alias(_GK)) \
            .with_columns(nw.col(_GK).rank("ordinal").over(unit).alias(_RANK)) \
            .filter(nw.col(_RANK) <= c.groups)
    return sizes.select(*within, _N)


def unit_groups(keyed: Any, unit: str, groups: Sequence[str], c: Contribution,
                value: str | None = None, lower: float = 0.0, upper: float = 0.0,
                centre: float = 0.0) -> Any:
    """One row per kept unit × group: ``ROWS`` (its kept rows) and, with ``value``, ``SUM`` and
    ``SQUARES`` of the kept values clamped into [lower, upper], less ``centre``."""
    import narwhals as nw
    if value is None and c.by_group:  # a kept group keeps min(n, L∞) rows: no row-level step
        return _kept_groups(keyed, unit, groups, c).with_columns(
            nw.col(_N).clip(upper_bound=c.per_group).alias(ROWS)).drop(_N)
    return _totals(kept_rows(keyed, unit, groups, c), [unit, *groups], value, lower, upper,
                   centre)


def _totals(rows: Any, by: Sequence[str], value: str | None, lower: float, upper: float,
            centre: float) -> Any:
    """``ROWS`` and, with ``value``, ``SUM`` and ``SQUARES`` of the clamped values less
    ``centre``, per ``by`` (over all ``rows`` without it)."""
    import narwhals as nw
    aggs = [nw.len().alias(ROWS)]
    if value is not None:
        x = nw.col(value).cast(nw.Float64()).clip(lower, upper) - centre
        rows = rows.with_columns(x.alias(_X), (x * x).alias(_X2))
        aggs += [nw.col(_X).sum().alias(SUM), nw.col(_X2).sum().alias(SQUARES)]
    out = rows.group_by(*by).agg(*aggs) if by else rows.select(*aggs)
    return out.with_columns(nw.col(ROWS).cast(nw.Int64()))  # (DuckDB sums integers as decimals)


def per_group(keyed: Any, unit: str, groups: Sequence[str], c: Contribution,
              value: str | None = None, lower: float = 0.0, upper: float = 0.0,
              centre: float = 0.0, units: bool = True) -> Any:
    """The aggregates per group (one row each; over the whole table without ``groups``):
    ``ROWS``, ``SUM``/``SQUARES`` with ``value``, and with ``units`` ``UNITS`` (distinct units,
    through one row per unit × group; without it, under C rows per unit, straight from the kept
    rows: a third less work on 10^6 rows)."""
    import narwhals as nw
    if not units and not c.by_group:
        return _totals(kept_rows(keyed, unit, groups, c), groups, value, lower, upper, centre)
    pairs = unit_groups(keyed, unit, groups, c, value, lower, upper, centre)
    names = pairs.collect_schema().names()
    aggs = [nw.col(ROWS).sum().alias(ROWS), nw.len().alias(UNITS)]
    aggs += [nw.col(n).sum().alias(n) for n in (SUM, SQUARES) if n in names]
    out = pairs.group_by(*groups).agg(*aggs) if groups else pairs.select(*aggs)
    return out.with_columns(nw.col(ROWS).cast(nw.Int64()))


def bin_counts(keyed: Any, unit: str, c: Contribution, value: str, lower: float, upper: float,
               bins: int, groups: Sequence[str] = ()) -> Any:
    """The kept rows per candidate bin of a quantile (``BinnedQuantile``), per group with
    ``groups`` (each unit bounded to L0 groups of L∞ rows, or C rows): bin j holds the values
    in (c_{j−1}, c_j] of the evenly spaced candidates c_j = lower + j·(upper − lower)/bins (bin 0:
    at most lower), after clamping. A value within a rounding of a candidate may fall in the
    next bin: each row's bin is a function of its value alone, which is all the sensitivity
    needs."""
    import narwhals as nw
    rows = kept_rows(keyed, unit, groups, c)
    step = upper / bins - lower / bins
    x = nw.col(value).cast(nw.Float64()).clip(lower, upper)
    j = ((x - lower) / step).ceil().clip(0, bins).cast(nw.Int64()).alias(BIN)
    return rows.select(*groups, j).group_by(*groups, BIN).agg(nw.len().alias(ROWS))
