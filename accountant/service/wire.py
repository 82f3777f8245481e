"""The query service's wire format: a query specification in, an answer or a typed refusal out.

A ``Query`` is what the client's table API builds and the server runs: the table's name, its
filters (column, operator, public constant), the grouping and its public keys (or none: keys
selected privately), one statistic with its parameters, ε (and δ), the contribution bounds, a
label. Validated strictly (pydantic, unknown fields refused), so a request can never name a
clock, a seed, a sensitivity, a mechanism class, an analyst or a dataset: the server derives the
sensitivity from the bounds, the dataset from the table's registration, the analyst from the
token.

Answers travel as tagged JSON (``encode``/``decode``: a mapping as its pairs, so that keys that
are numbers or tuples come back as themselves). A refusal travels as its error class's name (one
of ``dpbudget.accountant.values.errors``), its message, and only the attributes that carry
parameters, never data (``argument``, ``dataset``, ``account``, ``requested``, ``remaining``,
``status``): ``raise_error`` rebuilds the same typed error on the client.

Invariant: ``decode(json.loads(json.dumps(encode(x)))) == x`` for every answer the table API
returns; ``raise_error`` raises only classes of the library's error tree.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from dpbudget.accountant.values import errors
from dpbudget.accountant.values.budget import Budget

__all__ = ["Filter", "Query", "decode", "encode", "error_body", "raise_error"]

Scalar = Union[StrictBool, StrictInt, StrictFloat, StrictStr]
_Strict = ConfigDict(strict=True, extra="forbid", frozen=True)


class Filter(BaseModel):
    """Keep the rows where ``column op value`` (a public constant; a list for ``in``)."""

    model_config = _Strict
    column: StrictStr = Field(max_length=255)
    op: Literal["==", "!=", "<", "<=", ">", ">=", "in", "not in"]
    value: Union[Scalar, list[Scalar]]


class Query(BaseModel):
    """One table query, as ``dpbudget.accountant.tables.builder`` takes it."""

    model_config = _Strict
    table: StrictStr = Field(max_length=255)
    filters: list[Filter] = Field([], max_length=64)
    group_by: list[StrictStr] = Field([], max_length=16)
    keys: list[Union[Scalar, list[Scalar]]] | None = Field(None, max_length=100_000)
    statistic: Literal["count", "count_distinct_units", "sum", "mean", "variance", "quantile"]
    column: StrictStr | None = None
    lower: StrictFloat | None = None
    upper: StrictFloat | None = None
    q: StrictFloat | None = None
    bins: StrictInt | None = None
    epsilon: StrictFloat
    delta: StrictFloat | None = None
    selection_share: StrictFloat | None = None
    bounds: dict[Literal["max_rows_per_unit", "max_groups_per_unit", "max_rows_per_group"],
                 StrictInt] = {}
    label: StrictStr | None = Field(None, max_length=255)
    action: Literal["release", "accuracy"] = "release"


def encode(value: Any) -> Any:
    """``value`` (numbers, strings, None, tuples, lists, mappings, NumPy scalars) as JSON."""
    if isinstance(value, dict):
        return {"map": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return {"list": [encode(v) for v in value]}
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a NumPy scalar
        return value.item()
    return value


def decode(value: Any) -> Any:
    """What ``encode`` wrote, as Python values."""
    if isinstance(value, dict):
        if "map" in value:
            return {_key(decode(k)): decode(v) for k, v in value["map"]}
        if "tuple" in value:
            return tuple(decode(v) for v in value["tuple"])
        if "list" in value:
            return [decode(v) for v in value["list"]]
    return value


def _key(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


# The attributes a refusal carries over the wire: parameters of the query or the policy, never a
# ``value`` (which may be a data value some check saw).
_ATTRS = ("argument", "dataset", "account", "status", "expected")
_BUDGETS = ("requested", "remaining")


def error_body(exc: errors.PrivacyError) -> dict[str, Any]:
    """A refusal as the server sends it."""
    attrs = {k: getattr(exc, k) for k in _ATTRS if isinstance(getattr(exc, k, None), (str, int))}
    for k in _BUDGETS:
        budget = getattr(exc, k, None)
        if isinstance(budget, Budget):
            attrs[k] = {"epsilon": budget.epsilon, "delta": budget.delta}
    return {"type": type(exc).__name__, "message": str(exc), "attrs": attrs}


def raise_error(body: Any) -> None:
    """Raise the typed error ``body`` (``error_body``) describes: the class it names if the
    library's error tree has it, else a ``PrivacyError`` (a server of another version)."""
    name = body.get("type") if isinstance(body, dict) else None
    cls = getattr(errors, name, None) if isinstance(name, str) and name in errors.__all__ \
        else None
    if not (isinstance(cls, type) and issubclass(cls, errors.PrivacyError)):
        cls = errors.PrivacyError
    attrs = dict(body.get("attrs") or {}) if isinstance(body, dict) else {}
    for k in _BUDGETS:
        if isinstance(attrs.get(k), dict):
            attrs[k] = Budget(attrs[k]["epsilon"], attrs[k]["delta"])
    message = str(body.get("message", "refused")) if isinstance(body, dict) else "refused"
    err = cls.__new__(cls)  # (as an error pickled in a worker is rebuilt: errors._rebuild)
    err.args = (message,)
    err.__dict__.update(attrs)
    raise err
