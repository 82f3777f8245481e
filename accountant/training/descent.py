"""Training under a budget: noisy gradient descent and DP-SGD for logistic regression, each step
charged through the accountant before its noise is drawn, and the planners that size them.

Invariant: every gradient that leaves a training loop is the output of one
``Accountant.release`` of a :class:`~mechanisms.SubsampledGaussian` (clipping, Poisson sampling
and noise inside the mechanism, after the debit); the first refusal ends training and returns the
model so far with the number of steps that ran. Nothing here holds or logs data.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.composition import make_rule
from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.values.errors import (
    BudgetExceededError,
    InvalidArgumentError,
    InvalidDataTypeError,
    InvalidTypeError,
)
from dpbudget.accountant.gate.unnamed import NOT_GIVEN
from dpbudget.mechanisms import SubsampledGaussian
from dpbudget.mechanisms.base import real_values

__all__ = ["TrainingResult", "dp_sgd", "logistic_gradients", "noise_for_steps",
           "noisy_gradient_descent"]


class TrainingResult(NamedTuple):
    """What a training loop returns.

    Attributes:
        weights: the model (one weight per feature, then the intercept when fitted).
        steps: how many steps ran (each one charged).
        refused: True when a refusal ended training before ``steps`` were asked for.
        mechanism: the mechanism every step released (its parameters and cost per step).
    """

    weights: np.ndarray
    steps: int
    refused: bool
    mechanism: SubsampledGaussian


def logistic_gradients(weights: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-example gradients of the logistic loss, one row per example: (σ(x·w) − y)·x."""
    z = X @ weights
    p = np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z))
                 / (1.0 + np.exp(-np.abs(z))))
    return np.asarray((p - y)[:, None] * X)


def noise_for_steps(budget: Accountant | Budget, steps: int, *, sampling_rate: float = 1.0,
                    clip_norm: float = 1.0, noise: str = "exact", dataset: Any = NOT_GIVEN,
                    analyst: str | None = None, order: float | None = None) -> float:
    """The smallest noise multiplier z (to 3 significant digits, rounded up) at which ``steps``
    releases of ``SubsampledGaussian(z, sampling_rate=..., sensitivity=clip_norm)`` fit.

    ``budget`` is an ``Accountant`` (what is left of ``dataset``'s limit now, under its rule:
    ``max_releases``) or a ``Budget`` (a fresh ``"renyi"`` limit, at ``order``, or without one
    at the order the first step would fix: the best for that z). A plan, not a reservation.

    Raises:
        InvalidArgumentError: no noise up to z = 10^4 makes ``steps`` fit.

    >>> noise_for_steps(Budget(3.0, 1e-5), 1000, sampling_rate=0.01)
    0.869
    """
    n = _validate.positive_int("steps", steps)
    if isinstance(budget, Accountant):
        def fits(z: float) -> bool:
            return budget.max_releases(_step(z, sampling_rate, clip_norm, noise),
                                       dataset=dataset, analyst=analyst) >= n
    elif isinstance(budget, Budget):
        rule = make_rule("renyi", budget, order=order)
        state = rule.initial_state()

        def fits(z: float) -> bool:
            return rule.max_steps(state, _step(z, sampling_rate, clip_norm, noise).charge) >= n
    else:
        raise InvalidTypeError("budget", budget, "an Accountant or a Budget")
    hi = 0.25
    while not fits(hi):
        hi *= 2.0
        if hi > 1e4:
            raise InvalidArgumentError("steps", steps, "a number of steps some noise up to "
                                       "z = 10^4 fits in this budget")
    lo = hi / 2.0
    while hi - lo > 1e-3 * lo:
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    digits = 2 - math.floor(math.log10(hi))
    z = math.ceil(hi * 10 ** digits) / 10 ** digits
    return z if fits(z) else hi


def _step(z: float, q: float, clip: float, noise: str) -> SubsampledGaussian:
    return SubsampledGaussian(z, sampling_rate=q, sensitivity=clip, noise=noise)


