"""The policy in force, as the ledger stores it: one canonical document per policy record.

A durable ledger's first record states the limits it is checked against; a later policy record
replaces them (``Accountant.apply_policy``, ``dpbudget policy apply``), with who and why. An
accountant that opens the ledger with other limits is refused, naming each difference, so the
limits are the ones the ledger's owner set, not whatever the last caller passes.

Invariant: ``document`` and ``from_document`` are inverse (up to validation); ``differences``
compares two documents path by path and shows only policy parameters, never data.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from dpbudget.accountant.values.errors import LedgerCorruptedError
from dpbudget.policies.grants import grants, grants_of
from dpbudget.policies.limits import STORED, AnalystLimit, DatasetLimit
from dpbudget.policies.policy import Policy, _model_in

__all__ = ["POLICY_KEY", "differences", "document", "from_document", "raised"]

# The ledger row that points at the latest policy record (no policy name can contain ":" so no
# limit's account key can be this).
POLICY_KEY = "policy"


def document(policy: Policy, default: DatasetLimit | None) -> dict[str, Any]:
    """The canonical form of ``policy`` plus the default limit for undeclared datasets (``None``:
    undeclared datasets are refused). Infinite numbers are written as the string ``"inf"``."""
    doc: dict[str, Any] = _finite({
        "policy": policy.model_dump(mode="python"),
        "default": None if default is None else default.model_dump(mode="python")})
    # A dataset without a privacy unit is stored without the unit's members, so its policy
    # record keeps the bytes it had before units existed (and older versions can read it).
    for limit in [*doc["policy"]["datasets"].values(), doc["default"]]:
        for name in _UNIT_MEMBERS:
            if limit is not None and limit.get(name, 0) is None:
                del limit[name]
    # Likewise an analyst without API tokens, at the top level or under a dataset (which never
    # lists one) or the default limit.
    analysts = [*doc["policy"]["analysts"].values(),
                *(own for limit in [*doc["policy"]["datasets"].values(), doc["default"]]
                  if limit is not None for own in limit["analysts"].values())]
    for own in analysts:
        if not own.get("tokens", 1):
            del own["tokens"]
    return doc


_UNIT_MEMBERS = ("privacy_unit", "bounds", "raw_values")


def from_document(doc: Any) -> tuple[Policy, DatasetLimit | None]:
    """The policy and default a stored document describes.

    Raises:
        LedgerCorruptedError: the document is not a valid policy (edited by hand, or written by
            an incompatible version).
    """
    try:
        raw = _infinite(doc)
        body = dict(raw["policy"])
        # STORED: mechanism names as recorded (an auditor may lack a custom module; see limits).
        datasets = {str(k): DatasetLimit.model_validate(v, context=STORED)
                    for k, v in body.pop("datasets").items()}
        analysts = {str(k): AnalystLimit.model_validate(v) for k, v in body.pop("analysts").items()}
        # Top-level fields validated on their own (dataset names given to Accountant(limits=...)
        # need not follow the policy file's name syntax, so the whole model is not re-validated).
        top = Policy.model_validate({**body, "datasets": {"x": {}}}, context=STORED)
        policy = Policy.model_construct(**{**top.__dict__, "datasets": datasets,
                                           "analysts": analysts})
        default = None if raw["default"] is None else DatasetLimit.model_validate(
            raw["default"], context=STORED)
    except (KeyError, TypeError, AttributeError, ValidationError) as exc:
        raise LedgerCorruptedError(f"the ledger's stored policy is not a valid policy "
                                   f"({type(exc).__name__}); run `dpbudget audit` on it") from None
    return policy, default


def differences(stored: Any, given: Any, path: str = "") -> list[str]:
    """Each difference between two documents, as ``"path: stored X, given Y"``."""
    if isinstance(stored, dict) and isinstance(given, dict):
        out = []
        for key in sorted(set(stored) | set(given), key=str):
            where = f"{path}.{key}" if path else str(key)
            # A member a document lacks is None there (one written before the member existed).
            if key not in stored:
                if given[key] is not None:
                    out.append(f"{where}: not in the stored policy, given {given[key]!r}")
            elif key not in given:
                if stored[key] is not None:
                    out.append(f"{where}: stored {stored[key]!r}, not given")
            else:
                out.extend(differences(stored[key], given[key], where))
        return out
    return [] if stored == given else [f"{path}: stored {stored!r}, given {given!r}"]


def raised(old: Any, new: Any) -> list[str]:
    """The paths at which document ``new`` grants more than document ``old``, sorted.

    Each field of the policy models declares how it can grant more (``dpbudget.policies.grants``), so
    this walks the models, not key names: a field added to a model is compared as it declares
    (one that declares nothing as ``any-change``: flagged, never missed). Removing a dataset
    grants less — unless datasets not listed get a budget of their own (``other_datasets``, or a
    stored default): the dataset then falls under that one, which is flagged (its recorded spend
    is kept, but the limits and checks it was held to may not be).
    """
    out: list[str] = []
    if isinstance(old, dict) and isinstance(new, dict):
        out.extend(_fallen_under_default(old, new))
    out.extend(_compare(_Document, old, new, ""))
    return sorted(out)


class _Document(BaseModel):
    """A stored document's two members (``document``), declared as the policy models are."""

    policy: Policy | None = Field(None, json_schema_extra=grants("present"))
    default: DatasetLimit | None = Field(None, json_schema_extra=grants("present"))


