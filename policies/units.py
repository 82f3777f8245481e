"""The privacy unit a dataset's limit protects, and the contribution bounds its queries default to.

A dataset's policy may declare its ``privacy_unit`` (a column: ``"person_id"``): its limit is then
a limit per unit — adding or removing ALL rows of one person — not per row. Real tables are events,
one person many rows; a query whose sensitivity is per row, released "at ε = 1", costs a person
with 40 rows ε = 40. So a dataset with a unit releases only table queries whose sensitivities were
derived per that unit from contribution bounds (``dpbudget.accountant.gate.bounded``), and refuses
raw values (``Accountant.release(mechanism, value)``: the library cannot check their sensitivity)
unless its policy says ``raw_values = "allow"``. ``bounds`` (``ContributionBounds``) are the
bounds its table queries take when they state none.

Invariant: ``unit_refusal`` is the one statement of the unit rule — which releases a dataset's unit
admits — and ``bounds_problem`` of the bounds a table query states; the gate refuses by them
before any debit (raw values: ``Gate.validate``; table queries: ``release_bounded``), and the audit holds every
release record to the same two (a ``release`` problem, exit bit 16). A record without ``unit`` is a
raw value, per row. The audit can check that a record carries bounds in this vocabulary, not that
the sensitivities debited were derived from them: deriving Δ from the bounds is the in-library
table layer's part (``dpbudget.accountant.gate.bounded``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from dpbudget.policies.grants import grants

__all__ = ["BOUNDS", "RAW", "ContributionBounds", "Unit", "bounds_problem", "per_account",
           "per_unit", "unit_refusal"]


class _Raw(enum.Enum):
    RAW = "a raw value"


RAW: Final = _Raw.RAW
"""What a raw value is per, for ``unit_refusal``: nothing the library can check."""
Unit = str | None | _Raw
"""What a release's sensitivities are per: a unit column, None (per row), or ``RAW``."""

#: The bounds a table query states (and its record carries), and what each must be.
BOUNDS: Final = {"max_rows_per_unit": "a positive whole number",
                 "max_groups_per_unit": "a positive whole number",
                 "max_rows_per_group": "a positive whole number",
                 "lower": "a finite number", "upper": "a finite number"}

# A bound: a positive whole number (strict: neither 2.5 nor true is a count of rows).
_Count = Annotated[int, Field(strict=True, gt=0)]


class ContributionBounds(BaseModel):
    """How much one unit may contribute to a table query that states no bounds of its own (each
    None: the query must state it where it needs it). Larger bounds keep more of the data (less
    bias) and cost more noise for the same ε (docs/policies.md, "Privacy units").

    >>> ContributionBounds(max_rows_per_unit=20).max_groups_per_unit is None
    True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_rows_per_unit: _Count | None = Field(None, description="The most rows of one unit a "
                                             "query keeps (a random subset beyond).",
                                             json_schema_extra=grants("higher"))
    max_groups_per_unit: _Count | None = Field(None, description="The most groups one unit "
                                               "contributes to in a grouped query.",
                                               json_schema_extra=grants("higher"))
    max_rows_per_group: _Count | None = Field(None, description="The most rows of one unit a "
                                              "query keeps in each group.",
                                              json_schema_extra=grants("higher"))


def per_unit(unit: str | None) -> str:
    """What a budget is per, as receipts, ``dpbudget status`` and the audit say it:
    ``"per person_id"``, or ``"per row"`` where no unit is declared."""
    return "per row" if unit is None else f"per {unit}"


def per_account(key: str, datasets: Mapping[str, Any], default: Any = None,
                dataset: Any = None) -> str:
    """What account ``key``'s ε is per: the unit ``datasets`` (a policy's dataset limits;
    ``default`` for one it does not list) declare for the dataset the account belongs to (its
    own, an analyst's or a block's there, in any window; a pipeline's: ``dataset``, the one its
    records name); else (global, analysts') per row, which a per-unit ε also bounds. Where the dataset allows raw values, it says so:
    ``"per person_id (raw values allowed: per row)"``.

    >>> per_account("dataset:events/analyst:bob", {}), per_account("global", {})
    ('per row', 'per row')
    """
    base = key.split("@")[0].split("/")[0]
    name = base[len("dataset:"):] if base.startswith("dataset:") else (
        dataset if base.startswith("pipeline:") else None)
    limit = datasets.get(name, default) if isinstance(name, str) else None
    unit = getattr(limit, "privacy_unit", None)
    # (raw values allowed: their ε is per row, which the account's ε then also counts)
    raw = unit is not None and getattr(limit, "raw_values", None) == "allow"
    return per_unit(unit) + (" (raw values allowed: per row)" if raw else "")


def unit_refusal(dataset: str, limit: Any, unit: Unit,
                 joined: bool) -> tuple[str, str] | None:
    """Why a release per ``unit`` is refused on ``dataset`` (``limit``: its ``DatasetLimit``),
    as (why, what to do instead), or None: the one statement of the unit rule.

    A raw value (``RAW``) is admitted on a dataset without a unit, or under ``raw_values =
    "allow"``. A table query must be per exactly the dataset's unit; on a dataset without one,
    per any unit (a per-unit Δ bounds a row's too) — except in a join (``joined``), where a row
    of a dataset without the unit can reach many units' rows: every dataset joined must declare
    the query's unit (a query per row on datasets without units stays admitted).
    """
    declared = limit.privacy_unit
    if unit == declared:
        return None
    if unit is RAW:
        if declared is None or limit.raw_values == "allow":
            return None
        return (f"datasets.{dataset}.privacy_unit is {declared!r}: a raw value is refused",
                "use the table API, with bounds per the unit, or set datasets."
                f"{dataset}.raw_values = 'allow' to release raw values")
    if declared is None:
        if not joined:
            return None
        return (f"datasets.{dataset} declares no privacy_unit: a join {_per(unit)} is refused",
                f"query {dataset} on its own, or declare datasets.{dataset}.privacy_unit")
    return (f"datasets.{dataset}.privacy_unit is {declared!r}: a table query {_per(unit)} is "
            "refused", f"state the query's bounds per {declared!r}, the dataset's unit")


def bounds_problem(bounds: Any, unit: Any) -> str | None:
    """What is wrong with a table query's ``bounds`` (as its record carries them) for a query
    per ``unit``, or None: named from ``BOUNDS`` only, each of its kind (a bound of rows or
    groups a positive whole number, a clamp finite, ``lower`` <= ``upper``), and at least one
    where the query is per a unit (no bounds: no sensitivity per unit). Names no value."""
    if unit is not None and not bounds:
        return f"it names the unit {unit!r} without the bounds its sensitivities came from"
    if not isinstance(bounds, Mapping):
        return "its bounds are not a mapping of bound names to numbers"
    for name, bound in bounds.items():
        if name not in BOUNDS:
            shown = repr(name) if isinstance(name, str) else f"of type {type(name).__name__}"
            return f"its bound {shown} is not one of {sorted(BOUNDS)}"
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or \
                not math.isfinite(bound) or (name.startswith("max_") and
                                             (not isinstance(bound, int) or bound < 1)):
            return f"its bound {name!r} is not {BOUNDS[name]}"
    if bounds.get("lower", -math.inf) > bounds.get("upper", math.inf):
        return "its bound 'lower' is above its bound 'upper'"
    return None


def _per(unit: Any) -> str:
    return "per row" if unit is None else f"per {unit!r}" if isinstance(unit, str) else (
        "per a malformed unit")
