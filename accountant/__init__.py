"""dpbudget's gate: the ``Budget`` value type, the ``Accountant``, composition rules, ledgers.

>>> from accountant import Accountant, Budget
>>> from mechanisms import Laplace
>>> acc = Accountant(Budget(epsilon=1.0, delta=1e-6), rng=0)
>>> _ = acc.release(Laplace(epsilon=0.1), 4213, dataset="adult")
>>> acc.remaining("adult")
Budget(epsilon=0.8999999999999999, delta=1e-06)
"""

from accountant.budget import Budget
from accountant.composition import RULES, Charge, CompositionRule
from accountant.core import Accountant
from accountant.errors import (
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
    LedgerConflictError,
    LedgerCorruptedError,
    LedgerError,
    MechanismExhaustedError,
    MechanismNotAllowedError,
    PolicyError,
    PrivacyError,
    UnknownAnalystError,
    UnknownDatasetError,
)
from accountant.pipeline import Pipeline
from accountant.receipt import Receipt
from accountant.session import NumericSession, Session

__all__ = [
    "RULES", "Accountant", "Budget", "BudgetExceededError", "Charge", "CompositionRule",
    "InvalidArgumentError", "InvalidTypeError", "LedgerConflictError", "LedgerCorruptedError",
    "LedgerError", "MechanismExhaustedError", "MechanismNotAllowedError", "NumericSession",
    "Pipeline", "PolicyError", "PrivacyError", "Receipt", "Session", "UnknownAnalystError",
    "UnknownDatasetError",
]
