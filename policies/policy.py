"""``Policy``: an organisation's privacy limits in one reviewed file (TOML or JSON).

Invariant: a ``Policy`` that exists is valid, and every problem with a file is reported as a
``PolicyError`` whose message starts with the exact key path, e.g.
``datasets.adult.limit.epsilon: must be a finite number >= 0 (or inf for no limit); got -1``.
Duplicate keys are refused in both formats (TOML's parser refuses them itself; for JSON, Python's
parser would silently keep the last one, so an ``object_pairs_hook`` catches them).

A policy file::

    limit = { epsilon = 10.0, delta = 1e-5 }     # optional: all datasets together ("global")
    composition = "basic"                        # the rule of the global and [analysts] limits

    [datasets.adult]
    limit = { epsilon = 3.0, delta = 1e-6 }
    composition = "basic"
    max_per_query = { epsilon = 0.5 }
    allowed_mechanisms = ["Laplace", "AnalyticGaussian"]
    other_analysts = "allow"                     # or "deny"
    # period = "1d"                              # renewal window: a weaker guarantee

    [datasets.adult.analysts.alice]              # alice on adult
    limit = { epsilon = 1.0, delta = 1e-7 }

    [analysts.bob]                               # bob across all datasets
    limit = { epsilon = 2.0 }

    [other_datasets]                             # optional: any dataset not listed above gets
    limit = { epsilon = 1.0 }                    # a budget of its own (else it is refused)
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from dpbudget.accountant.values.errors import InvalidTypeError, PolicyError
from dpbudget.policies.grants import grants
from dpbudget.policies.limits import AnalystLimit, DatasetLimit, Name, _Limit

__all__ = ["Policy", "load_policy", "parse_policy", "policy_schema", "validated"]

_TOML_TWICE = re.compile(r"Cannot declare (\(.*?\)) twice")


class Policy(_Limit):
    """A whole policy: the datasets it admits, their limits, and the cross-cutting limits.

    Args:
        datasets: the datasets releases may touch, each with its ``DatasetLimit`` (at least one;
            a release on any other dataset is refused with ``UnknownDatasetError``).
        limit: a global limit on all datasets together (account ``"global"``); ``None``: none.
        composition: the rule of the global limit and the default rule of ``analysts``.
        per_query: the global limit's rule parameter (as ``DatasetLimit.per_query``).
        period: the global limit's renewal window, and the default of ``analysts``.
        analysts: limits on one analyst across all datasets (account ``"analyst:NAME"``).
        other_analysts: ``"deny"`` refuses every analyst not in ``analysts`` (and
            ``analyst=None``) on every dataset; ``"allow"`` (default) holds them to the other
            limits only.
        other_datasets: the limit each dataset not in ``datasets`` gets, on its own (``None``,
            the default: such datasets are refused). The explicit way to admit new datasets.

    >>> p = parse_policy('[datasets.adult]\\nlimit = { epsilon = 1.0 }', "toml")
    >>> p.datasets["adult"].limit
    Budget(epsilon=1.0, delta=0.0)
    """

    composition: str = Field("basic", description="The rule of the global limit, and the "
                             "default rule of [analysts].", json_schema_extra=grants("any-change"))
    datasets: dict[Name, DatasetLimit] = Field(
        min_length=1, description="The datasets releases may touch; any other is refused.",
        json_schema_extra=grants("wider"))
    analysts: dict[Name, AnalystLimit] = Field(
        {}, description="Limits on one analyst across all datasets.",
        json_schema_extra=grants("any-change"))
    other_analysts: Literal["allow", "deny"] = Field(
        "allow", description="'deny': analysts not listed in [analysts] (and anonymous releases) "
        "are refused on every dataset.", json_schema_extra=grants("allow"))
    other_datasets: DatasetLimit | None = Field(
        None, description="Datasets not listed under [datasets]: each gets a budget of its own "
        "under this limit, if its name follows the policy syntax and is no variant (in case or "
        "'_', '.', '-') of a dataset already charged. Omitted: any other dataset is refused.",
        json_schema_extra=grants("present"))

    @model_validator(mode="after")
    def _one_analyst_per_token(self) -> "Policy":
        # (two analysts listing one token id: it would authenticate whichever came last, and
        # removing the other's copy would move it without a raise)
        ids = [text.split(":")[0] for own in self.analysts.values() for text in own.tokens]
        if len(ids) != len(set(ids)):
            raise ValueError("a token id is listed more than once under [analysts]: each API "
                             "token belongs to one analyst")
        return self


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file: ``.toml`` or ``.json`` (by suffix).

    Raises:
        PolicyError: the file cannot be read, does not parse, or is not a valid policy; the
            message names the key path (and for a parse error the line).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError("path", path, "a policy file's path (str or os.PathLike) or a Policy")
    file = Path(path)
    fmt = file.suffix.lower().lstrip(".")
    if fmt not in ("toml", "json"):
        raise PolicyError("", f"a policy file must end in .toml or .json; got {str(file)!r}",
                          str(file))
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError("", f"cannot read the policy file: {exc}", str(file)) from None
    try:
        return parse_policy(text, fmt)
    except PolicyError as exc:
        exc.file = str(file)
        raise


def validated(policy: Policy) -> Policy:
    """``policy`` (a ``Policy`` object, as ``Accountant.from_policy`` takes one) checked again,
    as a file is: one built with ``model_construct``, or whose custom mechanisms' modules were
    imported only after it was built, passes the same checks as ``load_policy``'s.

    Raises:
        PolicyError: as for ``load_policy``, naming the key path.
    """
    try:
        return Policy.model_validate(policy.model_dump())
    except ValidationError as exc:
        raise policy_error(exc) from None


def parse_policy(text: str, fmt: str) -> Policy:
    """Validate a policy given as TOML or JSON text (``fmt`` is ``"toml"`` or ``"json"``).

    Raises:
        PolicyError: as for ``load_policy``.
    """
    try:
        return _parse(text, fmt)
    except RecursionError:  # a hostile file nested thousands deep: refused, not a traceback
        raise PolicyError("", "the policy is nested too deeply to be a policy") from None


def _parse(text: str, fmt: str) -> Policy:
    if fmt == "toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:  # duplicate tables/keys land here, with the line
            twice = _TOML_TWICE.search(str(exc))
            path = ".".join(ast.literal_eval(twice.group(1))) if twice else ""
            raise PolicyError(path, f"not valid TOML: {exc}") from None
    elif fmt == "json":
        try:
            data = _unique_keys(json.loads(text, object_pairs_hook=_Pairs), ())
        except json.JSONDecodeError as exc:
            raise PolicyError("", f"not valid JSON: {exc}") from None
    else:
        raise PolicyError("", f"the format must be 'toml' or 'json'; got {fmt!r}")
    if not isinstance(data, dict):
        raise PolicyError("", f"a policy must be an object (a table); got {type(data).__name__}")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise policy_error(exc) from None


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of a policy file (what ``dpbudget policy schema`` prints)."""
    schema = Policy.model_json_schema()
    schema["title"] = "dpbudget policy"
    _summaries(schema)
    return schema


