"""The limits a policy declares: per dataset (``DatasetLimit``), per analyst (``AnalystLimit``),
and the per-query cap (``Cap``).

Invariant: a limit that exists is valid (pydantic v2, frozen, unknown keys refused): its rule name
is one of ``dpbudget.accountant.composition.RULES`` as registered when it is validated, its budgets are
valid ``Budget`` values, its period parses, and each ``allowed_mechanisms`` entry names a mechanism
class (``mechanism_problem``: the one check that ``load_policy``, ``Accountant.from_policy`` and
``dpbudget policy check`` share). Validation errors name the exact key, so that a policy file's
mistakes point at the line to fix.
"""

from __future__ import annotations

import difflib
import inspect
import re
import sys
from collections.abc import Iterable
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import RULES, CompositionRule, make_rule
from dpbudget.accountant.values.errors import InvalidArgumentError, from_validation_error
from dpbudget.policies.blocks import Blocks
from dpbudget.policies.grants import grants
from dpbudget.policies.periods import Period
from dpbudget.policies.units import ContributionBounds

__all__ = ["STORED", "AnalystLimit", "Cap", "DatasetLimit", "Name", "Refusal",
           "mechanism_problem", "refusal", "unchecked_mechanism", "valid_name"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
# A library mechanism's name ("Laplace") or a custom class's module-qualified name
# ("mypkg.mech.Clipped"): what ``dpbudget.mechanisms.base.mechanism_name`` gives, and the gate matches.
_MECHANISM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def valid_name(value: str) -> str:
    # Names become parts of account keys ("dataset:adult/analyst:alice@..."), so the separators
    # ':', '/', '@', '+' and white space are refused: no name can forge another limit's key.
    if _NAME.fullmatch(value) is None:
        raise InvalidArgumentError("name", value, "1 to 128 letters, digits, '_', '.' or '-' "
                                   "(not starting with '.' or '-')")
    return value


def folded_name(name: str) -> str:
    """A dataset name with case and the separators '_', '.', '-' folded away: two names that
    fold alike ("people", "People", "people.", "peo-ple") name one table, so one budget — what
    a dataset under a default limit is checked against before it gets a budget of its own."""
    return re.sub(r"[_.\-]", "", name.casefold())


def _mechanism(value: str, info: ValidationInfo) -> str:
    if len(value) > 255 or _MECHANISM.fullmatch(value) is None:
        raise InvalidArgumentError("mechanism", value, "a mechanism class name: a library "
                                   "mechanism's, such as 'Laplace', or a custom class's module "
                                   "and name, such as 'mypkg.mech.Clipped'")
    if not (info.context or {}).get("stored"):  # read as it was enforced (see STORED)
        problem = mechanism_problem(value)
        if problem is not None:
            raise ValueError(problem)
    return value


# The validation context of a policy read back from a ledger (``dpbudget.policies.stored``): it was
# checked when it was applied, and an auditor's installation (an older version, without the
# custom modules) must still read it, so its mechanism names are taken as recorded.
STORED: dict[str, Any] = {"stored": True}


def mechanism_problem(name: str) -> str | None:
    """Why ``name`` cannot be an ``allowed_mechanisms`` entry, or ``None`` if it can.

    A name without a dot must be a library mechanism's public name (``"Laplace"``). A
    module-qualified name (``"mypkg.mech.Clipped"``) must be the ``dpbudget.mechanisms.base.mechanism_name``
    of a class its module defines — checked when that module is imported in this process (as it
    is wherever a release uses the class), but not imported here by a policy, which runs no
    code: on a machine without the module (an auditor's) the name is taken as written, and it
    can admit only the class of that exact module and name, so a misspelling there refuses that
    mechanism, never admits another. ``__main__.X`` is not checked either (whichever script
    loads the policy is ``__main__``). ``dpbudget.mechanisms.laplace.Laplace`` is refused: a library class
    is named by its public name.
    """
    known = mechanism_names()
    if name in known:
        return None
    if unchecked_mechanism(name):
        return None
    close = [k for k in sorted(known) if k.endswith("." + name) or k == name.rpartition(".")[2]]
    close = close or difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean {close[0]!r}?" if close else (
        "a custom mechanism is named by its module and class, 'module.Class'")
    return f"must name a mechanism class (no mechanism is called that; {hint})"


