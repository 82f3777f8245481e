"""Mechanisms for integer-valued queries: the discrete Laplace and discrete Gaussian mechanisms.

Integer in, integer out: the noise is drawn exactly (``dpbudget.mechanisms.exact``) and added in integer
arithmetic, so nothing a float could leak is ever computed. The discrete Gaussian is calibrated on
its own, with Canonne–Kamath–Steinke 2020 Thm 7 — not with the continuous σ, which on the integers
leaks more than its δ (at (1, 1e-5, 1) the continuous σ = 3.7306 leaks δ = 1.0346e-5).
"""

from __future__ import annotations

import functools
import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError, InvalidDataTypeError
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.sensitivity import stated_sensitivity, unstated_sensitivity
from dpbudget.mechanisms.exact import (
    discrete_gaussian,
    discrete_gaussian_array,
    discrete_laplace,
    discrete_laplace_array,
)
from dpbudget.mechanisms.calibration import analytic_gaussian_sigma
from dpbudget.mechanisms.sampling import Sampler

__all__ = ["DiscreteGaussian", "DiscreteLaplace", "discrete_gaussian_delta", "dyadic_rate",
           "discrete_gaussian_sigma"]

_ARRAY_LIMIT = 1 << 61  # array entries stay far from int64 overflow once noise is added
_MAX_SIGMA = 2.0 ** 20  # the calibration sums ~22σ terms per evaluation


class _IntegerMechanism(Mechanism):
    def prepare(self, value: Any) -> Any:
        """An ``int`` (or a whole ``Fraction``: ``true_clamped_sum`` of integers) or a non-empty
        array of integers (``int64``, |entries| < 2^61).

        Raises:
            InvalidDataTypeError: a float, bool, string, or an array that is not of integers.
            InvalidDataError: an empty array, or an entry too large for int64 arithmetic.
        """
        if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        if isinstance(value, Fraction) and value.denominator == 1:  # an exact sum of integers
            return int(value)
        if isinstance(value, (np.ndarray, list, tuple)):
            try:
                arr = np.asarray(value)
            except Exception:
                raise InvalidDataTypeError("value", value, "a rectangular array of integers") \
                    from None
            if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
                raise InvalidDataTypeError("value", value, "an integer or an array of integers "
                                           f"(this mechanism is for integer queries)")
            if arr.size == 0:
                raise InvalidDataError("value", value, "a non-empty array")
            big = arr >= _ARRAY_LIMIT if arr.dtype == np.uint64 else \
                (arr.astype(np.int64) >= _ARRAY_LIMIT) | (arr.astype(np.int64) <= -_ARRAY_LIMIT)
            if bool(big.any()):
                raise InvalidDataError("value", value, "entries below 2^61 in magnitude")
            return arr.astype(np.int64)
        raise InvalidDataTypeError("value", value, "an integer or an array of integers (this "
                                   "mechanism is for integer queries)")


def dyadic_rate(epsilon: float, sensitivity: int) -> Fraction:
    """ε/Δ as an exact rational, rounded down to a dyadic one with 32 significant bits when its
    terms are large (less ε per step: more noise, never less): the discrete Laplace rate
    ``DiscreteLaplace`` and ``PartitionSelection`` sample with."""
    rate = Fraction(epsilon) / sensitivity
    if rate.numerator >= 1 << 40 or rate.denominator >= 1 << 40:
        k = 33 - (rate.numerator.bit_length() - rate.denominator.bit_length())
        rate = Fraction(math.floor(rate * 2 ** k), 2 ** k) if k >= 0 else \
            Fraction(math.floor(rate / 2 ** -k) * 2 ** -k)
    return rate