def _summaries(node: Any) -> None:
    """Keep each model's description to its docstring's first paragraph (no Args, no doctest)."""
    if isinstance(node, dict):
        text = node.get("description")
        if isinstance(text, str):
            node["description"] = text.split("\n\n")[0].replace("\n", " ")
        for value in node.values():
            _summaries(value)
    elif isinstance(node, list):
        for value in node:
            _summaries(value)


def policy_error(exc: ValidationError) -> PolicyError:
    """A ``PolicyError`` for the first problem pydantic found, naming its exact key path."""
    errors = exc.errors(include_url=False)
    # An unknown key usually explains a missing one ("[dataset.x]" for "[datasets.x]"): say it.
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc = [str(p) for p in first["loc"] if p != "[key]"]
    path = ".".join(loc)
    cause = (first.get("ctx") or {}).get("error")
    kind = first["type"]
    expected = getattr(cause, "expected", None)
    if expected is not None:
        message = f"must be {expected}; got {getattr(cause, 'value', None)!r}"
    elif kind == "missing":
        message = "is required but missing"
    elif kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        message = (f"is not a known key{hint} (allowed here: {', '.join(allowed)})" if allowed
                   else "is not a known key")
    elif kind == "literal_error":
        message = f"must be {first['ctx']['expected']}; got {first['input']!r}"
    else:
        said = str(first["msg"]).removeprefix("Value error, ").replace("a valid tuple", "a list")
        message = f"{said}; got {first['input']!r}"
    return PolicyError(path, message)


def _allowed_keys(loc: list[str]) -> list[str]:
    """The keys the model at ``loc`` (a path into a policy) accepts."""
    model: Any = Policy
    parts = list(loc)
    while parts:
        field = model.model_fields.get(parts.pop(0))
        if field is None:
            return []
        model, is_map = _model_in(field.annotation)
        if model is None:
            return []
        if is_map:
            if not parts:
                return []
            parts.pop(0)  # the dataset's or analyst's name
    return sorted(model.model_fields)


def _model_in(annotation: Any) -> tuple[Any, bool]:
    """The pydantic model an annotation holds (directly, optionally, or as a dict's values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict:
        return _model_in(args[1])[0], True
    for arg in args:
        model, _ = _model_in(arg)
        if model is not None:
            return model, False
    return None, False


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as parsed, keys in order and duplicates kept (``object_pairs_hook``)."""


def _unique_keys(value: Any, path: tuple[str, ...]) -> Any:
    if isinstance(value, _Pairs):
        out: dict[str, Any] = {}
        for key, item in value:
            if key in out:
                raise PolicyError(".".join((*path, key)), "is given twice (duplicate key)")
            out[key] = _unique_keys(item, (*path, key))
        return out
    if isinstance(value, list):
        return [_unique_keys(v, (*path, str(i))) for i, v in enumerate(value)]
    return value