def unchecked_mechanism(name: str) -> bool:
    """Whether ``name`` is a custom class's whose module is not imported here (or ``__main__``):
    taken as written (``mechanism_problem``); ``dpbudget policy check`` warns of it."""
    module = name.rpartition(".")[0]
    library = module == "dpbudget.mechanisms" or module.startswith("dpbudget.mechanisms.")
    return bool(module) and not library and (module == "__main__" or module not in sys.modules)


def mechanism_names() -> set[str]:
    """The names of every concrete mechanism class defined so far (custom ones included): the
    ones the gate records and matches (``dpbudget.mechanisms.base.mechanism_name``)."""
    from dpbudget import mechanisms  # noqa: F401  (every library mechanism defined)
    from dpbudget.mechanisms.base import Mechanism, mechanism_name

    names, todo = set(), [Mechanism]
    while todo:
        cls = todo.pop()
        if not inspect.isabstract(cls) and not cls.__name__.startswith("_"):
            try:
                names.add(mechanism_name(cls))
            except TypeError:  # a class posing under another's name: no name to admit
                pass
        todo.extend(cls.__subclasses__())
    return names


Name = Annotated[str, AfterValidator(valid_name)]
"""A dataset, analyst or pipeline name as it may appear in a policy and in account keys."""

MechanismName = Annotated[str, AfterValidator(_mechanism)]


class Cap(BaseModel):
    """``max_per_query``: the most a single release may cost; an omitted component is not capped.

    Unlike a rule's ``per_query`` (the fixed per-query cost of the ``"optimal"`` rule, charged to
    every step of that account), a cap only refuses releases that cost more; it charges nothing.

    >>> cap = Cap(epsilon=0.5)
    >>> cap.admits(Budget(0.5, 1e-7)), cap.admits(Budget(0.6))
    (True, False)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: float | None = Field(None, json_schema_extra=grants("higher"))
    delta: float | None = Field(None, json_schema_extra=grants("higher"))

    @field_validator("epsilon", mode="before")
    @classmethod
    def _valid_epsilon(cls, value: Any) -> float | None:
        return None if value is None else _validate.in_model(_validate.non_negative, "epsilon",
                                                             value)

    @field_validator("delta", mode="before")
    @classmethod
    def _valid_delta(cls, value: Any) -> float | None:
        return None if value is None else _validate.in_model(_validate.probability, "delta",
                                                             value)

    def admits(self, cost: Budget | Charge) -> bool:
        """Whether a release of ``cost`` (a ``Budget``, or a mechanism's ``Charge``, which the gate
        passes: what it debits) is within the cap (every capped component ≤)."""
        return ((self.epsilon is None or cost.epsilon <= self.epsilon)
                and (self.delta is None or cost.delta <= self.delta))

    def __str__(self) -> str:
        parts = [f"{k}<={v!r}" for k, v in (("epsilon", self.epsilon), ("delta", self.delta))
                 if v is not None]
        return "(" + ", ".join(parts or ["no cap"]) + ")"


#: A stored API token: its id, the SHA-256 of its secret (hex), its expiry (Unix seconds).
TOKEN_PATTERN = r"^[0-9a-f]{16}:[0-9a-f]{64}:[0-9]{1,12}$"


class _Limit(BaseModel):
    """The fields every limit shares."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limit: Budget | None = Field(None, description="The budget {epsilon, delta}; omitted: no "
                                 "limit (spend is still recorded).",
                                 json_schema_extra=grants("higher"))
    per_query: Budget | None = Field(None, description="A rule parameter: the 'optimal' rule's "
                                     "fixed per-query cost.", json_schema_extra=grants("higher"))
    conversion_share: float | None = Field(
        None, description="'advanced' rule only: the fraction of delta used to convert the zCDP "
        "total to (epsilon, delta), in (0, 1] (default 1); the rest is the allowance for "
        "non-Gaussian steps with delta > 0, such as pipeline allocations and batches.",
        json_schema_extra=grants("any-change"))
    order: float | None = Field(
        None, description="'renyi' rule only: the one Renyi order its filter watches, fixed "
        "now (from dpbudget.plan_order); omitted: the order the account's first step plans.",
        json_schema_extra=grants("any-change"))
    step: tuple[float, float] | None = Field(
        None, description="'pld' rule only: the fixed step every release takes, (q, z): the "
        "Poisson-subsampled Gaussian at sampling rate q and noise multiplier z (float noise).",
        json_schema_extra=grants("any-change"))
    period: str | None = Field(None, description='A renewal window ("1h", "1d", "7d", "30d"): '
                               "each window is its own account. A weaker guarantee than a "
                               "lifetime limit: the total loss grows with the number of periods.",
                               pattern=r"^[1-9][0-9]{0,4}[hd]$",
                               json_schema_extra=grants("any-change"))

    @field_validator("composition", mode="before", check_fields=False)
    @classmethod
    def _known_rule(cls, name: Any) -> Any:
        # Checked against RULES as registered now, so rules added by other modules just work.
        if name is not None and (not isinstance(name, str) or name not in RULES):
            raise InvalidArgumentError("composition", name, f"one of {sorted(RULES)}")
        return name

    @field_validator("period", mode="before")
    @classmethod
    def _valid_period(cls, text: Any) -> Any:
        if text is not None:
            _validate.in_model(Period, text)
        return text

    def window(self) -> Period | None:
        """The renewal window, or None for a lifetime limit."""
        return None if self.period is None else Period(self.period)


