"""Calibrating Gaussian noise: the analytic Gaussian mechanism's exact δ(σ) and smallest σ.

Balle and Wang, ICML 2018, "Improving the Gaussian Mechanism for Differential Privacy", Thm 8:
N(0, σ²) on L2-sensitivity Δ is (ε, δ)-DP iff Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) ≤ δ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["analytic_gaussian_delta", "analytic_gaussian_epsilon", "analytic_gaussian_sigma"]

# Relative margin added above the bisection's root so that floating-point error in evaluating δ(σ)
# (about 1e-13 relative at worst on the tested range) can never leave σ on the unsafe side.
_SIGMA_MARGIN = 1e-11

# scipy.special.log_ndtr, imported on first use, not with this module (importing SciPy takes
# ~0.3 s, paid by every process that imports ``mechanisms``), and kept in a module global so that
# the bisection's inner evaluation does not run an import statement (~0.2 µs) each time.
_log_ndtr: Any = None


def _load_log_ndtr() -> Any:
    global _log_ndtr
    from scipy.special import log_ndtr

    _log_ndtr = log_ndtr
    return log_ndtr


def _log_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """ln δ(σ) for the Balle–Wang condition, evaluated with ``log_ndtr`` so that tiny tails keep
    their relative precision; ``-inf`` when δ(σ) <= 0."""
    log_ndtr = _log_ndtr or _load_log_ndtr()
    r = sensitivity / sigma
    log_a = log_ndtr(r / 2.0 - epsilon / r)
    log_b = epsilon + log_ndtr(-r / 2.0 - epsilon / r)
    if log_b >= log_a:
        return -math.inf
    # ln(Φ(a) − e^ε Φ(b)) = ln Φ(a) + ln(1 − e^{lb − la}); expm1 keeps the small-difference case exact.
    return float(log_a + math.log(-math.expm1(log_b - log_a)))


# Relative accuracy assumed of one log_ndtr evaluation and of forming its argument, in units of
# the double rounding unit: generous on purpose (scipy's log_ndtr is accurate to a few ulps).
_EVAL_ULPS = 16.0
_ULP = 2.0 ** -53


def _log_delta_upper(sigma: float, epsilon: float, sensitivity: float) -> float:
    """An upper bound on ln δ(σ) that holds despite the rounding in evaluating it.

    ``_log_delta`` computes ln Φ(a) + ln(1 − e^{lb − la}); when δ is tiny next to Φ(a) (small ε,
    large σ), lb − la is close to 0 and its absolute rounding error, though only ~1e-15, is a
    large *relative* error in 1 − e^{lb − la}. So bound the error of ln Φ(a) and ln e^εΦ(b) (a few
    ulps of each, plus x²·ulp from rounding the argument x, since d ln Φ/dx ≈ |x| in the lower
    tail) and evaluate at the worst end. Where the gap cannot be certified at all, the result is
    +inf (not safe), so the calibration moves to a larger σ instead of trusting noise.
    """
    log_ndtr = _log_ndtr or _load_log_ndtr()
    r = sensitivity / sigma
    x_a, x_b = r / 2.0 - epsilon / r, -r / 2.0 - epsilon / r
    log_a = float(log_ndtr(x_a))
    log_b = epsilon + float(log_ndtr(x_b))
    err = _EVAL_ULPS * _ULP * (1.0 + abs(log_a) + abs(log_b) + x_a * x_a + x_b * x_b + epsilon)
    gap = log_b - log_a - 2.0 * err  # the most negative the true lb − la can be
    if gap >= 0.0:
        return math.inf
    return log_a + err + math.log(-math.expm1(gap))


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """The exact δ at which N(0, σ²) noise on L2-sensitivity Δ is (ε, δ)-DP (Balle–Wang Thm 8).

    >>> round(analytic_gaussian_delta(3.730631635, 1.0), 12)
    1e-05
    """
    s = _validate.positive("sigma", sigma)
    e = _validate.non_negative("epsilon", epsilon)
    d = _validate.positive("sensitivity", sensitivity)
    return math.exp(_log_delta(s, e, d))


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest σ with δ(σ) <= δ (Balle–Wang 2018, Thm 8), rounded to the safe side.

    δ(σ) decreases in σ (Balle–Wang, Lemma 7 and the proof of Thm 8), so bisection on ln σ finds
    the root of an *upper bound* on δ(σ) that includes the evaluation's own rounding error (see
    ``_log_delta_upper``); the returned σ is the bracket's upper end times ``1 + 1e-11``,
    re-checked, so it is never below the exact value even where δ(σ) suffers cancellation. Unlike the seed blog's code it uses sqrt(X² + ε) (not + 1) and
    returns a standard deviation (numpy's ``normal`` takes a standard deviation, not a variance).

    >>> round(analytic_gaussian_sigma(0.1, 1e-6), 6)
    36.30469
    """
    eps = _validate.positive("epsilon", epsilon)
    target = math.log(_validate.probability("delta", delta, low_open=True))
    sens = _validate.positive("sensitivity", sensitivity)

    def safe(sigma: float) -> bool:
        return _log_delta_upper(sigma, eps, sens) <= target

    hi = sens
    while not safe(hi):
        hi *= 2.0
    lo = hi
    while safe(lo):
        lo /= 2.0
    sigma = _certified(safe, _numeric.bisect(safe, lo, hi, geometric=True)[1])
    if sigma is None:
        raise InvalidArgumentError("epsilon", epsilon, "a value whose analytic Gaussian noise "
                                   f"can be certified in double precision at delta={delta!r}")
    return sigma


def _certified(safe: Callable[[float], bool], root: float) -> float | None:
    """The bracket's safe end raised by the margin, then stepped up until ``safe`` certifies it
    (the computed bound is monotone only up to rounding); None if it never does."""
    x = root * (1.0 + _SIGMA_MARGIN)
    for _ in range(200):
        if safe(x):
            return x
        x *= 1.0 + 1e-9
    return None


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest ε with δ(ε) <= δ for N(0, σ²) on L2-sensitivity Δ (Balle–Wang 2018, Thm 8),
    rounded up: what a Gaussian built from its noise (``AnalyticGaussian(sigma=...)``) declares.

    δ(ε) decreases in ε, so bisection finds the root of the certified upper bound
    ``_log_delta_upper``; the bracket's upper end is returned, raised by ``1e-11`` and re-checked.

    >>> round(analytic_gaussian_epsilon(3.730631635, 1e-5), 6)
    1.0
    """
    sig = _validate.positive("sigma", sigma)
    target = math.log(_validate.probability("delta", delta, low_open=True))
    sens = _validate.positive("sensitivity", sensitivity)

    def safe(eps: float) -> bool:
        return _log_delta_upper(sig, eps, sens) <= target

    hi = 1.0
    while not safe(hi):
        hi *= 2.0
        if hi > 1e6:
            raise InvalidArgumentError("sigma", sigma, "noise large enough for a finite epsilon "
                                       f"at delta={delta!r}")
    eps = _certified(safe, _numeric.bisect(safe, 0.0, hi)[1])
    if eps is None:  # pragma: no cover - the bound is continuous in ε
        raise InvalidArgumentError("sigma", sigma, "a noise level whose epsilon can be "
                                   f"certified in double precision at delta={delta!r}")
    return eps
