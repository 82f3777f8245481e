"""Mechanisms: one class per family, each declaring its privacy cost; samplers; noisy helpers.

The true-answer helpers (``true_count``, ``true_clamped_sum``, ``true_histogram``) are not here:
they return values that are not private, and live in ``dpbudget.mechanisms.queries`` (``dp.queries``).
"""

from dpbudget.mechanisms.base import Mechanism, NumericMechanism, StreamMechanism
from dpbudget.mechanisms.discrete import (
    DiscreteGaussian,
    DiscreteLaplace,
    discrete_gaussian_delta,
    discrete_gaussian_sigma,
)
from dpbudget.mechanisms.gaussian import (
    AnalyticGaussian,
    Gaussian,
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
)
from dpbudget.mechanisms.group_by import group_by
from dpbudget.mechanisms.laplace import Laplace
from dpbudget.mechanisms.ptr import PTRMean, PTRMedian, PTRRefused, PTRStatistic, ProposeTestRelease
from dpbudget.mechanisms.partition_selection import PartitionSelection
from dpbudget.mechanisms.quantile import BinnedQuantile, Median, Quantile
from dpbudget.mechanisms.noisy import noisy_mean, noisy_quantiles
from dpbudget.mechanisms.queries import Neighbouring, Query
from dpbudget.mechanisms.sample_aggregate import SampleAndAggregate
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.smooth import SmoothSensitivity, smooth_sensitivity
from dpbudget.mechanisms.selection import (
    Exponential,
    PermuteAndFlip,
    RandomizedResponse,
    ReportNoisyMax,
)
from dpbudget.mechanisms.subsampled import SubsampledGaussian, poisson_sample
from dpbudget.mechanisms.sparse_vector import AboveThreshold, NumericSparse, Sparse, above_threshold_accuracy

__all__ = [
    "AboveThreshold", "AnalyticGaussian", "BinnedQuantile", "DiscreteGaussian", "DiscreteLaplace", "Exponential",
    "Gaussian", "Laplace", "Mechanism", "Median",
    "Neighbouring", "NumericMechanism", "NumericSparse", "PTRMean", "PTRMedian", "PTRRefused",
    "PTRStatistic", "PartitionSelection", "PermuteAndFlip", "ProposeTestRelease", "Quantile", "Query",
    "RandomizedResponse", "ReportNoisyMax", "SampleAndAggregate", "Sampler", "SmoothSensitivity", "Sparse", "StreamMechanism", "SubsampledGaussian",
    "above_threshold_accuracy", "analytic_gaussian_delta", "analytic_gaussian_epsilon", "analytic_gaussian_sigma",
    "discrete_gaussian_delta", "discrete_gaussian_sigma",
    "group_by", "smooth_sensitivity", "noisy_mean", "noisy_quantiles",
    "poisson_sample",
]
