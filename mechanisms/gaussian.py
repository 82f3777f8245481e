"""The Gaussian mechanism: classic calibration and Balle–Wang's analytic calibration."""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError
from dpbudget.mechanisms.base import NumericMechanism, noise_kind
from dpbudget.mechanisms.sensitivity import stated_sensitivity, unstated_sensitivity
from dpbudget.mechanisms.calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
)
from dpbudget.mechanisms.gaussian_grid import GaussianGrid
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.sums import rational_value, within

__all__ = ["AnalyticGaussian", "Gaussian", "analytic_gaussian_delta", "analytic_gaussian_epsilon",
           "analytic_gaussian_sigma"]

class _GaussianFamily(NumericMechanism):
    """Adds N(0, σ²) to each entry; ``sensitivity`` is the L2 sensitivity of the whole value.

    Exact by default (``dpbudget.mechanisms.gaussian_grid``): the value is rounded to a grid of 2^k ≈
    σ/2^38 (finer where a vector or an extreme ε or δ needs it) and exact discrete
    Gaussian noise is added in grid steps, with σ in grid steps
    calibrated for the widened sensitivity Δ₂/g + √n and the discrete noise's distance to a
    rounded Gaussian, so that the cost is still exactly (ε, δ) and ρ. The exact noise has no
    Gaussian-DP μ we can prove (it is within a tiny total variation of a μ-GDP mechanism, which is
    not GDP), so ``mu`` is None and the ``gaussian`` rule refuses it: compose under ``advanced``
    (which uses ρ) or opt out with ``noise="float"``.

    An exact rational value (a ``Fraction`` or an array of them, as the sum helpers return:
    ``dpbudget.mechanisms.sums``) is rounded to the grid exactly; with ``noise="float"``, to the nearest
    double first.
    """

    epsilon: float
    delta: float
    sigma: float | None
    sensitivity: float | None
    grid: GaussianGrid | None
    query_norm: ClassVar[str | None] = "l2"

    def _setup(self, noise: str, sigma: float) -> None:
        """``sigma``: σ for the stated Δ, or for Δ = 1 when none is stated (then ``sigma`` stays
        None until a Query binds Δ; the cost (ε, δ) and ρ = (Δ/σ)²/2 depend on Δ/σ only, which
        the calibration fixes)."""
        self._noise = noise_kind(noise)
        self._ratio = _numeric.div_up(1.0, sigma)  # Δ/σ at Δ = 1 (used only while unstated)
        self.sigma = None if self.sensitivity is None else sigma
        self.grid = (_grid(self.epsilon, self.delta, self.sensitivity, sigma)
                     if self._noise == "exact" and self.sensitivity is not None else None)
        self.declare(Budget(self.epsilon, self.delta), noise=self._noise)


    @property
    def rho(self) -> float:
        """ρ = Δ²/(2σ²): the Gaussian mechanism is ρ-zCDP (Bun–Steinke 2016, Prop. 1.6)."""
        # Δ/σ rounded up, so its square (rounded up) is never below (Δ/σ)²; halving is exact. With
        # exact noise the grid's σ_g >= σ·Δ_g/Δ keeps the discrete Gaussian's ρ = Δ_g²/(2σ_g²)
        # (CKS 2020, Thm 14) at most this.
        mu = self._mu()
        return _numeric.mul_up(mu, mu) / 2.0

    @property
    def mu(self) -> float | None:
        """μ = Δ/σ with ``noise="float"``: the Gaussian mechanism is μ-GDP (Dong, Roth, Su 2019,
        Thm 2.7). None with exact noise (see the class docstring)."""
        if self._noise == "exact":
            return None
        return self._mu()

    def _mu(self) -> float:
        """Δ/σ rounded up (at Δ = 1 while Δ is not stated: the calibration makes it the same)."""
        if self.sensitivity is None or self.sigma is None:
            return self._ratio
        return _numeric.div_up(self.sensitivity, self.sigma)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta, "sensitivity": self.sensitivity,
                "sigma": self.sigma, "noise": self._noise}

    def prepare(self, value: Any) -> Any:
        if self.sensitivity is None:
            raise unstated_sensitivity(self)
        x = rational_value(value, exact=self.grid is not None)  # (an exact sum: kept exact)
        if x is None:
            x = super().prepare(value)
        if self.grid is None:
            return x
        n = 1 if isinstance(x, (float, Fraction)) else x.size
        if not self.grid.fits(n):
            raise InvalidDataError("value", value, f"a value this mechanism can release with exact "
                                   f"noise: at epsilon={self.epsilon!r}, delta={self.delta!r} no "
                                   "double grid keeps the discrete noise's distance to a Gaussian "
                                   "within delta; use noise='float'")
        limit = self.grid.limit_for(n)
        if not within(x, limit):
            raise InvalidDataError("value", value, f"at most {limit:.6g} in magnitude "
                                   "(the noise grid of this scale cannot represent more)")
        return x

    def draw(self, value: Any, sampler: Sampler) -> Any:
        if self.grid is not None:
            return self.grid.release(sampler.bits, value)
        if isinstance(value, float):
            return value + sampler.gaussian(self.sigma)  # type: ignore[arg-type]
        return value + sampler.gaussian(self.sigma, size=value.shape)  # type: ignore[arg-type]


