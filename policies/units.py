"""The privacy unit a dataset's limit protects, and the contribution bounds its queries default to.

A dataset's policy may declare its ``privacy_unit`` (a column: ``"person_id"``): its limit is then
a limit per unit — adding or removing ALL rows of one person — not per row. Real tables are events,
one person many rows; a query whose sensitivity is per row, released "at ε = 1", costs a person
with 40 rows ε = 40. So a dataset with a unit releases only table queries whose sensitivities were
derived per that unit from contribution bounds (``dpbudget.accountant.gate.bounded``), and refuses
raw values (``Accountant.release(mechanism, value)``: the library cannot check their sensitivity)
unless its policy says ``raw_values = "allow"``. ``bounds`` (``ContributionBounds``) are the
bounds its table queries take when they state none.

Invariant: ``unit_problem`` is the one statement of what a release record on a dataset with a unit
must carry; the audit holds every record to it (a ``release`` problem, exit bit 16), and the gate
writes only records that meet it (the raw-value check is ``dpbudget.policies.limits.refusal``'s,
the unit check ``release_bounded``'s). A record without ``unit`` is per row: a raw value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from dpbudget.policies.grants import grants

__all__ = ["ContributionBounds", "per_account", "per_unit", "unit_problem"]

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


def per_account(key: str, datasets: Mapping[str, Any], default: Any = None) -> str:
    """What account ``key``'s ε is per: the unit ``datasets`` (a policy's dataset limits;
    ``default`` for one it does not list) declare for the dataset the account belongs to (its
    own, an analyst's or a block's there, in any window); else (global, analysts', pipelines')
    per row, which a per-unit ε also bounds.

    >>> per_account("dataset:events/analyst:bob", {}), per_account("global", {})
    ('per row', 'per row')
    """
    base = key.split("@")[0].split("/")[0]
    limit = datasets.get(base[len("dataset:"):], default) if base.startswith("dataset:") else None
    return per_unit(getattr(limit, "privacy_unit", None))


def unit_problem(dataset: str, declared: str | None, raw_values: str,
                 record: Mapping[str, Any]) -> str | None:
    """Why a release ``record`` on ``dataset`` (whose policy declares the unit ``declared`` and
    ``raw_values``) is not one the gate writes there, or None.

    A record without ``unit`` is a raw value (per row): admitted only under ``raw_values =
    "allow"``. A table query's record must name exactly the declared unit and its bounds.
    """
    if declared is None:
        return None
    if "unit" not in record:
        return None if raw_values == "allow" else (
            f"it releases a raw value (no unit, no bounds) on dataset {dataset!r}, whose privacy "
            f"unit is {declared!r} and raw_values 'deny'")
    unit = record["unit"]
    if unit != declared:
        named = "per row" if unit is None else f"per {unit!r}" if isinstance(unit, str) else (
            "per a malformed unit")
        return (f"its sensitivities are {named}, not per dataset {dataset!r}'s privacy unit "
                f"{declared!r}")
    bounds = record.get("bounds")
    if not isinstance(bounds, dict) or not bounds:
        return f"it names the unit {declared!r} without the bounds its sensitivities came from"
    return None