def _compare(model: type[BaseModel], old: Any, new: Any, path: str) -> list[str]:
    """What ``new`` grants beyond ``old``, both documents of ``model``, field by field (a
    member a document lacks is None there: one written before the member existed)."""
    old = old if isinstance(old, dict) else {}
    new = new if isinstance(new, dict) else {}
    out: list[str] = []
    for name, field in model.model_fields.items():
        inner, is_map = _model_in(field.annotation)
        # An empty tuple default (an analyst's tokens) is what a document lacking it means.
        absent = () if field.default == () else None
        out.extend(_field(grants_of(field) or "any-change", inner, is_map,
                          old.get(name, absent), new.get(name, absent),
                          f"{path}.{name}" if path else name))
    return out


def _field(kind: str, inner: Any, is_map: bool, old: Any, new: Any, path: str) -> list[str]:
    if old is None and new is None:
        return []
    if is_map:  # names -> limits: the names by ``kind``, each limit by its own fields
        old, new = old or {}, new or {}
        out = [f"{path}.{k} added" for k in sorted(set(new) - set(old), key=str)]
        if kind == "any-change":
            out += [f"{path}.{k}: removed (its limit no longer applies)"
                    for k in sorted(set(old) - set(new), key=str)]
        for k in sorted(set(old) & set(new), key=str):
            out.extend(_compare(inner, old[k], new[k], f"{path}.{k}"))
        return out
    if old is None or new is None:
        if kind in ("higher", "lower", "wider"):  # None is the most these grant
            return [f"{path}: removed"] if new is None else []
        if kind == "present":  # None is the least
            return [f"{path} added"] if old is None else []
    elif inner is not None:
        return _compare(inner, old, new, path)
    if kind == "higher" and _num(new) > _num(old):
        return [f"{path}: {old!r} -> {new!r}"]
    if kind == "lower" and _earlier(new, old):
        return [f"{path}: {old!r} -> {new!r} (earlier: grants more)"]
    if kind == "wider" and set(new) - set(old):
        return [f"{path}: {old!r} -> {new!r} (admits more)"]
    if kind == "allow" and new == "allow" and old != "allow":
        return [f"{path}: {old!r} -> {new!r}"]
    if kind == "any-change" and old != new:
        return [f"{path}: {old!r} -> {new!r} (another rule, window or division can admit more: "
                "each can grant its budget again)"]
    return []


def _earlier(new: Any, old: Any) -> bool:
    try:
        return bool(new < old)
    except TypeError:  # values of different kinds: a change that cannot be ordered, flagged
        return True


def _fallen_under_default(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Datasets ``old`` lists and ``new`` does not, while ``new`` admits unlisted datasets."""
    def datasets(doc: dict[str, Any]) -> dict[str, Any]:
        return (doc.get("policy") or {}).get("datasets") or {}

    new_policy = new.get("policy") or {}
    if new_policy.get("other_datasets") is None and new.get("default") is None:
        return []
    return [f"policy.datasets.{name}: removed, and now held to the limit of datasets not listed"
            for name in sorted(set(datasets(old)) - set(datasets(new)))]


def _num(x: Any) -> float:
    return math.inf if x == "inf" or x is None else float(x)


def _finite(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if hasattr(x, "model_dump"):
        return _finite(x.model_dump(mode="python"))
    return x


def _infinite(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _infinite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_infinite(v) for v in x]
    if x == "inf":
        return math.inf
    return x
