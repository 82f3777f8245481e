"""dpbudget: hard privacy budgets around data analysis — one namespace for the whole public API.

``import dpbudget as dp`` gives the accountant, the budget type, every mechanism and query helper,
the errors, the audit, policies, training and planning helpers. The implementation lives in three
packages, which stay importable on their own: ``accountant`` (values, errors, composition rules,
ledgers, the gate, audit, reports, CLI), ``mechanisms`` and ``policies``. Names are loaded on first
use (PEP 562), so ``import dpbudget`` itself is cheap.

>>> import dpbudget as dp
>>> acc = dp.Accountant(dp.Budget(1.0), rng=0)
>>> _ = acc.release(dp.Laplace(0.5), 42.0, dataset="people")
>>> acc.remaining("people")
Budget(epsilon=0.5, delta=0.0)
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {}
for _module, _names in {
    "accountant": [
        "Accountant", "Budget", "Charge", "Pipeline", "Receipt", "Session", "NumericSession",
        "RULES", "CompositionRule", "plan_order", "LogisticRegression", "TrainingResult",
        "dp_sgd", "noise_for_steps", "noisy_gradient_descent",
        "PrivacyError", "AnalystMismatchError", "BudgetExceededError", "InvalidArgumentError",
        "InvalidDataError",
        "InvalidDataTypeError", "InvalidTypeError", "LedgerConflictError", "LedgerCorruptedError",
        "LedgerError", "LedgerUnconfirmedError", "MechanismExhaustedError",
        "MechanismNotAllowedError", "OwnerKeyError",
        "PolicyChangedError", "PolicyError", "SamplerSpentError", "UnknownAnalystError",
        "UnknownDatasetError", "WindowEndedError",
    ],
    "accountant.audit": ["audit", "AuditReport"],
    "accountant.plot": ["plot_audit"],
    "accountant.ledger": ["Ledger", "open_ledger"],
    "accountant.ledger.postgres_schema": ["grant_statements"],
    "accountant.transfer": ["export_jsonl", "import_jsonl"],
    "accountant.logs": ["log_records_to"],
    "mechanisms": [
        "Mechanism", "NumericMechanism", "StreamMechanism", "Sampler",
        "Laplace", "DiscreteLaplace", "Gaussian", "AnalyticGaussian", "DiscreteGaussian",
        "SubsampledGaussian", "Exponential", "ReportNoisyMax", "PermuteAndFlip",
        "RandomizedResponse", "AboveThreshold", "Sparse", "NumericSparse", "Quantile", "Median",
        "ProposeTestRelease", "PTRMean", "PTRMedian", "PTRRefused", "PTRStatistic",
        "SmoothSensitivity", "SampleAndAggregate", "Neighbouring", "Query", "count",
        "clamped_sum", "histogram", "noisy_mean", "noisy_quantiles", "group_by",
        "analytic_gaussian_delta", "analytic_gaussian_epsilon", "analytic_gaussian_sigma",
        "discrete_gaussian_delta", "discrete_gaussian_sigma", "smooth_sensitivity",
        "above_threshold_accuracy", "poisson_sample",
    ],
    "policies": ["Policy", "DatasetLimit", "AnalystLimit", "Cap", "Period", "load_policy",
                 "parse_policy", "policy_schema"],
    "policies.blocks": ["Blocks", "Unlock"],
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # on first use too: importlib.metadata costs more than the rest
        from importlib import metadata

        try:
            value = metadata.version("dpbudget")
        except metadata.PackageNotFoundError:  # pragma: no cover - a checkout, uninstalled
            value = "0+unknown"
        globals()[name] = value
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dpbudget' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
