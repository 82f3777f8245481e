"""Blocks: a dataset divided into disjoint pieces of data, each with a lifetime budget of its own.

Data that grows (a table that gains a day of events every day) is split into blocks — by a time
column (``by = "hour"``, ``"day"``, ``"week"``) or by explicit names — and each block is an account
with its own lifetime limit (``dataset:events/block:2026-11-01``). A release names the blocks its
data came from and is charged to every one of them in one ledger transaction, all or none.

Why that is a valid guarantee (Lécuyer et al., "Privacy Accounting and Quality Control in the
Sage Differentially Private ML Platform", SOSP 2019, Thm 4.3): every record belongs to exactly one
block; a release that reads blocks S is charged to each block of S, so the releases that could
depend on a given record are exactly those charged to its block, and that block's filter keeps
their composition within its limit however the blocks and costs were chosen (a filter per block,
Rogers–Roth–Ullman–Vadhan 2016). So each record gets its block's limit — for the whole lifetime of
the data, unlike a renewal window (``period``), whose guarantee grows with every window. That is
for add/remove neighbours; under replace-one, a record that moves from block b to b′ is removed
from b and added to b′, and chaining the two guarantees (group privacy's proof, Dwork–Roth 2014,
§2.3) protects it at (ε_b + ε_b′, δ_b + e^{ε_b}·δ_b′) — not at the sum of the two limits when
δ > 0. Only the blocks' limits are enforced; that bound is what they give. The unit protected is
a record (an event); protecting a *person* with many events needs blocks keyed by person, not by
time (docs/theory.md §4d).

Time blocks are aligned in UTC: a day runs from 00:00 to 24:00, a week from Monday 00:00 (ISO
weeks). Block names: ``2026-11-01T13`` (hour), ``2026-11-01`` (day), ``2026-W45`` (ISO week). A
block exists once its start has passed (and, with ``first``, not before it); named blocks exist
when the policy lists them.

Invariant: the block of a time is a pure function of (``by``, t); names and starts round-trip.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataTypeError
from dpbudget.policies.grants import grants
from dpbudget.policies.periods import Period

__all__ = ["BLOCK_UNITS", "Blocks", "Unlock", "block_of", "block_start", "block_names",
           "rows_in_blocks"]

BLOCK_UNITS = ("hour", "day", "week")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}", re.ASCII)
# ASCII digits only: "2026-W٤٦" (Arabic-Indic digits) would otherwise name week 46 a second time
# — a second account, a second budget for the same data.
_FORMATS = {"hour": re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}", re.ASCII),
            "day": re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII),
            "week": re.compile(r"\d{4}-W\d{2}", re.ASCII)}


class Unlock(BaseModel):
    """A schedule that makes a time block's budget spendable gradually (PrivateKube/DPack's
    unlocking), so that the first analyses after a block begins cannot drain it: ``fraction`` of
    the block's ε limit more every ``every`` (a period such as ``"1d"``), from the block's start.

    A usage policy, not a privacy mechanism: the guarantee is the block's limit either way.

    >>> Unlock(every="1d", fraction=0.25).share(0.0, 1.5 * 86400)
    0.5
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    every: str = Field(description='How often another fraction unlocks ("1h", "1d", "7d").',
                       json_schema_extra=grants("any-change"))
    fraction: float = Field(gt=0.0, le=1.0, description="The share of the limit unlocked at "
                            "the block's start and at each period after it.",
                            json_schema_extra=grants("higher"))

    @field_validator("every")
    @classmethod
    def _valid_every(cls, text: Any) -> Any:
        Period(text)
        return text

    def share(self, start: float, now: float) -> float:
        """The share of the limit unlocked at ``now`` for a block that began at ``start``."""
        periods = math.floor(max(0.0, now - start) / Period(self.every).seconds)
        return min(1.0, self.fraction * (1 + periods))


