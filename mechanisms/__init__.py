"""Mechanisms: one class per family, each declaring its privacy cost; samplers; query helpers."""

# `accountant` must finish initialising first: its Accountant imports this package back.
import accountant  # noqa: F401  (isort: skip)
from mechanisms.base import Mechanism, NumericMechanism
from mechanisms.gaussian import (
    AnalyticGaussian,
    Gaussian,
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
)
from mechanisms.laplace import Laplace
from mechanisms.queries import Neighbouring, Query, clamped_sum, count, histogram, noisy_mean
from mechanisms.sampling import Sampler

__all__ = [
    "AnalyticGaussian", "Gaussian", "Laplace", "Mechanism", "Neighbouring", "NumericMechanism",
    "Query", "Sampler", "analytic_gaussian_delta", "analytic_gaussian_sigma", "clamped_sum",
    "count", "histogram", "noisy_mean",
]
