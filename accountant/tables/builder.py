"""The table API: ``table(acc, frame, dataset=...)``, filtered, grouped, then one statistic,
released per privacy unit as one all-or-nothing step.

Invariant: everything that decides the charge — the unit, the bounds, ε (and δ), the statistic's
parameters, the public keys — is fixed and checked before the debit: the frame's schema, then
the columns the query reads, read ONCE into memory (``Frame.read``), checked for null ids,
non-finite values and mixed types, then filtered (an engine error there is a refusal too; on
Spark, whose filter is lazy, an error at run time comes after the debit); the debit goes through
the gate's ``release_bounded``, which only then hands ``compute`` its generator: the random keys
(on that same copy), the bounding and the aggregation run after the debit; only aggregates reach
Python; the copy is then freed. A refusal draws nothing and debits nothing.

The entry is a function of this layer, not a method of ``Accountant``: the gate sits below the
tables (tests/test_layers.py), so the accountant cannot import the builder.

Filters are ``(column, op, value)`` triples with a public constant — a plain scalar of the
column's type (``frames.check_keys``), never an expression, not even as the "constant":
a window or aggregate expression (``x > mean(x)``) would let one unit's rows decide which rows of
another unit are kept, and the bounding's sensitivity would no longer hold.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.gate.bounded import UnitBounds, release_bounded
from dpbudget.accountant.gate.unnamed import NOT_GIVEN
from dpbudget.accountant.tables import bounding, dask, frames
from dpbudget.accountant.tables.aggregates import (Statistic, clipped, fitted, plain,
                                                   present_keys, released)
from dpbudget.accountant.tables.sensitivities import (BOUND_NAMES, Contribution, contribution,
                                                       distinct_contribution, recorded)
from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataTypeError,
                                               InvalidTypeError)
from dpbudget.mechanisms.partition_selection import PartitionSelection

__all__ = ["TableQuery", "Table", "table"]

_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
        ">": operator.gt, ">=": operator.ge}


class _Spec(NamedTuple):
    filters: tuple[tuple[str, str, Any], ...] = ()
    groups: tuple[str, ...] = ()
    keys: tuple[Any, ...] | None = None  # None: selected privately (when grouped)


def table(accountant: Any, frame: Any, *, dataset: Any = NOT_GIVEN,
          analyst: str | None = None) -> "Table":
    """A table of ``dataset``, queried per the privacy unit its policy declares.

    The unit is the policy's, never the caller's: on a dataset limited per row, a query bounded
    per some other column is not ε per row (removing one row of a unit can swap which of its rows
    are kept, moving a count by 2 where the bound is 1: tests/tables/test_builder.py), so a
    dataset without ``privacy_unit`` is refused.

    Args:
        accountant: the ``Accountant`` that checks and debits each query.
        frame: a pandas DataFrame, a Polars DataFrame or LazyFrame, a DuckDB relation, a
            PySpark or Dask DataFrame, or a ``.parquet``/``.csv`` path (read by DuckDB).
        dataset, analyst: charged as by ``Accountant.release`` (several datasets must declare
            the same unit; each bound a query leaves out is the smallest they declare).

    Raises:
        InvalidTypeError: a frame this layer does not read.
        InvalidArgumentError: a dataset that declares no privacy unit, or datasets that declare
            different ones (``unit``).
    """
    if not isinstance(accountant, Accountant):  # (a pipeline's gate would skip its own plan)
        raise InvalidDataTypeError("accountant", accountant, "an Accountant")  # (not shown)
    gate = accountant._gate
    opened = dask.opened(frame) or frames.open_frame(frame)
    plan = gate.plan((dataset, analyst, None))
    names = (plan.dataset,) if isinstance(plan.dataset, str) else tuple(plan.dataset)
    limits = [gate.planner.limit(name) for name in names]
    units = {lim.privacy_unit for lim in limits}
    if len(units) != 1 or None in units:
        raise InvalidArgumentError("unit", None, "one privacy_unit declared by every dataset "
                                   "queried (in its policy): a table query is per that unit")
    policy: dict[str, Any] = {}
    for name in BOUND_NAMES:
        given = [b for lim in limits if (b := getattr(lim.bounds, name, None)) is not None]
        policy[name] = min(given) if given else None
    return Table(gate, opened, (dataset, analyst, None), str(units.pop()), policy, _Spec())


class Table:
    """A table to query per privacy unit (immutable: each step returns a new one)."""

    def __init__(self, gate: Any, frame: frames.Frame, where: tuple[Any, ...], unit: str,
                 policy: dict[str, Any], spec: _Spec) -> None:
        self._gate, self._frame, self._where = gate, frame, where
        self._unit, self._policy, self._spec = unit, policy, spec

    def _with(self, **changes: Any) -> "Table":
        return Table(self._gate, self._frame, self._where, self._unit, self._policy,
                     self._spec._replace(**changes))

    def filter(self, column: str, op: str, value: Any) -> "Table":
        """Keep the rows where ``column op value`` (op: ``==``, ``!=``, ``<``, ``<=``, ``>``,
        ``>=``, ``in``, ``not in``; ``value`` a public constant, a sequence for ``in``)."""
        if op not in _OPS and op not in ("in", "not in"):
            raise InvalidArgumentError("op", op, "one of ==, !=, <, <=, >, >=, in, not in")
        if op in ("in", "not in"):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise InvalidDataTypeError("value", value, "a sequence of values for 'in'")
            value = tuple(value)
        return self._with(filters=(*self._spec.filters, (column, op, value)))

    def group_by(self, *columns: str, keys: Any = None) -> "Table":
        """Group by ``columns``. ``keys``: the public keys to release (a value per key, a tuple
        per key for several columns); a key absent from the data gets a noisy 0, and rows with
        other keys are dropped before bounding. Without ``keys`` the keys are selected privately
        (the query needs ``delta``): a count in one step (``PartitionSelection``: a key's noisy
        count is released if it clears a threshold); a sum, mean or variance spends
        ``selection_share`` of ε (default 1/2) on that thresholded count of rows, then the rest
        on the statistic of the released keys only; a quantile needs ``keys``."""
        if not columns or not all(isinstance(c, str) for c in columns):
            raise InvalidArgumentError("columns", columns, "one or more column names")
        if len(set(columns)) != len(columns) or self._unit in columns:
            raise InvalidArgumentError("columns", columns, "distinct column names, not the "
                                       f"privacy unit {self._unit!r} (each unit would be its "
                                       "own group)")
        if keys is not None:
            if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
                raise InvalidTypeError("keys", keys, "a sequence of public keys")
            keys = tuple(keys)
            if not keys:
                raise InvalidArgumentError("keys", "an empty sequence", "at least one key")
            if len(set(keys)) != len(keys):
                raise InvalidArgumentError("keys", "a sequence", "keys without repeats")
            if len(columns) > 1 and not all(isinstance(k, tuple) and len(k) == len(columns)
                                            for k in keys):
                raise InvalidTypeError("keys", "a sequence", f"tuples of {len(columns)} values")
        return self._with(groups=tuple(columns), keys=keys)

    # -- the statistics ------------------------------------------------------------------------

    def count(self, *, epsilon: float | None = None, budget: Budget | None = None,
              delta: float | None = None, **bounds: Any) -> "TableQuery":
        """The number of rows (per group), Δ₁ = L0·L∞ (or C)."""
        return self._query("count", epsilon, budget, delta, bounds)

    def count_distinct_units(self, *, epsilon: float | None = None,
                             budget: Budget | None = None, delta: float | None = None,
                             **bounds: Any) -> "TableQuery":
        """The number of distinct units (per group), Δ₁ = L0."""
        return self._query("count_distinct_units", epsilon, budget, delta, bounds)

    def sum(self, column: str, *, lower: float, upper: float, epsilon: float | None = None,
            budget: Budget | None = None, delta: float | None = None,
            selection_share: float | None = None, **bounds: Any) -> "TableQuery":
        """The sum of ``column`` clamped into [lower, upper], Δ₁ = L0·L∞·max(|l|, |u|).
        ``delta`` and ``selection_share``: for keys selected privately (``group_by``)."""
        return self._query("sum", epsilon, budget, delta, bounds, column, lower, upper,
                           share=selection_share)

    def mean(self, column: str, *, lower: float, upper: float, epsilon: float | None = None,
             budget: Budget | None = None, delta: float | None = None,
             selection_share: float | None = None, **bounds: Any) -> "TableQuery":
        """The mean of ``column`` clamped into [lower, upper]: a noisy centred sum over a noisy
        count, ε/2 each (answer: ``mean``, ``count``, ``sum``; private keys: as ``sum``)."""
        return self._query("mean", epsilon, budget, delta, bounds, column, lower, upper,
                           share=selection_share)

    def variance(self, column: str, *, lower: float, upper: float,
                 epsilon: float | None = None, budget: Budget | None = None,
                 delta: float | None = None, selection_share: float | None = None,
                 **bounds: Any) -> "TableQuery":
        """The variance of ``column`` clamped into [lower, upper], from a noisy count, centred
        sum and centred sum of squares, ε/3 each (answer: ``variance``, ``mean``, ``count``;
        private keys: as ``sum``)."""
        return self._query("variance", epsilon, budget, delta, bounds, column, lower, upper,
                           share=selection_share)

    def quantile(self, column: str, q: float, *, lower: float, upper: float, bins: int = 1000,
                 epsilon: float | None = None, budget: Budget | None = None,
                 **bounds: Any) -> "TableQuery":
        """The q-quantile of ``column`` over ``bins + 1`` candidates evenly spaced on [lower,
        upper] (``BinnedQuantile``, utility sensitivity C; grouped by public keys, one per key,
        all of them ε per unit: a unit's C rows in all groups bound them together)."""
        return self._query("quantile", epsilon, budget, None, bounds, column, lower, upper, q,
                           bins)

    def median(self, column: str, *, lower: float, upper: float, bins: int = 1000,
               epsilon: float | None = None, budget: Budget | None = None,
               **bounds: Any) -> "TableQuery":
        """``quantile(column, 0.5, ...)``."""
        return self.quantile(column, 0.5, lower=lower, upper=upper, bins=bins, epsilon=epsilon,
                             budget=budget, **bounds)

    def _query(self, kind: str, epsilon: Any, budget: Any, delta: Any, bounds: dict[str, Any],
               *args: Any, share: Any = None) -> "TableQuery":
        unknown = sorted(set(bounds) - set(BOUND_NAMES))
        if unknown:
            raise InvalidArgumentError("bounds", unknown[0], f"one of {', '.join(BOUND_NAMES)}")
        if budget is not None:
            if not isinstance(budget, Budget) or epsilon is not None or delta is not None:
                raise InvalidArgumentError("budget", budget, "a Budget, given alone (or "
                                           "epsilon= and delta=)")
            epsilon, delta = budget.epsilon, budget.delta or None
        if epsilon is None:
            raise InvalidArgumentError("epsilon", None, "set (or budget=)")
        spec = self._spec
        private = bool(spec.groups) and spec.keys is None
        if private and kind == "quantile":
            raise InvalidArgumentError("keys", None, "given in group_by(..., keys=[...]) for "
                                       "a quantile: its keys are not selected privately")
        if private and delta is None:
            raise InvalidArgumentError("delta", None, "set: keys selected privately cost δ")
        # A sum, mean or variance on private keys: ε·share selects (a thresholded count of
        # rows), the rest prices the statistic of the released keys (docs/theory.md §4f).
        split = private and kind in ("sum", "mean", "variance")
        if share is not None and not split:
            raise InvalidArgumentError("selection_share", share, "left out: it splits ε only "
                                       "for a sum, mean or variance on keys selected privately")
        epsilon = _validate.positive("epsilon", epsilon)
        share = _validate.positive("selection_share", 0.5 if share is None else share)
        if not share < 1.0:
            raise InvalidArgumentError("selection_share", share, "a number in (0, 1)")
        select = epsilon * share if split else epsilon
        merged = {name: bounds.get(name, self._policy.get(name)) for name in BOUND_NAMES}
        distinct = kind == "count_distinct_units"
        c = distinct_contribution(merged, bool(spec.groups)) if distinct else \
            contribution(merged, grouped=bool(spec.groups))
        # Private keys: the thresholded noisy count (for a count itself, all of ε: one step, no
        # ε/2 to select and ε/2 to count; selecting on units and counting rows is two queries,
        # docs/privacy-units.md), at the count's own Δ₁; a lone key's count is at most L∞ (C),
        # 1 for units.
        selection = PartitionSelection(select, delta=delta, max_groups_per_unit=c.groups,
                                       max_rows_per_group=c.per_group,
                                       max_rows_per_unit=c.total) if private else None
        statistic = fitted(epsilon, kind, epsilon - select if split else epsilon, args, c,
                           selection if split else None)
        frames.check_columns(self._frame, self._unit, spec.groups, statistic.value)
        if spec.keys is not None:
            frames.check_keys(self._frame, spec.groups, spec.keys)
        for column, op, value in spec.filters:
            if column not in self._frame.schema:
                raise InvalidArgumentError("column", column, "a column of the frame")
            frames.check_keys(self._frame, [column], value if op in ("in", "not in") else
                              [value], argument="value")
        used: dict[str, float] = dict(recorded(c, bool(spec.groups)))
        if distinct:  # the bound Δ = L0 derives from: L0, or C standing for it (grouped)
            derived = spec.groups and merged["max_groups_per_unit"] is None
            used = {"max_rows_per_unit" if derived else "max_groups_per_unit": c.groups}
        if kind not in ("count", "count_distinct_units"):
            used.update(lower=statistic.lower, upper=statistic.upper)
        return TableQuery(self, statistic, c, selection, used)


class TableQuery:
    """One statistic of a table, priced and checked: ``accuracy()`` (free) or ``release()``."""

    def __init__(self, table: Table, statistic: Statistic, c: Contribution,
                 selection: PartitionSelection | None, bounds: dict[str, float]) -> None:
        self._table, self.statistic, self.contribution = table, statistic, c
        self._selection, self.bounds = selection, bounds

    def mechanisms(self) -> list[Any]:
        """The mechanisms the release debits (their costs add up to the query's)."""
        if self._selection is not None and self.statistic.kind.startswith("count"):
            return [self._selection]
        priced = self.statistic.mechanisms(self.contribution)
        return priced if self._selection is None else [self._selection, *priced]

    def accuracy(self) -> dict[str, Any]:
        """The noise scale and 95 % interval half-width of each part; nothing is charged. With
        private keys, also the selection's threshold (a key's count is released when it plus the
        same noise clears it: ``mechanisms()``'s ``PartitionSelection``, noise Δ₁/ε)."""
        out = self.statistic.accuracy(self.contribution)
        if self._selection is not None:
            out["selection"] = {"threshold": self._selection.threshold,
                                "scale": self._selection.scale}
        return out

    def release(self, *, label: str | None = None, _ready: Any = None) -> Any:
        """Debit the query's cost once, then bound, aggregate and draw: a number (a dict for a
        mean or variance), else ``{key: answer}``. ``_ready()`` runs just before the debit (the
        query service's check that its request still waits): it may only refuse (raise).

        Raises:
            BudgetExceededError, MechanismNotAllowedError: refused; nothing drawn or debited.
            InvalidDataError: a null id or group; a null, NaN or infinite value (nothing debited).
        """
        t, state = self._table, dict[str, Any]()
        with dask.scratch(t._frame.kind) as scratch:  # (a Dask copy's folder, removed after)
            try:
                mechanisms = self._read(state, scratch)
                _ready is None or _ready()
                noisy = release_bounded(t._gate, mechanisms, functools.partial(
                    self._compute, state=state), UnitBounds(t._unit, self.bounds), label, t._where)
            finally:  # (computed, refused or failed: the copy is read by this query alone)
                frames.free(state.get("copy"), t._frame.kind)
        return self._answer(noisy, state)

    def _read(self, state: dict[str, Any], scratch: str | None = None) -> list[Any]:
        """Before the debit, into ``state``: the columns read ONCE (``copy``, for ``frames.free``)
        under names of their own (``names``: ``frames.inner``), checked on every row read (a
        filter cannot aim the free check at one person's row), then filtered on that copy:
        ``rows``, keyed and bounded by ``_compute``; ``read``: the user's names, for errors;
        ``mechanisms``: ``mechanisms()``, built once, and returned."""
        import narwhals as nw
        t, spec, stat = self._table, self._table._spec, self.statistic
        read = [t._unit, *spec.groups, *([stat.value] if stat.value else []),
                *(column for column, _, _ in spec.filters)]
        names = frames.inner(read)
        rows = state["copy"] = t._frame.read(read, scratch)
        frames.check_values(rows, names, t._unit, spec.groups, stat.value)
        where = []
        for column, op, value in spec.filters:
            col = nw.col(names[column])
            where.append(col.is_in(list(value)) if op == "in" else
                         ~col.is_in(list(value)) if op == "not in" else _OPS[op](col, value))
        if spec.keys is not None:  # other keys dropped before bounding: they use no L0 slot
            where.append(_among([names[g] for g in spec.groups], spec.keys))
        if where:
            rows = frames.engine(lambda: rows.filter(functools.reduce(operator.and_, where)), read)
        state.update(rows=rows, read=read, names=names, mechanisms=self.mechanisms())
        return state["mechanisms"]  # type: ignore[no-any-return]

    def _compute(self, rng: np.random.Generator, state: dict[str, Any]) -> list[Any]:
        t, spec, stat, c = self._table, self._table._spec, self.statistic, self.contribution
        read, names, priced = state.pop("read"), state.pop("names"), state["mechanisms"]
        priced = priced[1:] if len(priced) > 1 and self._selection else priced  # (the
        # statistic's own mechanisms: each value ``clipped`` to what its mechanism accepts)
        unit, groups = names[t._unit], [names[g] for g in spec.groups]
        run = dask.collected(state.pop("rows"), rng, t._frame.kind, read, unit)  # (keyed once)
        value = None if stat.value is None else names[stat.value]
        if stat.kind == "quantile":  # (public keys, if grouped: a row of bin counts per key)
            found = run(bounding.bin_counts, unit, c, str(value), stat.lower, stat.upper,
                        stat.bins, groups)
            index = {k: i for i, k in enumerate(spec.keys or [None])}
            at = [index[k] for k in present_keys(found, groups)] if groups else 0
            counts = np.zeros((len(index), stat.bins + 1), dtype=np.int64)
            counts[at, found[bounding.BIN].astype(np.int64)] = np.rint(
                found[bounding.ROWS].astype(np.float64)).astype(np.int64)
            state["keys"] = spec.keys
            return [counts if groups else counts[0]]
        args = (unit, groups, c, value, stat.lower, stat.upper, stat.centre)
        found = run(bounding.per_group, *args, units=bounding.UNITS in stat.columns())
        aggs = (bounding.ROWS, bounding.UNITS, bounding.SUM, bounding.SQUARES)
        if not spec.groups:
            return stat.values({n: np.nan_to_num(np.asarray(found[n], dtype=np.float64))
                                for n in aggs if n in found}, True, priced)
        present = present_keys(found, groups)
        order = sorted(range(len(present)), key=present.__getitem__)  # (the engine's order is
        present = [present[i] for i in order]  # its own: sorted, the same seed draws the same)
        found = {n: np.asarray(v)[order] for n, v in found.items()}
        if spec.keys is not None:
            index = {k: i for i, k in enumerate(spec.keys)}
            rows = [(i, index[k]) for i, k in enumerate(present) if k in index]
            aligned = {}
            for n in aggs:
                if n in found:
                    filled = np.zeros(len(spec.keys))
                    filled[[j for _, j in rows]] = found[n].astype(np.float64)[[i for i, _ in rows]]
                    aligned[n] = filled
            state["keys"] = spec.keys
            return stat.values(aligned, False, priced)
        state["keys"] = present
        values = stat.values(found, False, priced)
        if stat.kind in ("count", "count_distinct_units"):
            return values  # (a count: the selection's counts; empty: none present)
        # A sum, mean or variance: the selection on the rows, then each value on the keys it
        # released only (``released``).
        counts = np.rint(np.asarray(found[bounding.ROWS], dtype=np.float64)).astype(np.int64)
        return [counts, *(functools.partial(released, v) for v in values)]

    def _answer(self, noisy: list[Any], state: dict[str, Any]) -> Any:
        keys = state.get("keys")
        if keys is None:
            return plain(self.statistic.answer(noisy))
        return self.statistic.per_key(noisy, keys, self._selection is not None)


def _among(columns: Sequence[str], keys: Sequence[Any]) -> Any:
    """The rows whose values in ``columns`` form one of ``keys`` (a tuple per key for several
    columns): the whole tuple, not each column apart — with keys (a, 1) and (b, 2), a row at
    (a, 2) would pass a filter per column, take one of its unit's L0 slots and then be dropped.
    One ``is_in`` for one column; for several, an ``or`` over the first column's values of the
    rest's keys (no join: a join may reorder the rows, and their keys attach by position)."""
    import narwhals as nw
    if len(columns) == 1:
        return nw.col(columns[0]).is_in(list(keys))
    rest: dict[Any, list[Any]] = {}
    for key in keys:
        rest.setdefault(key[0], []).append(key[1:] if len(columns) > 2 else key[1])
    return functools.reduce(operator.or_, ((nw.col(columns[0]) == first) &
                                           _among(columns[1:], tail)
                                           for first, tail in rest.items()))
