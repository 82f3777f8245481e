"""dpbudget: hard privacy budgets around data analysis — one namespace for the whole public API.

``import dpbudget as dp`` gives the accountant, the budget type, every mechanism and noisy helper,
the true-answer helpers under ``dp.queries`` (their values are not private: ``true_count``...), the
errors, the audit, policies, training and planning helpers. The implementation lives in three
packages inside this one, which stay importable on their own: ``dpbudget.accountant`` (values,
errors, composition rules, ledgers, the gate, audit, reports, CLI), ``dpbudget.mechanisms`` and
``dpbudget.policies`` (in a checkout, the folders beside this one, linked from here). Names are loaded on first
use (PEP 562), so ``import dpbudget`` itself is cheap.

>>> import dpbudget as dp
>>> acc = dp.Accountant(dp.Budget(1.0), rng=0)
>>> _ = acc.release(dp.Laplace(0.5), dp.queries.true_count(range(42)), dataset="people")
>>> acc.remaining("people")
Budget(epsilon=0.5, delta=0.0)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {}
for _module, _names in {
    "dpbudget.accountant": [
        "Accountant", "Budget", "Charge", "Pipeline", "Receipt", "Session", "NumericSession",
        "RULES", "CompositionRule", "plan_order", "LogisticRegression", "TrainingResult",
        "dp_sgd", "noise_for_steps", "noisy_gradient_descent",
        "PrivacyError", "AnalystMismatchError", "BudgetExceededError", "InvalidArgumentError",
        "InvalidDataError",
        "InvalidDataTypeError", "InvalidTypeError", "LedgerConflictError", "LedgerCorruptedError",
        "LedgerError", "LedgerUnconfirmedError", "MechanismExhaustedError",
        "MechanismNotAllowedError", "OwnerKeyError",
        "PolicyChangedError", "PolicyError", "SamplerSpentError", "ServiceError",
        "UnitRequiredError", "UnknownAnalystError",
        "UnknownDatasetError", "WindowEndedError",
    ],
    "dpbudget.accountant.audit.run": ["audit", "AuditReport"],
    "dpbudget.accountant.audit.plot": ["plot_audit"],
    "dpbudget.accountant.ledger": ["Ledger", "open_ledger"],
    "dpbudget.accountant.tables.builder": ["table"],
    "dpbudget.accountant.service.client": ["connect"],
    "dpbudget.accountant.ledger.postgres.schema": ["grant_statements"],
    "dpbudget.accountant.audit.transfer": ["export_jsonl", "import_jsonl"],
    "dpbudget.accountant.audit.logs": ["log_records_to"],
    "dpbudget.mechanisms": [
        "Mechanism", "NumericMechanism", "StreamMechanism", "Sampler",
        "Laplace", "DiscreteLaplace", "Gaussian", "AnalyticGaussian", "DiscreteGaussian",
        "SubsampledGaussian", "Exponential", "ReportNoisyMax", "PermuteAndFlip",
        "RandomizedResponse", "AboveThreshold", "Sparse", "NumericSparse", "Quantile", "Median",
        "BinnedQuantile", "PartitionSelection",
        "ProposeTestRelease", "PTRMean", "PTRMedian", "PTRRefused", "PTRStatistic",
        "SmoothSensitivity", "SampleAndAggregate", "Neighbouring", "Query",
        "noisy_mean", "noisy_quantiles", "group_by",
        "analytic_gaussian_delta", "analytic_gaussian_epsilon", "analytic_gaussian_sigma",
        "discrete_gaussian_delta", "discrete_gaussian_sigma", "smooth_sensitivity",
        "above_threshold_accuracy", "poisson_sample",
    ],
    "dpbudget.policies": ["Policy", "DatasetLimit", "AnalystLimit", "Cap", "Period", "load_policy",
                 "parse_policy", "policy_schema"],
    "dpbudget.policies.blocks": ["Blocks", "Unlock"],
    "dpbudget.policies.units": ["ContributionBounds"],
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module

# The true-answer helpers left the flat namespace (issue 30): their values are not private, and a
# name beside the private releases read as one. The old names point to the new ones.
_MOVED = {"count": "queries.true_count", "clamped_sum": "queries.true_clamped_sum",
          "histogram": "queries.true_histogram"}

__all__ = ["__version__", "queries", *sorted(_EXPORTS)]

if TYPE_CHECKING:  # the real names, re-exported (``as``) for type checkers and IDEs; lazy at run time
    from dpbudget.accountant.audit.run import audit as audit
    from dpbudget.accountant.audit.findings import AuditReport as AuditReport
    from dpbudget.accountant.values.budget import Budget as Budget
    from dpbudget.accountant.values.charge import Charge as Charge
    from dpbudget.accountant.composition import RULES as RULES
    from dpbudget.accountant.composition.base import CompositionRule as CompositionRule
    from dpbudget.accountant.composition.renyi import plan_order as plan_order
    from dpbudget.accountant.gate.accountant import Accountant as Accountant
    from dpbudget.accountant.values.errors import (
        AnalystMismatchError as AnalystMismatchError, BudgetExceededError as BudgetExceededError,
        InvalidArgumentError as InvalidArgumentError, InvalidDataError as InvalidDataError,
        InvalidDataTypeError as InvalidDataTypeError, InvalidTypeError as InvalidTypeError,
        LedgerConflictError as LedgerConflictError, LedgerCorruptedError as LedgerCorruptedError,
        LedgerError as LedgerError, LedgerUnconfirmedError as LedgerUnconfirmedError,
        MechanismExhaustedError as MechanismExhaustedError, MechanismNotAllowedError as
        MechanismNotAllowedError, OwnerKeyError as OwnerKeyError, PolicyChangedError as
        PolicyChangedError, PolicyError as PolicyError, PrivacyError as PrivacyError,
        SamplerSpentError as SamplerSpentError, ServiceError as ServiceError,
        UnitRequiredError as UnitRequiredError,
        UnknownAnalystError as UnknownAnalystError,
        UnknownDatasetError as UnknownDatasetError, WindowEndedError as WindowEndedError
    )
    from dpbudget.accountant.training.estimator import LogisticRegression as LogisticRegression
    from dpbudget.accountant.ledger import open_ledger as open_ledger
    from dpbudget.accountant.service.client import connect as connect
    from dpbudget.accountant.ledger.base import Ledger as Ledger
    from dpbudget.accountant.ledger.postgres.schema import grant_statements as grant_statements
    from dpbudget.accountant.audit.logs import log_records_to as log_records_to
    from dpbudget.accountant.gate.pipeline import Pipeline as Pipeline
    from dpbudget.accountant.audit.plot import plot_audit as plot_audit
    from dpbudget.accountant.gate.receipt import Receipt as Receipt
    from dpbudget.accountant.gate.session import NumericSession as NumericSession, Session as Session
    from dpbudget.accountant.training.descent import (
        TrainingResult as TrainingResult, dp_sgd as dp_sgd, noise_for_steps as noise_for_steps,
        noisy_gradient_descent as noisy_gradient_descent
    )
    from dpbudget.accountant.audit.transfer import export_jsonl as export_jsonl, import_jsonl as import_jsonl
    from dpbudget.mechanisms.base import (
        Mechanism as Mechanism, NumericMechanism as NumericMechanism, StreamMechanism as
        StreamMechanism
    )
    from dpbudget.mechanisms.calibration import (
        analytic_gaussian_delta as analytic_gaussian_delta, analytic_gaussian_epsilon as
        analytic_gaussian_epsilon, analytic_gaussian_sigma as analytic_gaussian_sigma
    )
    from dpbudget.mechanisms.discrete import (
        DiscreteGaussian as DiscreteGaussian, DiscreteLaplace as DiscreteLaplace,
        discrete_gaussian_delta as discrete_gaussian_delta, discrete_gaussian_sigma as
        discrete_gaussian_sigma
    )
    from dpbudget.mechanisms.gaussian import AnalyticGaussian as AnalyticGaussian, Gaussian as Gaussian
    from dpbudget.mechanisms.group_by import group_by as group_by
    from dpbudget.mechanisms.laplace import Laplace as Laplace
    from dpbudget.mechanisms.ptr import (
        PTRMean as PTRMean, PTRMedian as PTRMedian, PTRRefused as PTRRefused, PTRStatistic as
        PTRStatistic, ProposeTestRelease as ProposeTestRelease
    )
    from dpbudget.mechanisms.quantile import (
        BinnedQuantile as BinnedQuantile, Median as Median, Quantile as Quantile
    )
    from dpbudget.mechanisms.partition_selection import PartitionSelection as PartitionSelection
    from dpbudget.accountant.tables.builder import table as table
    from dpbudget import queries as queries
    from dpbudget.mechanisms.noisy import noisy_mean as noisy_mean, noisy_quantiles as noisy_quantiles
    from dpbudget.mechanisms.queries import Neighbouring as Neighbouring, Query as Query
    from dpbudget.mechanisms.sample_aggregate import SampleAndAggregate as SampleAndAggregate
    from dpbudget.mechanisms.sampling import Sampler as Sampler
    from dpbudget.mechanisms.selection import (
        Exponential as Exponential, PermuteAndFlip as PermuteAndFlip, RandomizedResponse as
        RandomizedResponse, ReportNoisyMax as ReportNoisyMax
    )
    from dpbudget.mechanisms.smooth import (
        SmoothSensitivity as SmoothSensitivity, smooth_sensitivity as smooth_sensitivity
    )
    from dpbudget.mechanisms.sparse_vector import (
        AboveThreshold as AboveThreshold, NumericSparse as NumericSparse, Sparse as Sparse,
        above_threshold_accuracy as above_threshold_accuracy
    )
    from dpbudget.mechanisms.subsampled import (
        SubsampledGaussian as SubsampledGaussian, poisson_sample as poisson_sample
    )
    from dpbudget.policies.blocks import Blocks as Blocks, Unlock as Unlock
    from dpbudget.policies.limits import (
        AnalystLimit as AnalystLimit, Cap as Cap, DatasetLimit as DatasetLimit
    )
    from dpbudget.policies.periods import Period as Period
    from dpbudget.policies.units import ContributionBounds as ContributionBounds
    from dpbudget.policies.policy import (
        Policy as Policy, load_policy as load_policy, parse_policy as parse_policy, policy_schema as
        policy_schema
    )


def __getattr__(name: str) -> Any:
    if name == "__version__":  # on first use too: importlib.metadata costs more than the rest
        from importlib import metadata

        try:
            value = metadata.version("dpbudget")
        except metadata.PackageNotFoundError:  # pragma: no cover - a checkout, uninstalled
            value = "0+unknown"
        globals()[name] = value
        return value
    if name == "queries":  # a module of its own: the true (not private) answers
        return importlib.import_module("dpbudget.queries")
    module = _EXPORTS.get(name)
    if module is None:
        moved = _MOVED.get(name)
        raise AttributeError(f"module 'dpbudget' has no attribute {name!r}" + (
            "" if moved is None else f": it returned the TRUE, NOT PRIVATE answer, and is now "
            f"dp.{moved} (release it through a mechanism: acc.release(dp.Laplace(epsilon), "
            f"dp.{moved}(...)))"))
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