class AnalystLimit(_Limit):
    """One analyst's limit: on one dataset (``[datasets.adult.analysts.alice]``), or across all
    datasets (``[analysts.alice]``).

    Args:
        limit: the analyst's budget; ``None`` means no limit (spend is still recorded).
        composition: the rule; ``None`` means the dataset's (or, at the top level, the policy's).
        per_query: a rule parameter (the ``"optimal"`` rule's fixed per-query cost).
        period: a renewal window; ``None`` means the dataset's (or the policy's) period.

    >>> AnalystLimit(limit=Budget(1.0, 1e-7)).composition is None
    True
    """

    composition: str | None = Field(None, description="The composition rule; omitted: the "
                                    "dataset's (or the policy's).",
                                    json_schema_extra=grants("any-change"))
    # The query service's API tokens of this analyst (``[analysts.NAME]`` only): each
    # "ID:SHA256-OF-SECRET:EXPIRES" (expiry in Unix seconds), never the secret. Listed here so
    # that only the owner key adds one; a token added grants more ("wider"), one removed does
    # not (dpbudget.accountant.service.tokens).
    tokens: tuple[Annotated[str, Field(pattern=TOKEN_PATTERN)], ...] = Field(
        (), description="API tokens of the query service for this analyst (top-level "
        "[analysts.NAME] only): 'ID:SHA256:EXPIRES', written by `dpbudget token issue`.",
        json_schema_extra=grants("wider"))

    def __init__(self, /, **data: Any) -> None:
        _construct(super().__init__, data)

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]  # (see Budget.__init__)