class DiscreteLaplace(_IntegerMechanism):
    """Adds discrete Laplace noise, P(Z = z) ∝ exp(−ε|z|/Δ), to an integer query: (ε, 0)-DP.

    The geometric mechanism (Ghosh, Roughgarden, Sundararajan, STOC 2009); sampled exactly with
    Canonne–Kamath–Steinke 2020, Alg. 2. P(Z = 0) = tanh(ε/(2Δ)). ε/Δ is used as an exact
    rational when its numerator and denominator are below 2^40, else rounded down to one with a
    denominator 2^k and 32 significant bits (more noise, never less).

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: ε > 0.
        sensitivity: the integer query's L1 sensitivity Δ, a positive integer. No default: left
            out (None), it is taken from the ``Query`` released; a plain integer is refused.

    >>> m = DiscreteLaplace(epsilon=1.0, sensitivity=1)
    >>> m.cost, round(m.zero_probability, 10)
    (Budget(epsilon=1.0, delta=0.0), 0.4621171573)
    """

    query_norm = "l1"

    def __init__(self, epsilon: float, *, sensitivity: int | None = None) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.sensitivity = stated_sensitivity(sensitivity, _validate.positive_int)
        # Not stated: the rate and scale are those of Δ = 1 until a Query binds Δ (nothing is
        # released unbound; the cost, (ε, 0), does not depend on Δ).
        rate = dyadic_rate(self.epsilon, self.sensitivity or 1)
        self._s, self._t = rate.numerator, rate.denominator
        self.scale = _numeric.div_up(float(self._t), float(self._s))
        self.declare(Budget(self.epsilon), noise="exact")

    @property
    def zero_probability(self) -> float:
        """P(Z = 0) = tanh(a/2) for the rate a = s/t actually used."""
        return math.tanh(self._s / self._t / 2.0)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "sensitivity": self.sensitivity,
                "scale": None if self.sensitivity is None else self.scale}

    def prepare(self, value: Any) -> Any:
        if self.sensitivity is None:
            raise unstated_sensitivity(self)
        return super().prepare(value)

    def draw(self, value: Any, sampler: Sampler) -> Any:
        if isinstance(value, int):
            return value + discrete_laplace(sampler.bits, self._s, self._t)
        noise = discrete_laplace_array(sampler.bits, self._s, self._t, value.size)
        return value + noise.reshape(value.shape)


class DiscreteGaussian(_IntegerMechanism):
    """Adds discrete Gaussian noise N_Z(0, σ²) to an integer query: (ε, δ)-DP and ρ-zCDP.

    Canonne, Kamath, Steinke, NeurIPS 2020: σ is the smallest with δ(σ) ≤ δ for the exact δ of
    their Thm 7 (:func:`discrete_gaussian_sigma`), then σ² is rounded up to a dyadic rational with
    about 20 significant bits and re-checked (``sigma`` is that σ, up to 1e-6 above the minimum);
    sampled exactly with their Alg. 3. ρ = Δ²/(2σ²) (their Prop. 5; Thm 14 multivariate; the
    same as the continuous Gaussian's). It has no Gaussian-DP μ of its own that we can cite, so the
    ``gaussian`` composition rule refuses it.

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: ε > 0.
        delta: 0 < δ < 1.
        sensitivity: the integer query's L2 sensitivity Δ, a positive integer. No default: left
            out (None), it is taken from the ``Query`` released; a plain integer is refused.

    Scalar queries only: Thm 7 is the exact δ of one coordinate, and this mechanism's (ε, δ) is
    calibrated with it (for a vector, release each coordinate as its own step or use
    ``AnalyticGaussian``).

    >>> round(DiscreteGaussian(epsilon=1.0, delta=1e-5, sensitivity=1).sigma, 5)
    3.74048
    """

    query_norm = "l2"

    def __init__(self, epsilon: float, *, delta: float, sensitivity: int | None = None) -> None:
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.delta = _validate.probability("delta", delta, low_open=True)
        self.sensitivity = stated_sensitivity(sensitivity, _validate.positive_int)
        # Not stated: σ of Δ = 1 until a Query binds Δ (ρ = Δ²/2σ² is then that of Δ = 1, which
        # the calibration makes the same for every Δ; nothing is released unbound).
        sigma2 = _calibrate(self.epsilon, self.delta, self.sensitivity or 1)
        self._num, self._den = sigma2.numerator, sigma2.denominator
        self.sigma = _numeric.mul_up(math.sqrt(float(sigma2)), 1.0 + 2.0 ** -52)
        self.declare(Budget(self.epsilon, self.delta), noise="exact")

    @property
    def rho(self) -> float:
        """ρ = Δ²/(2σ²), rounded up (CKS 2020, Prop. 5: the discrete Gaussian is ρ-zCDP)."""
        exact = Fraction((self.sensitivity or 1) ** 2 * self._den, 2 * self._num)
        return _numeric.mul_up(float(exact), 1.0 + 2.0 ** -52)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta, "sensitivity": self.sensitivity,
                "sigma": None if self.sensitivity is None else self.sigma}

    def prepare(self, value: Any) -> Any:
        """An ``int`` (a scalar integer query).

        Raises:
            InvalidDataTypeError: anything else, arrays included (see the class docstring).
        """
        if self.sensitivity is None:
            raise unstated_sensitivity(self)
        x = super().prepare(value)
        if not isinstance(x, int):
            raise InvalidDataTypeError("value", value, "a single integer (DiscreteGaussian is "
                                       "calibrated for scalar queries)")
        return x

    def draw(self, value: Any, sampler: Sampler) -> Any:
        return value + discrete_gaussian(sampler.bits, self._num, self._den)

    def sample(self, sampler: Sampler, size: int) -> Any:
        """``size`` independent draws of this mechanism's noise (no release, nothing debited:
        for tests and benchmarks of the sampler)."""
        return discrete_gaussian_array(sampler.bits, self._num, self._den, size)