def _design(X: Any, y: Any, fit_intercept: bool) -> tuple[np.ndarray, np.ndarray]:
    """X (n × d) and y (n labels in {0, 1}) as float arrays, checked; an intercept column of
    ones appended when fitted. Errors name the argument and shape, never a value."""
    x = real_values("X", X)
    if isinstance(x, float) or x.ndim != 2:
        raise InvalidDataTypeError("X", X, "a 2-D array of features (n rows x d columns)")
    labels = real_values("y", y)
    if isinstance(labels, float) or labels.shape != (x.shape[0],):
        raise InvalidArgumentError("y", f"shape {np.shape(y)}", f"one label per row of X "
                                   f"({x.shape[0]})")
    if not np.all((labels == 0.0) | (labels == 1.0)):
        raise InvalidArgumentError("y", "labels", "labels in {0, 1}")
    if fit_intercept:
        x = np.hstack([x, np.ones((x.shape[0], 1))])
    return x, labels


def dp_sgd(accountant: Accountant, X: Any, y: Any, *, steps: int, sampling_rate: float,
           noise_multiplier: float, batch_size: float, clip_norm: float = 1.0,
           learning_rate: float = 1.0,
           dataset: Any = NOT_GIVEN, analyst: str | None = None, fit_intercept: bool = True,
           weights: Any = None, noise: str = "exact", label: str | None = None) -> TrainingResult:
    """DP-SGD for logistic regression (Abadi et al. 2016), each step charged before its noise.

    Step t: per-example gradients at the current weights, then one release of
    ``SubsampledGaussian(noise_multiplier, sampling_rate=..., sensitivity=clip_norm)`` (clip
    each row to ``clip_norm``, keep each row with probability q, sum, add N(0, (z·C)²) per coordinate),
    then w ← w − η·(noisy sum)/``batch_size``.

    ``batch_size`` is the expected batch size q·n as a **public** number (from a public row
    count, or a count released under the budget). It is not taken from ``len(X)``: under
    add/remove neighbours n is private, and dividing by it would move the model by up to q/z
    noise units every step — about as much as the step is charged (Opacus and the notes divide
    by the true n; that is outside their stated guarantee). The first refusal (``BudgetExceededError``) ends training: the result has the weights so
    far and ``refused=True``.

    Compose it under ``"renyi"`` to get the amplification by subsampling: ``"advanced"`` and
    ``"basic"`` charge each step as if it saw every row.
    """
    mechanism = SubsampledGaussian(noise_multiplier, sampling_rate=sampling_rate,
                                   sensitivity=clip_norm, noise=noise)
    x, labels = _design(X, y, fit_intercept)
    n_steps = _validate.positive_int("steps", steps)
    rate = _validate.positive("learning_rate", learning_rate)
    w = np.zeros(x.shape[1]) if weights is None else np.array(weights, dtype=float)
    if w.shape != (x.shape[1],):
        raise InvalidArgumentError("weights", f"shape {w.shape}", f"one weight per column "
                                   f"({x.shape[1]})")
    batch = _validate.positive("batch_size", batch_size)
    for t in range(n_steps):
        try:
            noisy = accountant.release(mechanism, logistic_gradients(w, x, labels),
                                       dataset=dataset, analyst=analyst, label=label)
        except BudgetExceededError:
            return TrainingResult(w, t, True, mechanism)
        w = w - rate * np.asarray(noisy) / batch
    return TrainingResult(w, n_steps, False, mechanism)


def noisy_gradient_descent(accountant: Accountant, X: Any, y: Any, *, steps: int,
                           noise_multiplier: float, batch_size: float, clip_norm: float = 1.0,
                           learning_rate: float = 1.0, dataset: Any = NOT_GIVEN,
                           analyst: str | None = None, fit_intercept: bool = True,
                           weights: Any = None, noise: str = "exact",
                           label: str | None = None) -> TrainingResult:
    """Full-batch noisy gradient descent (the notes' chapter 8): :func:`dp_sgd` with q = 1, so
    every step sums every clipped gradient and adds N(0, (z·C)²); under ``"advanced"`` or
    ``"renyi"`` each step costs ρ = 1/(2z²). ``batch_size``: the public number of rows n."""
    return dp_sgd(accountant, X, y, steps=steps, sampling_rate=1.0,
                  noise_multiplier=noise_multiplier, batch_size=batch_size, clip_norm=clip_norm,
                  learning_rate=learning_rate, dataset=dataset, analyst=analyst,
                  fit_intercept=fit_intercept, weights=weights, noise=noise, label=label)