class DatasetLimit(_Limit):
    """A dataset's privacy limit, its composition rule, and the checks a policy adds.

    Each dataset is its own population, so each has its own limit; the rule is fixed when the limit
    is created and cannot change once releases are recorded against it.

    Args:
        limit: the total budget; ``None`` means no limit (spend is still recorded).
        composition: the name of a composition rule (``"basic"``, ...).
        per_query: a rule parameter: the ``"optimal"`` rule's fixed per-query cost, or for the
            other rules a cap its account enforces on every step (allocations of pipelines too).
        max_per_query: a cap on each release (``Cap``); omitted components are not capped.
        allowed_mechanisms: the mechanisms admitted, by class: a library mechanism by its name
            (``"Laplace"`` is ``dpbudget.mechanisms.Laplace`` itself, never a subclass or a look-alike),
            a custom class by its module-qualified name (``"mypkg.mech.Clipped"``; see
            ``dpbudget.mechanisms.base.mechanism_name``); ``None`` admits every mechanism, ``()`` none.
        period: a renewal window (``"1d"``...; see ``dpbudget.policies.periods`` — a weaker guarantee).
        analysts: per-analyst limits on this dataset.
        other_analysts: ``"allow"`` (default): an analyst not listed in ``analysts`` (and
            ``analyst=None``) is held to the dataset-level limits only; ``"deny"``: refused.
        blocks: per-block lifetime limits (``dpbudget.policies.blocks.Blocks``); ``None``: no blocks.
        privacy_unit: the column whose value names one protected unit (a person): the limit is
            per unit, all its rows together; ``None``: per row (``dpbudget.policies.units``).
        bounds: the default contribution bounds of its table queries (``ContributionBounds``).
        raw_values: ``"deny"`` or None (default): with a ``privacy_unit``, raw-value releases
            are refused (``UnitRequiredError``); ``"allow"``: admitted, per row.

    >>> DatasetLimit(limit=Budget(1.0, 1e-6)).composition
    'basic'
    """

    composition: str = Field("basic", description="The composition rule (basic, advanced, "
                             "optimal, gaussian, renyi, pld).",
                             json_schema_extra=grants("any-change"))
    max_per_query: Cap | None = Field(None, description="A cap on each release's cost.",
                                      json_schema_extra=grants("higher"))
    allowed_mechanisms: tuple[MechanismName, ...] | None = Field(
        None, description="Mechanisms admitted, by class: a library mechanism by its name "
        "('Laplace'), a custom one by its module and class ('mypkg.mech.Clipped'); omitted: all.",
        json_schema_extra=grants("wider"))
    analysts: dict[Name, AnalystLimit] = Field({}, description="Per-analyst limits on this "
                                               "dataset.", json_schema_extra=grants("any-change"))
    other_analysts: Literal["allow", "deny"] = Field(
        "allow", description="'allow': analysts not listed (and anonymous releases) are held to "
        "the dataset's limits only; 'deny': refused.", json_schema_extra=grants("allow"))
    blocks: Blocks | None = Field(None, description="Divide the dataset into blocks (by time "
                                  "or by name), each with a lifetime limit of its own; every "
                                  "release then names the blocks its data came from.",
                                  json_schema_extra=grants("higher"))
    privacy_unit: str | None = Field(None, min_length=1, max_length=255, description="The "
                                     "column naming whom the limit protects (one person, all "
                                     "their rows); omitted: each row (dpbudget.policies.units).",
                                     json_schema_extra=grants("any-change"))
    bounds: ContributionBounds | None = Field(None, description="Default contribution bounds "
                                              "of its table queries (needs privacy_unit).",
                                              json_schema_extra=grants("higher"))
    # None (omitted) is "deny": a policy stored before this field existed lacks it, and must
    # re-dump identically (``dpbudget.policies.stored.differences`` reads a missing member as None).
    raw_values: Literal["deny", "allow"] | None = Field(
        None, description="'allow': raw-value releases (acc.release) on a dataset with a "
        "privacy_unit, whose sensitivity per unit nobody checks; 'deny' or omitted: the table "
        "API only.", json_schema_extra=grants("allow"))

    @model_validator(mode="after")
    def _unit_first(self) -> "DatasetLimit":
        for field, given in (("bounds", self.bounds is not None),
                             ("raw_values", self.raw_values == "allow")):
            if given and self.privacy_unit is None:
                raise ValueError(f"'{field}' is set without 'privacy_unit' (the column of the "
                                 "unit it is per)")
        if any(own.tokens for own in self.analysts.values()):  # (one place lists a token)
            raise ValueError("'tokens' are listed under the top-level [analysts.NAME], not "
                             "under a dataset's analysts")
        return self

    def rule(self) -> CompositionRule:
        """A fresh rule object enforcing this limit."""
        return make_rule(self.composition, self.limit, self.per_query,
                         conversion_share=self.conversion_share, order=self.order,
                         step=self.step)

    def __init__(self, /, **data: Any) -> None:
        _construct(super().__init__, data)

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]  # (see Budget.__init__)


class Refusal(NamedTuple):
    """Which stateless check refuses a release: the ``dataset`` whose limit it is, the ``check``
    (``"allowed_mechanisms"`` or ``"max_per_query"``) and why, starting with the key path."""

    dataset: str
    check: str
    why: str


def refusal(checks: Iterable[tuple[str, DatasetLimit]], mechanism: str,
            cost: Budget | Charge | None) -> Refusal | None:
    """The first of the policy's stateless checks that refuses a release of ``mechanism`` (its
    recorded name, ``dpbudget.mechanisms.base.mechanism_name``) at ``cost``, or None: the one check the gate
    runs before drawing and the audit runs on every record (``Plan.checks``: each dataset's limit
    that has such checks). ``cost``: what the debit charges; None (a record from before batch
    items stated their cost) checks the name only. (The privacy unit's rule is
    ``dpbudget.policies.units.unit_refusal``.)"""
    for dataset, limit in checks:
        allowed = limit.allowed_mechanisms
        if allowed is not None and mechanism not in allowed:
            return Refusal(dataset, "allowed_mechanisms",
                           f"datasets.{dataset}.allowed_mechanisms does not admit {mechanism} "
                           f"(admitted: {list(allowed)})")
        cap = limit.max_per_query
        if cap is not None and cost is not None and not cap.admits(cost):
            return Refusal(dataset, "max_per_query",
                           f"above datasets.{dataset}.max_per_query {cap}")
    return None


def _construct(init: Any, data: dict[str, Any]) -> None:
    """Direct construction raises our typed error (naming the key path) instead of pydantic's."""
    try:
        init(**data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