def discrete_gaussian_delta(sigma: float, epsilon: float, sensitivity: int = 1) -> float:
    """An upper bound (relative error below 1e-11) on the exact δ of CKS 2020, Thm 7.

    For Y ~ N_Z(0, σ²) and integer Δ: δ = P[Y > a] − e^ε P[Y > a + Δ] with a = εσ²/Δ − Δ/2,
    summed here as Σ_{y > a} p(y)(1 − e^{ε − (2yΔ + Δ²)/(2σ²)}) (every term positive), with the
    normaliser bounded below by √(2π)σ (Poisson summation: Σ_y e^{−y²/2σ²} = √(2π)σ·(1 + 2Σ_k
    e^{−2π²σ²k²}) ≥ √(2π)σ) and the neglected tail bounded above.

    >>> round(discrete_gaussian_delta(3.730631635, 1.0), 9)  # the continuous σ for δ = 1e-5
    1.0346e-05
    """
    s = _validate.positive("sigma", sigma)
    e = _validate.non_negative("epsilon", epsilon)
    d = _validate.positive_int("sensitivity", sensitivity)
    return math.exp(_log_delta_upper(s * s, e, d))


def _log_delta_upper(var: float, epsilon: float, delta_q: int) -> float:
    from scipy.special import logsumexp  # here, not above: importing SciPy takes ~0.3 s

    sigma = math.sqrt(var)
    a = epsilon * var / delta_q - delta_q / 2.0
    start = math.floor(a) + 1
    # e^{-72} of the first term is left out; it is bounded above below (``tail``).
    span = int(math.ceil(12.0 * sigma)) + 2 + max(0, -start)
    y = np.arange(start, start + span, dtype=np.float64)
    log_p = -y * y / (2.0 * var)
    shrink = -np.expm1(epsilon - (2.0 * y * delta_q + delta_q * delta_q) / (2.0 * var))
    with np.errstate(divide="ignore"):
        terms = log_p + np.log(np.maximum(shrink, 0.0))
    last = float(y[-1])
    # Σ_{y > last} e^{−y²/2σ²} <= e^{−last²/2σ²}·(1 + σ²/last) for last > 0.
    tail = -last * last / (2.0 * var) + math.log1p(var / last)
    total = float(logsumexp(np.append(terms, tail)))
    log_norm = 0.5 * math.log(2.0 * math.pi * var)
    return total - log_norm + 1e-11  # + margin for the float sums (absolute error ~1e-13 in log)


def discrete_gaussian_sigma(epsilon: float, delta: float, sensitivity: int = 1) -> float:
    """The smallest σ whose CKS 2020 Thm 7 δ (bounded above) is at most δ, by bisection.

    δ is not monotone in σ on a fine scale, so the result is re-checked (and the mechanism
    re-checks the σ² it actually samples with).

    >>> round(discrete_gaussian_sigma(1.0, 1e-5), 10)
    3.7404847042
    """
    eps = _validate.positive("epsilon", epsilon)
    d = _validate.probability("delta", delta, low_open=True)
    return _smallest_sigma(eps, d, _validate.positive_int("sensitivity", sensitivity))


@functools.lru_cache(maxsize=256)
def _smallest_sigma(epsilon: float, delta: float, sensitivity: int) -> float:
    target = math.log(delta)

    def safe(sigma: float) -> bool:
        return _log_delta_upper(sigma * sigma, epsilon, sensitivity) <= target

    hi = analytic_gaussian_sigma(epsilon, delta, float(sensitivity)) * 1.01 + 1.0
    if hi > _MAX_SIGMA:
        raise InvalidArgumentError(
            "parameters", f"DiscreteGaussian(epsilon={epsilon!r}, delta={delta!r}, "
            f"sensitivity={sensitivity!r})", f"a noise scale sigma <= {_MAX_SIGMA:g}")
    while not safe(hi):
        hi *= 2.0
    lo = hi / 2.0
    while safe(lo) and lo > 1e-3:
        lo /= 2.0
    sigma = _numeric.bisect(safe, lo, hi, geometric=True)[1]
    while not safe(sigma):
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def _calibrate(epsilon: float, delta: float, sensitivity: int) -> Fraction:
    """σ² for the sampler: the smallest safe σ squared, rounded up to a dyadic rational with about
    20 significant bits (small integers keep the sampler in int64), and re-checked there."""
    var = Fraction(_smallest_sigma(epsilon, delta, sensitivity)) ** 2
    step = Fraction(1, 2 ** max(0, 20 - math.floor(math.log2(float(var)))))
    var = math.ceil(var / step) * step
    target = math.log(delta)
    while not _log_delta_upper(float(var), epsilon, sensitivity) <= target:
        var += step
    return var
