"""How a policy field can grant more: the one declaration every field of a policy model carries.

"Does this policy edit grant more?" (``dpbudget.policies.stored.raised``) is answered from these
declarations, field by field, never from key names: a field added to a model is compared as it
declares, and tests/policies/test_grants.py refuses a model field that declares nothing.

Invariant: ``grants_of`` returns one of ``GRANTS`` or None (declared nothing, or something
unknown); whoever compares treats None as ``"any-change"``, so an undeclared field is flagged,
never missed.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic.fields import FieldInfo
from pydantic.config import JsonDict

__all__ = ["GRANTS", "Grant", "grants", "grants_of"]

Grant = Literal["higher", "lower", "wider", "any-change", "present", "allow"]

GRANTS: dict[str, str] = {
    "higher": "grants more when larger; None (no limit) is the largest",
    "lower": "grants more when smaller (earlier); None (no bound) is the smallest",
    "wider": "grants more when it gains a member (an item, a mapping's key); None is all",
    "any-change": "any change can grant more (a rule, a window, a division); for a mapping, a "
                  "name added or removed",
    "present": "grants more when it appears (None admits nothing)",
    "allow": "grants more when it becomes 'allow'",
}
assert set(GRANTS) == set(get_args(Grant))


def grants(kind: Grant) -> JsonDict:
    """A field's declaration: ``Field(..., json_schema_extra=grants("higher"))`` (it shows in
    ``dpbudget policy schema`` too, as ``"grants"``)."""
    return {"grants": kind}


def grants_of(field: FieldInfo) -> str | None:
    """The kind ``field`` declares (a key of ``GRANTS``), or None if it declares none."""
    extra = field.json_schema_extra
    kind = extra.get("grants") if isinstance(extra, dict) else None
    return kind if isinstance(kind, str) and kind in GRANTS else None
