"""dpbudget's gate: the ``Budget`` value type, the ``Accountant``, composition rules, ledgers.

The errors (the bottom layer) are imported here directly. Everything else is loaded on first use
(PEP 562 ``__getattr__``): importing ``dpbudget.accountant.values.budget`` from ``mechanisms`` or ``policies``
must not pull in the ``Accountant``, which is built on them, and ``dpbudget --version`` must not
pay for pydantic, which ``Budget`` is built on. Either way ``from dpbudget.accountant import Accountant``
works as usual.

>>> from dpbudget.accountant import Accountant, Budget
>>> from dpbudget.mechanisms import Laplace
>>> acc = Accountant(Budget(epsilon=1.0, delta=1e-6), rng=0)
>>> _ = acc.release(Laplace(epsilon=0.1, sensitivity=1.0), 4213, dataset="adult")
>>> acc.remaining("adult")
Budget(epsilon=0.8999999999999999, delta=1e-06)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpbudget.accountant.values.errors import (
    AnalystMismatchError,
    BudgetExceededError,
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
    LedgerConflictError,
    LedgerCorruptedError,
    LedgerError,
    LedgerUnconfirmedError,
    MechanismExhaustedError,
    MechanismNotAllowedError,
    OwnerKeyError,
    PolicyChangedError,
    PolicyError,
    PrivacyError,
    SamplerSpentError,
    ServiceError,
    UnitRequiredError,
    UnknownAnalystError,
    UnknownDatasetError,
    WindowEndedError,
)

if TYPE_CHECKING:
    from dpbudget.accountant.values.budget import Budget
    from dpbudget.accountant.values.charge import Charge
    from dpbudget.accountant.composition import RULES, CompositionRule, plan_order
    from dpbudget.accountant.training.estimator import LogisticRegression
    from dpbudget.accountant.training.descent import (
        TrainingResult,
        dp_sgd,
        noise_for_steps,
        noisy_gradient_descent,
    )
    from dpbudget.accountant.gate.accountant import Accountant
    from dpbudget.accountant.gate.pipeline import Pipeline
    from dpbudget.accountant.gate.receipt import Receipt
    from dpbudget.accountant.gate.session import NumericSession, Session

# Names other than the errors, and the module each is loaded from on first use.
_LAZY = {
    "Budget": "dpbudget.accountant.values.budget", "Charge": "dpbudget.accountant.values.charge",
    "RULES": "dpbudget.accountant.composition", "CompositionRule": "dpbudget.accountant.composition",
    "Accountant": "dpbudget.accountant.gate.accountant", "Pipeline": "dpbudget.accountant.gate.pipeline",
    "Receipt": "dpbudget.accountant.gate.receipt", "NumericSession": "dpbudget.accountant.gate.session",
    "Session": "dpbudget.accountant.gate.session", "plan_order": "dpbudget.accountant.composition",
    "LogisticRegression": "dpbudget.accountant.training.estimator", "TrainingResult": "dpbudget.accountant.training.descent",
    "dp_sgd": "dpbudget.accountant.training.descent", "noise_for_steps": "dpbudget.accountant.training.descent",
    "noisy_gradient_descent": "dpbudget.accountant.training.descent",
}

__all__ = [
    "RULES", "Accountant", "AnalystMismatchError", "Budget", "BudgetExceededError", "Charge",
    "CompositionRule",
    "InvalidArgumentError", "InvalidDataError", "InvalidDataTypeError", "InvalidTypeError",
    "LedgerConflictError", "LedgerCorruptedError",
    "LedgerError", "LedgerUnconfirmedError", "LogisticRegression", "MechanismExhaustedError", "MechanismNotAllowedError",
    "NumericSession", "OwnerKeyError", "Pipeline", "PolicyChangedError", "PolicyError",
    "PrivacyError", "Receipt", "SamplerSpentError", "ServiceError", "Session", "TrainingResult",
    "UnitRequiredError", "UnknownAnalystError", "UnknownDatasetError", "WindowEndedError",
    "dp_sgd", "noise_for_steps", "noisy_gradient_descent", "plan_order",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'accountant' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
