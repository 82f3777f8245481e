"""Mechanisms: one class per family, each declaring its privacy cost; samplers; query helpers."""

from mechanisms.base import Mechanism, NumericMechanism, StreamMechanism
from mechanisms.discrete import (
    DiscreteGaussian,
    DiscreteLaplace,
    discrete_gaussian_delta,
    discrete_gaussian_sigma,
)
from mechanisms.gaussian import (
    AnalyticGaussian,
    Gaussian,
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
)
from mechanisms.group_by import group_by
from mechanisms.laplace import Laplace
from mechanisms.ptr import PTRMean, PTRMedian, PTRRefused, PTRStatistic, ProposeTestRelease
from mechanisms.quantile import Median, Quantile
from mechanisms.queries import (
    Neighbouring,
    Query,
    clamped_sum,
    count,
    histogram,
    noisy_mean,
    noisy_quantiles,
)
from mechanisms.sample_aggregate import SampleAndAggregate
from mechanisms.sampling import Sampler
from mechanisms.smooth import SmoothSensitivity, smooth_sensitivity
from mechanisms.selection import (
    Exponential,
    PermuteAndFlip,
    RandomizedResponse,
    ReportNoisyMax,
)
from mechanisms.subsampled import SubsampledGaussian, poisson_sample
from mechanisms.sparse_vector import AboveThreshold, NumericSparse, Sparse, above_threshold_accuracy

__all__ = [
    "AboveThreshold", "AnalyticGaussian", "DiscreteGaussian", "DiscreteLaplace", "Exponential",
    "Gaussian", "Laplace", "Mechanism", "Median",
    "Neighbouring", "NumericMechanism", "NumericSparse", "PTRMean", "PTRMedian", "PTRRefused",
    "PTRStatistic", "PermuteAndFlip", "ProposeTestRelease", "Quantile", "Query",
    "RandomizedResponse", "ReportNoisyMax", "SampleAndAggregate", "Sampler", "SmoothSensitivity", "Sparse", "StreamMechanism", "SubsampledGaussian",
    "above_threshold_accuracy", "analytic_gaussian_delta", "analytic_gaussian_epsilon", "analytic_gaussian_sigma",
    "discrete_gaussian_delta", "discrete_gaussian_sigma",
    "clamped_sum", "count", "group_by", "smooth_sensitivity", "histogram", "noisy_mean", "noisy_quantiles",
    "poisson_sample",
]
