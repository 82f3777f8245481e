"""Mechanisms: one class per family, each declaring its privacy cost; samplers; query helpers."""

from mechanisms.base import Mechanism, NumericMechanism, StreamMechanism
from mechanisms.gaussian import (
    AnalyticGaussian,
    Gaussian,
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
)
from mechanisms.laplace import Laplace
from mechanisms.sampling import Sampler
from mechanisms.selection import (
    Exponential,
    PermuteAndFlip,
    RandomizedResponse,
    ReportNoisyMax,
)
from mechanisms.sparse_vector import AboveThreshold, NumericSparse, Sparse, above_threshold_accuracy

__all__ = [
    "AnalyticGaussian", "Gaussian", "Laplace", "Mechanism", "NumericMechanism", "Sampler",
    "analytic_gaussian_delta", "analytic_gaussian_sigma",
    # issue 4: sparse vector and selection
    "AboveThreshold", "Exponential", "NumericSparse", "PermuteAndFlip", "RandomizedResponse",
    "ReportNoisyMax", "Sparse", "StreamMechanism", "above_threshold_accuracy",
]