class Gaussian(_GaussianFamily):
    """The classic Gaussian mechanism: σ = Δ₂·sqrt(2 ln(1.25/δ))/ε, (ε, δ)-DP for 0 < ε < 1.

    Dwork–Roth 2014, Thm 3.22 (proof in App. A). The theorem needs ε < 1, and the bound really
    fails beyond it (at ε = 10 this σ leaks δ ≈ 2.27e-5 for a target of 1e-5), so ε >= 1 is refused:
    use :class:`AnalyticGaussian`, which is exact for every ε and never noisier.

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: 0 < ε < 1.
        delta: 0 < δ < 1.
        sensitivity: L2 sensitivity Δ₂ > 0. No default: left out (None), it is taken from the
            ``Query`` released (``dp.queries``: its ``l2_sensitivity``); a plain number is refused.
        noise: ``"exact"`` (default: grid + exact discrete Gaussian, see ``_GaussianFamily``) or
            ``"float"`` (the textbook float sampler, an explicit and recorded opt-out).

    >>> m = Gaussian(epsilon=0.5, delta=1e-5, sensitivity=1.0)
    >>> round(m.sigma, 6)
    9.689611
    """

    def __init__(self, epsilon: float, *, delta: float, sensitivity: float | None = None,
                 noise: str = "exact") -> None:
        eps = _validate.positive("epsilon", epsilon)
        if not eps < 1.0:
            raise InvalidArgumentError(
                "epsilon", epsilon, "< 1 for the classic Gaussian mechanism",
                "Its calibration (Dwork-Roth Thm 3.22) only holds for epsilon < 1; use "
                "AnalyticGaussian(epsilon, delta=..., sensitivity=...), exact for any epsilon")
        self.epsilon = eps
        self.delta = _validate.probability("delta", delta, low_open=True)
        self.sensitivity = stated_sensitivity(sensitivity, _validate.positive)
        sigma = _numeric.div_up(_numeric.mul_up(
            1.0 if self.sensitivity is None else self.sensitivity,
            math.sqrt(2.0 * math.log(1.25 / self.delta))), self.epsilon)
        self._setup(noise, sigma)


