"""Mechanisms: one class per family, each declaring its privacy cost; samplers; query helpers."""

from mechanisms.base import Mechanism, NumericMechanism
from mechanisms.gaussian import (
    AnalyticGaussian,
    Gaussian,
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
)
from mechanisms.laplace import Laplace
from mechanisms.sampling import Sampler

__all__ = [
    "AnalyticGaussian", "Gaussian", "Laplace", "Mechanism", "NumericMechanism", "Sampler",
    "analytic_gaussian_delta", "analytic_gaussian_sigma",
]
