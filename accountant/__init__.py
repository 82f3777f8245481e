"""dpbudget's gate: the ``Budget`` value type, the ``Accountant``, composition rules, ledgers.

The errors (the bottom layer) are imported here directly. Everything else is loaded on first use
(PEP 562 ``__getattr__``): importing ``accountant.budget`` from ``mechanisms`` or ``policies``
must not pull in the ``Accountant``, which is built on them, and ``dpbudget --version`` must not
pay for pydantic, which ``Budget`` is built on. Either way ``from accountant import Accountant``
works as usual.

>>> from accountant import Accountant, Budget
>>> from mechanisms import Laplace
>>> acc = Accountant(Budget(epsilon=1.0, delta=1e-6), rng=0)
>>> _ = acc.release(Laplace(epsilon=0.1), 4213, dataset="adult")
>>> acc.remaining("adult")
Budget(epsilon=0.8999999999999999, delta=1e-06)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from accountant.errors import (
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
    UnknownAnalystError,
    UnknownDatasetError,
    WindowEndedError,
)

if TYPE_CHECKING:
    from accountant.budget import Budget
    from accountant.charge import Charge
    from accountant.composition import RULES, CompositionRule, plan_order
    from accountant.estimator import LogisticRegression
    from accountant.training import (
        TrainingResult,
        dp_sgd,
        noise_for_steps,
        noisy_gradient_descent,
    )
    from accountant.core import Accountant
    from accountant.pipeline import Pipeline
    from accountant.receipt import Receipt
    from accountant.session import NumericSession, Session

# Names other than the errors, and the module each is loaded from on first use.
_LAZY = {
    "Budget": "accountant.budget", "Charge": "accountant.charge",
    "RULES": "accountant.composition", "CompositionRule": "accountant.composition",
    "Accountant": "accountant.core", "Pipeline": "accountant.pipeline",
    "Receipt": "accountant.receipt", "NumericSession": "accountant.session",
    "Session": "accountant.session", "plan_order": "accountant.composition",
    "LogisticRegression": "accountant.estimator", "TrainingResult": "accountant.training",
    "dp_sgd": "accountant.training", "noise_for_steps": "accountant.training",
    "noisy_gradient_descent": "accountant.training",
}

__all__ = [
    "RULES", "Accountant", "AnalystMismatchError", "Budget", "BudgetExceededError", "Charge",
    "CompositionRule",
    "InvalidArgumentError", "InvalidDataError", "InvalidDataTypeError", "InvalidTypeError",
    "LedgerConflictError", "LedgerCorruptedError",
    "LedgerError", "LedgerUnconfirmedError", "LogisticRegression", "MechanismExhaustedError", "MechanismNotAllowedError",
    "NumericSession", "OwnerKeyError", "Pipeline", "PolicyChangedError", "PolicyError",
    "PrivacyError", "Receipt", "SamplerSpentError", "Session", "TrainingResult",
    "UnknownAnalystError", "UnknownDatasetError", "WindowEndedError",
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