class AnalyticGaussian(_GaussianFamily):
    """The analytic Gaussian mechanism: the smallest σ that is exactly (ε, δ)-DP, for any ε > 0.

    Balle and Wang, ICML 2018, "Improving the Gaussian Mechanism for Differential Privacy", Thm 8
    and Alg. 1: N(0, σ²) on L2-sensitivity Δ is (ε, δ)-DP iff
    Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) ≤ δ. σ is found by bisection in log space (see
    :func:`analytic_gaussian_sigma`), re-checked, and rounded up.

    **From the noise instead** (``sigma=`` or ``noise_multiplier=`` σ/Δ, instead of ``epsilon``):
    σ is used as given, and the mechanism declares the smallest ε that the same theorem certifies
    at ``delta``, rounded up (:func:`analytic_gaussian_epsilon`), with ρ = Δ²/(2σ²) for the
    "advanced" and "renyi" rules (and μ = Δ/σ with ``noise="float"``) as always. ``delta`` then
    only names the (ε, δ) pair this noise is declared at, for the "basic" rule and caps.

    Only ``epsilon`` is positional; every other parameter is keyword-only, so that
    two numbers cannot be passed in the wrong order (issue 30).

    Args:
        epsilon: ε > 0 (or give ``sigma`` or ``noise_multiplier`` instead).
        delta: 0 < δ < 1.
        sensitivity: L2 sensitivity Δ₂ > 0; as for :class:`Gaussian` (required with ``sigma`` or
            ``noise_multiplier``).
        noise: ``"exact"`` (default) or ``"float"``, as for :class:`Gaussian`.
        sigma: the noise's standard deviation σ > 0.
        noise_multiplier: σ/Δ₂ > 0 (σ = noise_multiplier × sensitivity), as DP-SGD states it.

    >>> round(AnalyticGaussian(epsilon=1.0, delta=1e-5, sensitivity=1.0).sigma, 6)
    3.730632
    >>> m = AnalyticGaussian(noise_multiplier=2.0, delta=1e-5, sensitivity=0.5)
    >>> m.sigma, round(m.epsilon, 4), round(m.rho, 12)
    (1.0, 1.9931, 0.125)
    """

    def __init__(self, epsilon: float | None = None, *, delta: float | None = None,
                 sensitivity: float | None = None, noise: str = "exact",
                 sigma: float | None = None, noise_multiplier: float | None = None) -> None:
        given = [name for name, v in (("epsilon", epsilon), ("sigma", sigma),
                                      ("noise_multiplier", noise_multiplier)) if v is not None]
        if len(given) > 1:
            raise InvalidArgumentError(given[1], "given with " + given[0], "given alone (one of "
                                       "epsilon, sigma and noise_multiplier)")
        self.delta = _validate.probability("delta", delta, low_open=True)
        self.sensitivity = stated_sensitivity(sensitivity, _validate.positive)
        if not given or epsilon is not None:
            self.epsilon = _validate.positive("epsilon", epsilon)
            s = analytic_gaussian_sigma(self.epsilon, self.delta,
                                        1.0 if self.sensitivity is None else self.sensitivity)
        elif self.sensitivity is None:  # ε would be computed from σ/Δ: Δ must be known now
            raise InvalidArgumentError("sensitivity", None, f"stated with {given[0]} (the cost "
                                       "is computed from sigma/sensitivity)")
        else:
            s = (_validate.positive("sigma", sigma) if sigma is not None else
                 _times("noise_multiplier", noise_multiplier, self.sensitivity))
            self.epsilon = analytic_gaussian_epsilon(s, self.delta, self.sensitivity)
        self._setup(noise, s)


def _times(name: str, multiplier: Any, sensitivity: float) -> float:
    """σ = multiplier × Δ, rounded up only when the product is not exact (never less noise)."""
    z = _validate.positive(name, multiplier)
    product = z * sensitivity
    if Fraction(product) < Fraction(z) * Fraction(sensitivity):
        product = math.nextafter(product, math.inf)
    return product


@functools.lru_cache(maxsize=1024)
def _grid(epsilon: float, delta: float, sensitivity: float, sigma: float) -> GaussianGrid:
    """One immutable grid per parameter set, shared by every mechanism built with it."""
    return GaussianGrid(epsilon, delta, sensitivity, sigma)