class Blocks(BaseModel):
    """How a dataset is divided into blocks, and each block's limit (``[datasets.X.blocks]``).

    Args:
        by: ``"hour"``, ``"day"`` or ``"week"`` (blocks of a time column), or None with ``names``.
        names: explicit block names (letters, digits, ``_ . -``), when blocks are not by time.
        limit: each block's lifetime budget.
        composition: each block's rule (``"basic"`` by default; any rule, with its parameters).
        per_query, conversion_share, order: the rule's parameters, as for a dataset.
        first: the earliest time block (its name); earlier ones are refused as not existing.
        unlock: an unlocking schedule (``Unlock``) for time blocks; None: all at once.

    >>> Blocks(by="day", limit=Budget(1.0)).account_suffix("2026-11-01")
    '/block:2026-11-01'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: Literal["hour", "day", "week"] | None = Field(None, description="Blocks of a time "
                                                      "column: hour, day or week (UTC).",
                                                      json_schema_extra=grants("any-change"))
    names: tuple[str, ...] | None = Field(None, description="Explicit block names, instead of "
                                          "'by'.", json_schema_extra=grants("wider"))
    limit: Budget = Field(description="Each block's lifetime budget.",
                          json_schema_extra=grants("higher"))
    composition: str = Field("basic", description="Each block's composition rule.",
                             json_schema_extra=grants("any-change"))
    per_query: Budget | None = Field(None, description="The rule's per-query parameter.",
                                     json_schema_extra=grants("higher"))
    conversion_share: float | None = Field(None, description="'advanced' only.",
                                           json_schema_extra=grants("any-change"))
    order: float | None = Field(None, description="'renyi' only.",
                                json_schema_extra=grants("any-change"))
    first: str | None = Field(None, description="The earliest time block; earlier ones do not "
                              "exist.", json_schema_extra=grants("lower"))
    unlock: Unlock | None = Field(None, description="Time blocks only: unlock the limit "
                                  "gradually, {every = \"1d\", fraction = 0.25}.",
                                  json_schema_extra=grants("higher"))

    @field_validator("names")
    @classmethod
    def _valid_names(cls, names: Any) -> Any:
        if names is not None:
            if not names:
                raise ValueError("names must list at least one block")
            for name in names:
                if not isinstance(name, str) or _NAME.fullmatch(name) is None:
                    raise ValueError(f"block name {name!r} must be 1-64 letters, digits, '_', "
                                     "'.', '-'")
            if len(set(names)) != len(names):
                raise ValueError("block names must be distinct")
        return names

    @model_validator(mode="after")
    def _one_kind(self) -> "Blocks":
        if (self.by is None) == (self.names is None):
            raise ValueError("give exactly one of 'by' (hour, day, week) and 'names'")
        if self.unlock is not None and self.by is None:
            raise ValueError("'unlock' is for time blocks ('by')")
        if self.first is not None:
            if self.by is None:
                raise ValueError("'first' is for time blocks ('by')")
            block_start(self.first, self.by)  # raises on a malformed name
        return self

    def account_suffix(self, name: str) -> str:
        return f"/block:{name}"

    def start(self, name: str) -> float:
        """When block ``name`` starts (seconds since the epoch); 0 for named blocks."""
        return 0.0 if self.by is None else block_start(name, self.by)

    def check(self, name: Any) -> str:
        """``name`` if it names a block of this division that can exist, else a typed error
        (one not yet started is refused later, by the gate, against its clock)."""
        if not isinstance(name, str):
            raise InvalidDataTypeError("blocks", name, "block names (strings)")
        if self.names is not None:
            if name not in self.names:
                shown = list(self.names[:10]) + (["..."] if len(self.names) > 10 else [])
                raise InvalidArgumentError("blocks", name, f"one of the declared blocks {shown}")
            return name
        assert self.by is not None
        start = block_start(name, self.by)
        if self.first is not None and start < block_start(self.first, self.by):
            raise InvalidArgumentError("blocks", name, f"a block from {self.first} on (the "
                                       "dataset's first block)")
        return name


def _week_start(year: int, week: int) -> datetime:
    return datetime.fromisocalendar(year, week, 1).replace(tzinfo=timezone.utc)


def block_start(name: str, by: str) -> float:
    """The start (seconds since the epoch, UTC) of time block ``name``.

    Raises:
        InvalidArgumentError: ``name`` is not a block name of that unit.

    >>> block_start("2026-11-01", "day"), block_start("2026-W45", "week")
    (1793491200.0, 1793577600.0)
    """
    pattern = _FORMATS.get(by)
    if pattern is None or not isinstance(name, str) or pattern.fullmatch(name) is None:
        raise InvalidArgumentError("blocks", name, f"a {by} block name such as "
                                   f"{block_of(1_793_491_200.0, by)!r}")
    try:
        if by == "week":
            start = _week_start(int(name[:4]), int(name[6:]))
        else:
            fmt = "%Y-%m-%dT%H" if by == "hour" else "%Y-%m-%d"
            start = datetime.strptime(name, fmt).replace(tzinfo=timezone.utc)
    except ValueError:
        raise InvalidArgumentError("blocks", name, f"a real {by}") from None
    when = start.timestamp()
    if block_of(when, by) != name:  # one name per block: the canonical one only
        raise InvalidArgumentError("blocks", name, f"the {by} block's own name "
                                   f"({block_of(when, by)!r})")
    return when


def block_of(when: float, by: str) -> str:
    """The name of the time block of unit ``by`` that contains ``when`` (seconds, UTC).

    >>> block_of(1_793_537_000.0, "hour"), block_of(1_793_537_000.0, "week")
    ('2026-11-01T12', '2026-W44')
    """
    moment = datetime.fromtimestamp(math.floor(when), timezone.utc)
    if by == "hour":
        return moment.strftime("%Y-%m-%dT%H")
    if by == "day":
        return moment.strftime("%Y-%m-%d")
    year, week, _ = moment.isocalendar()
    return f"{year:04d}-W{week:02d}"


def block_names(spec: Blocks, blocks: Any) -> tuple[str, ...]:
    """The distinct block names a ``blocks=`` argument names, in order: one name, a list or tuple
    of names, or ``slice(first, last)`` (both included) of time blocks.

    Raises:
        InvalidArgumentError, InvalidDataTypeError: nothing named, a name of no block, a repeated
            name, or a range over named blocks or running backwards.
    """
    if isinstance(blocks, str):
        names: Sequence[Any] = (blocks,)
    elif isinstance(blocks, slice):
        if spec.by is None or blocks.step is not None:
            raise InvalidArgumentError("blocks", "a slice", "a range of time blocks "
                                       "slice(first, last), for blocks 'by' time")
        first, last = spec.check(blocks.start), spec.check(blocks.stop)
        names = _between(first, last, spec.by)
    elif isinstance(blocks, (list, tuple)):
        names = blocks
    else:
        raise InvalidDataTypeError("blocks", blocks, "a block name, a list of them, or "
                                   "slice(first, last)")
    if not names:
        raise InvalidArgumentError("blocks", "none", "at least one block")
    out = tuple(spec.check(name) for name in names)
    if len(set(out)) != len(out):
        raise InvalidArgumentError("blocks", "a repeated block", "each block named once")
    return out


def _between(first: str, last: str, by: str) -> list[str]:
    start, end = block_start(first, by), block_start(last, by)
    if end < start:
        raise InvalidArgumentError("blocks", f"{first}..{last}", "a range whose last block is "
                                   "not before its first")
    step = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}[by]
    out, moment = [], datetime.fromtimestamp(start, timezone.utc)
    while moment.timestamp() <= end:
        out.append(block_of(moment.timestamp(), by))
        if moment.timestamp() == end:
            break
        moment += step  # (never past year 9999: the last block ends the loop first)
        if len(out) > 100_000:
            raise InvalidArgumentError("blocks", f"{first}..{last}", "at most 100,000 blocks")
    return out


def rows_in_blocks(frame: Any, column: str, spec: Blocks, blocks: Any) -> Any:
    """The rows of ``frame`` (a pandas DataFrame) whose ``column`` (times: datetimes, or numbers
    of seconds since the epoch, UTC) falls in the named time ``blocks`` — the same blocks a
    release is then charged to, so the data read and the blocks paid for cannot drift apart.
    Use it through ``Accountant.block_rows``. Errors name the column, never a value."""
    if spec.by is None:
        raise InvalidArgumentError("blocks", "named blocks", "time blocks ('by'): select rows "
                                   "of named blocks yourself")
    names = set(block_names(spec, blocks))
    if not hasattr(frame, "columns") or column not in frame.columns:
        raise InvalidArgumentError("column", column, "a column of the DataFrame")
    values = frame[column]
    if values.dtype == object or values.dtype == bool:
        raise InvalidArgumentError("column", column, "times as datetimes or numbers of seconds "
                                   "(not an object or bool column: convert it first)")
    try:
        import pandas as pd

        seconds = ((pd.to_datetime(values, utc=True) - pd.Timestamp(0, tz="UTC"))
                   .dt.total_seconds() if not _numeric(values) else values.astype("float64"))
    except (ValueError, TypeError, OverflowError):
        raise InvalidArgumentError("column", column, "times: datetimes or seconds since the "
                                   "epoch") from None
    if seconds.isna().any():
        raise InvalidArgumentError("column", column, "a time in every row (no missing values)")
    wanted = [_index(block_start(name, spec.by), spec.by) for name in names]
    inside = np.isin(_index(seconds.to_numpy(dtype="float64"), spec.by), wanted)
    return frame[inside]


def _index(seconds: Any, by: str) -> Any:
    """The number of the time block (hours, days, or ISO weeks from Monday 1969-12-29)."""
    if by == "hour":
        return np.floor(np.asarray(seconds) / 3600.0)
    days = np.floor(np.asarray(seconds) / 86400.0)
    return days if by == "day" else np.floor((days + 3.0) / 7.0)


def _numeric(values: Any) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(values))
