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

from pydantic import ValidationError

from dpbudget.accountant.errors import LedgerCorruptedError
from dpbudget.policies.limits import STORED, AnalystLimit, DatasetLimit
from dpbudget.policies.policy import Policy

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
    return doc


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


def raised(old: Any, new: Any, path: str = "") -> list[str]:
    """The paths at which ``new`` grants more than ``old``: a larger ε or δ anywhere, a limit,
    cap or analyst quota removed, a dataset or analyst admitted that was not, a mechanism
    allowed that was not, another composition rule or renewal window (which can admit more).
    Removing a dataset grants less — unless datasets not listed get a budget of their own
    (``other_datasets``, or a stored default): the dataset then falls under that one, which is
    flagged (its recorded spend is kept, but the limits and checks it was held to may not be)."""
    out: list[str] = []
    if not path and isinstance(old, dict) and isinstance(new, dict):
        out.extend(_fallen_under_default(old, new))
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in old:
                if new[key] is not None and key not in ("by", "reason"):
                    out.append(f"{where} added")
            elif key in new:
                out.extend(raised(old[key], new[key], where))
            elif path.endswith("analysts") and old[key] is not None:
                out.append(f"{where}: removed (its quota no longer applies)")
        return out
    leaf = path.rsplit(".", 1)[-1]
    if leaf == "blocks" and old is not None and new is None:
        return [f"{path}: removed (no block's lifetime limit applies any more)"]
    if leaf in ("epsilon", "delta") and _num(new) > _num(old):
        out.append(f"{path}: {old!r} -> {new!r}")
    elif leaf in ("limit", "max_per_query", "per_query") and old is not None and new is None:
        out.append(f"{path}: removed")
    elif leaf in ("composition", "conversion_share", "order", "step") and old != new:
        out.append(f"{path}: {old!r} -> {new!r} (another rule can admit more)")
    elif path.endswith("blocks.by") and old != new:
        out.append(f"{path}: {old!r} -> {new!r} (blocks of another length: each gets its "
                   "budget again, the spent ones' time included)")
    elif path.endswith("blocks.first") and old != new and (new is None or (
            old is not None and new < old)):
        out.append(f"{path}: {old!r} -> {new!r} (earlier blocks get a budget)")
    elif path.endswith("blocks.names") and old is not None and (new is None
                                                                 or set(new) - set(old)):
        out.append(f"{path}: blocks added (each new block gets a budget)")
    elif leaf == "period" and old != new and new is not None:
        out.append(f"{path}: {old!r} -> {new!r} (a renewal window grants its limit again)")
    elif leaf in ("other_analysts",) and old == "deny" and new == "allow":
        out.append(f"{path}: deny -> allow")
    elif leaf == "allowed_mechanisms" and old is not None and (
            new is None or set(new) - set(old)):
        out.append(f"{path}: {old!r} -> {new!r}")
    return out


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
