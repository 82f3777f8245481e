"""Rényi-DP curves of the noise families, and the RDP ↔ (ε, δ) conversion, each from a named result.

A mechanism *describes* its curve with a small tuple of public parameters (``Charge.rdp``: its
kind and numbers); this module *evaluates* it at an order α. It is the one place both sides read
(mechanisms, to declare a subsampled step's (ε, δ); the ``renyi`` composition rule, to charge it),
so it sits at the bottom layer beside ``Charge``. docs/theory.md §4b has every formula and proof.

Invariant: every function returns a value on the safe side of privacy: an RDP value ρ(α) or an ε
never below the exact bound (float error is covered by an explicit margin, :func:`_up`), a Rényi
budget never above the exact one. Orders are doubles in [``MIN_ORDER``, ``MAX_ORDER``].

Curve kinds (``Charge.rdp``):

- ``("laplace", ε)``: the Laplace mechanism with Δ/b = ε, float noise (Mironov 2017, Prop. 6).
- ``("poisson-gaussian", q, z)``: the Poisson-subsampled *continuous* Gaussian, rate q, noise
  multiplier z = σ/Δ (Mironov–Talwar–Zhang 2019, §3.3: A_α for integer and fractional α, which
  dominates both directions for add/remove neighbours, their §3; fractional α by their series
  with a proven tail bound, or log-convexity between integers, whichever is smaller).
- ``("poisson-discrete-gaussian", q, z)``: the Poisson-subsampled *discrete* Gaussian on an
  integer lattice, shifts integer vectors of L2 norm <= σ/z (the exact-noise DP-SGD step):
  log(A_α)/(α−1), A_α by the binomial expansion (exact at integer α for integer shifts) and
  log-convexity between integers; A_α bounds the add direction too, because the pair is
  symmetric under the lattice involution x ↦ v − x (ours, docs/theory.md §4b).
- ``("poisson-zcdp", q, z)``: Poisson subsampling of *any* (1/(2z²))-zCDP mechanism: our bound,
  proved in the docs, from the binomial expansion of A_α (integer α), a second-order bound on the
  other direction, and log-convexity in α for fractional orders.

Without a curve, a charge with a zCDP ρ has ρ(α) = αρ (Bun–Steinke 2016, Def. 1.1), and a pure
ε-DP charge the tight pure-DP bound (:func:`pure`; Bun–Steinke 2016, Prop. 3.3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from dpbudget.accountant.values import _numeric

__all__ = ["CURVE_KINDS", "MAX_ORDER", "MIN_ORDER", "budget", "charge_rdp", "check_curve",
           "epsilon", "laplace", "poisson_discrete_gaussian", "poisson_gaussian", "poisson_zcdp",
           "pure"]

MIN_ORDER = 1.1
MAX_ORDER = 4096.0
CURVE_KINDS = ("laplace", "poisson-gaussian", "poisson-discrete-gaussian", "poisson-zcdp")

# Relative margin covering float error in the sums below (their error is a few ulps of terms that
# are all positive, so 1e-11 is many orders of magnitude more than needed).
_RELATIVE = 1e-11


def _up(x: float, scale: float = 0.0, absolute: float = 0.0) -> float:
    """``x`` raised by the relative margin, by 64 ulps of ``scale`` (the magnitude of the terms a
    cancellation subtracted) and by ``absolute``, then by one more ulp."""
    bump = abs(x) * _RELATIVE + 64.0 * math.ulp(scale) + absolute
    return math.nextafter(x + bump, math.inf)


def _sum_error(alpha: float) -> float:
    """A bound on the absolute float error of log A_α computed over ⌈α⌉ + 1 terms (each term's
    relative error is a few ulps, the terms sum to about 1), per unit of α − 1: 8 ulps of 1 per
    term."""
    return (math.ceil(alpha) + 1.0) * 8.0 * 2.0 ** -53 / (alpha - 1.0)


def pure(eps: float, alpha: float) -> float:
    """ρ(α) of any ε-DP mechanism: (1/(α−1)) log(cosh((2α−1)ε/2)/cosh(ε/2)), at most min(ε, αε²/2).

    Bun–Steinke 2016, Prop. 3.3 (written there with sinh). Tight: attained by randomized response.
    Why it holds for every ε-DP pair (P, Q): the likelihood ratio r = P/Q lies in [e^{−ε}, e^{ε}]
    with E_Q[r] = 1, and E_Q[r^α] is convex in r, so it is largest when r sits on the two ends
    with the weights that keep the mean 1 — randomized response. Computed as
    log1p(2 sinh(αε/2) sinh((α−1)ε/2) / cosh(ε/2)), a sum of positive terms (no cancellation).
    """
    if eps == 0.0:
        return 0.0
    if eps < 1e-150:  # (α−1)ε/2 may underflow below: ε-DP ⇒ ε²/2-zCDP (Bun–Steinke, Prop. 1.4)
        return min(_numeric.mul_up(alpha, _numeric.mul_up(eps, eps)), eps)
    # log x, x = 2 sinh(αε/2) sinh((α−1)ε/2) / cosh(ε/2), in logs so that large αε cannot overflow.
    log_x = (math.log(2.0) + _log_sinh(alpha * eps / 2.0) + _log_sinh((alpha - 1.0) * eps / 2.0)
             - _log_cosh(eps / 2.0))
    log1p_x = log_x + math.log1p(math.exp(-log_x)) if log_x > 0.0 else math.log1p(math.exp(log_x))
    return min(_up(log1p_x / (alpha - 1.0), log_x if log_x > 0.0 else 0.0), eps)


def _log_sinh(a: float) -> float:
    return math.log(math.sinh(a)) if a < 20.0 else a - math.log(2.0) + math.log1p(-math.exp(-2 * a))


def _log_cosh(a: float) -> float:
    return math.log(math.cosh(a)) if a < 20.0 else a - math.log(2.0) + math.log1p(math.exp(-2 * a))


def laplace(eps: float, alpha: float) -> float:
    """ρ(α) of the Laplace mechanism with Δ/b = ε: Mironov 2017, "Rényi Differential Privacy",
    Prop. 6: (1/(α−1)) log[(α/(2α−1)) e^{(α−1)ε} + ((α−1)/(2α−1)) e^{−αε}].

    Evaluated as ε + log1p((α−1)·expm1((1−2α)ε)/(2α−1))/(α−1), which subtracts terms of size ε;
    the margin covers that cancellation, and the result is never above :func:`pure`'s.
    """
    if eps == 0.0:
        return 0.0
    am1 = alpha - 1.0
    inner = math.log1p(am1 * math.expm1((1.0 - 2.0 * alpha) * eps) / (2.0 * alpha - 1.0)) / am1
    return min(_up(eps + inner, eps), pure(eps, alpha))


def _logaddexp(a: float, b: float) -> float:
    return float(np.logaddexp(a, b))


# scipy.special, imported on first use, not with this module (importing SciPy takes ~0.3 s, paid
# by every process that imports the accountant), and kept in a module global so that the series
# below, which call it per term, do not run an import statement (~0.2 µs) each time.
_special: Any = None


def _load_special() -> Any:
    global _special
    import scipy.special

    _special = scipy.special
    return _special


def _log_comb(n: float, k: float) -> float:
    gammaln = (_special or _load_special()).gammaln
    return float(gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0))


@lru_cache(maxsize=4096)
def _log_a_int(q: float, z: float, alpha: int) -> float:
    """log A_α = log Σ_k C(α,k) (1−q)^{α−k} q^k exp((k²−k)/(2z²)), integer α (MTZ 2019, §3.3).

    For a (1/(2z²))-zCDP base mechanism the same sum bounds E_{P0}[(M/P0)^α] (binomial
    expansion; E_{P0}[(P1/P0)^k] = exp((k−1) D_k(P1‖P0)) <= exp(k(k−1)/(2z²))).
    """
    log_q, log_1mq = math.log(q), math.log1p(-q)
    terms = [_log_comb(alpha, k) + k * log_q + (alpha - k) * log_1mq + (k * k - k) / (2 * z * z)
             for k in range(alpha + 1)]
    top = max(terms)
    return top + math.log(math.fsum(math.exp(t - top) for t in terms))


def _log_b(q: float, z: float, alpha: float) -> float:
    """log of a bound on E_{P0}[(P0/M)^{α−1}] = exp((α−1) D_α(P0‖M)), M = (1−q)P0 + qP1, for a
    (1/(2z²))-zCDP base: 1 + C(α,2) q² (1−q)^{−(α+1)} (e^{1/z²} − 1) (second-order Taylor bound
    of (1+u)^{−(α−1)} for u = q(P1/P0 − 1) >= −q; docs/theory.md §4b)."""
    x = (math.log(alpha * (alpha - 1.0) / 2.0) + 2.0 * math.log(q) - (alpha + 1.0) * math.log1p(-q)
         + _log_expm1(1.0 / (z * z)))
    return math.log1p(math.exp(x)) if x < 700.0 else x + 1e-300  # log1p(e^x) = x + tiny


def _log_expm1(x: float) -> float:
    """log(e^x − 1) for x > 0, without overflow."""
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def _log_erfc(x: float) -> float:
    return math.log(2.0) + float((_special or _load_special()).log_ndtr(-x * math.sqrt(2.0)))


@lru_cache(maxsize=4096)
def _log_a_frac(q: float, z: float, alpha: float) -> float:
    """An upper bound on log A_α for fractional α > 1 and the *continuous* Gaussian: the series
    of Mironov–Talwar–Zhang 2019, §3.3 (the integral split at z0 = z² ln(1/q − 1) + 1/2, each
    half a binomial series), with |C(α, i)| for the binomial coefficients (their signs alternate
    past α; absolute values only add), plus a proven bound on the tail the sum drops.

    Tail bound (ours; docs/theory.md §4b): from the first i >= α + 1 on, each half's terms t_k
    satisfy t_{k+1} <= t_k·(k − α)/(k + 1) — the q-, z- and erfc-factors cancel to at most 1 by
    the Gaussian tail ratio erfc(x + h)/erfc(x) <= e^{−2xh − h²}, true for every x (for x >= 0
    since −(log erfc)′(t) >= 2t, and for t <= 0 trivially) — so
    Σ_{k>i} t_k <= t_i·Σ_m ((i + 1)/(i + 1 + m))^{α+1} <= t_i·(i + 1)/α."""
    log_q, log_1mq = math.log(q), math.log1p(-q)
    z0 = z * z * (math.log1p(-q) - math.log(q)) + 0.5  # exact split even for q near 1
    start = alpha + 1.0  # the ratio bound needs k > α only (the erfc bound holds for any x)
    total = -math.inf
    for i in range(1_000_000):
        coef = _log_comb(alpha, i)
        j = alpha - i
        s0 = (coef + i * log_q + j * log_1mq + (i * i - i) / (2 * z * z) + math.log(0.5)
              + _log_erfc((i - z0) / (math.sqrt(2.0) * z)))
        s1 = (coef + j * log_q + i * log_1mq + (j * j - j) / (2 * z * z) + math.log(0.5)
              + _log_erfc((z0 - j) / (math.sqrt(2.0) * z)))
        total = _logaddexp(total, _logaddexp(s0, s1))
        if i >= start and max(s0, s1) < total - 36.0:
            tail = math.log((i + 1.0) / alpha) + _logaddexp(s0, s1)
            return _logaddexp(total, tail)
    return math.inf  # (never: the terms fall polynomially past the start)


def _log_a(q: float, z: float, alpha: float) -> float:
    """log A_α at any order: exact at integers; between them, log A interpolated linearly from
    the two neighbouring integers (α ↦ log E_{P0}[(M/P0)^α] is a cumulant generating function,
    hence convex, so the chord lies above it; log A_1 = log E[M/P0] = 0). Valid for any
    (1/(2z²))-zCDP base mechanism; the continuous Gaussian also has ``_log_a_frac``."""
    lo = math.floor(alpha)
    if alpha == lo:
        return _log_a_int(q, z, int(lo))
    t = alpha - lo
    log_lo = 0.0 if lo == 1 else _log_a_int(q, z, int(lo))
    return (1.0 - t) * log_lo + t * _log_a_int(q, z, int(lo) + 1)


def poisson_gaussian(q: float, z: float, alpha: float) -> float:
    """ρ(α) of the Poisson-subsampled continuous Gaussian, add/remove neighbours: log(A_α)/(α−1)
    (Mironov–Talwar–Zhang 2019, §3.3; they show A_α bounds both directions for the Gaussian, §3),
    at most α/(2z²) (subsampling never hurts)."""
    whole = _up(alpha / (2.0 * z * z))
    if q >= 1.0:
        return whole
    log_a = _log_a(q, z, alpha)
    if not float(alpha).is_integer():
        log_a = min(log_a, _log_a_frac(q, z, alpha))
    return min(_up(log_a / (alpha - 1.0), absolute=_sum_error(alpha)), whole)


def poisson_discrete_gaussian(q: float, z: float, alpha: float) -> float:
    """ρ(α) of the Poisson-subsampled discrete Gaussian, add/remove neighbours: log(A_α)/(α−1),
    at most α/(2z²). The noise is N_Z(0, σ²) on each coordinate of Z^d and a record moves the
    sum by an integer vector v with ‖v‖₂ <= σ/z.

    Remove direction: A_α by the binomial expansion (E_{P0}[(P1/P0)^k] = e^{k(k−1)‖v‖²/(2σ²)},
    exactly, for integer k: kv is a lattice shift); fractional α by log-convexity (the chord).
    Add direction: D_α(P0‖M) <= D_α(M‖P0) whenever P1 = P0∘τ for an involution τ — here
    τ(x) = v − x, a bijection of Z^d (ours; docs/theory.md §4b, "the add direction"). So no
    (1 − q)^{−(α+1)} factor, unlike :func:`poisson_zcdp`, which holds for any zCDP base."""
    whole = _up(alpha / (2.0 * z * z))
    if q >= 1.0:
        return whole
    return min(_up(_log_a(q, z, alpha) / (alpha - 1.0), absolute=_sum_error(alpha)), whole)


def poisson_zcdp(q: float, z: float, alpha: float) -> float:
    """ρ(α) of Poisson subsampling applied to any (1/(2z²))-zCDP mechanism (the exact discrete
    Gaussian is one: CKS 2020), add/remove neighbours: max(log A_α, log B_α)/(α−1), with A_α as
    in :func:`poisson_gaussian` (valid here by the binomial expansion) and B_α the second-order
    bound of :func:`_log_b` on the other direction. At most α/(2z²)."""
    whole = _up(alpha / (2.0 * z * z))
    if q >= 1.0:
        return whole
    value = max(_log_a(q, z, alpha), _log_b(q, z, alpha)) / (alpha - 1.0)
    return min(_up(value, absolute=_sum_error(alpha)), whole)


def check_curve(curve: Any) -> str | None:
    """Why ``curve`` is not a valid ``Charge.rdp`` description, or None."""
    if not isinstance(curve, tuple) or not curve or curve[0] not in CURVE_KINDS:
        return f"a curve description whose kind is one of {CURVE_KINDS}"
    numbers = curve[1:]
    if not all(isinstance(x, float) and math.isfinite(x) and x > 0.0 for x in numbers):
        return "finite parameters > 0"
    if curve[0] != "laplace" and len(numbers) == 2 and not 1e-100 <= numbers[1] <= 1e100:
        return "a noise multiplier z in [1e-100, 1e100]"
    if curve[0] == "laplace" and len(numbers) == 1:
        return None
    if curve[0] != "laplace" and len(numbers) == 2 and numbers[0] <= 1.0:
        return None
    return "the parameters of its kind: (ε) for laplace, (q <= 1, z) for the Poisson kinds"


def charge_rdp(charge: Any, alpha: float) -> float | None:
    """ρ(α) of one step (a ``Charge``): the least of the bounds it supports — its declared curve,
    αρ from a zCDP cost, :func:`pure` for a pure-DP cost — or None when it supports none (an
    approximate-DP step without zCDP cost or curve)."""
    return _charge_rdp(charge.rdp, charge.rho, charge.epsilon, charge.delta, alpha)


@lru_cache(maxsize=8192)
def _charge_rdp(curve: tuple[Any, ...] | None, rho: float | None, eps: float, delta: float,
                alpha: float) -> float | None:
    bounds = []
    if curve is not None:
        kind = curve[0]
        if kind == "laplace":
            bounds.append(laplace(curve[1], alpha))
        elif kind == "poisson-gaussian":
            bounds.append(poisson_gaussian(curve[1], curve[2], alpha))
        elif kind == "poisson-discrete-gaussian":
            bounds.append(poisson_discrete_gaussian(curve[1], curve[2], alpha))
        else:
            bounds.append(poisson_zcdp(curve[1], curve[2], alpha))
    if rho is not None:
        bounds.append(_numeric.mul_up(alpha, rho))
    if delta == 0.0:
        bounds.append(pure(eps, alpha))
    return min(bounds) if bounds else None


def epsilon(value: float, alpha: float, delta: float) -> float:
    """The ε of (α, ρ)-RDP at δ: ρ + log((α−1)/α) − (log δ + log α)/(α−1), rounded up.

    Canonne–Kamath–Steinke 2020, Prop. 12; Balle et al. 2020, "Hypothesis Testing
    Interpretations and Rényi DP", Thm 21. Never below 0.
    """
    eps = value + math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)
    return max(0.0, _up(eps, value + abs(math.log(delta))))


def budget(eps: float, delta: float, alpha: float) -> float:
    """The largest Rényi budget B at order α whose conversion (:func:`epsilon`) at δ is <= ε,
    rounded down: B = ε − log((α−1)/α) + (log δ + log α)/(α−1) (may be <= 0: no budget)."""
    b = eps - math.log1p(-1.0 / alpha) + (math.log(delta) + math.log(alpha)) / (alpha - 1.0)
    b -= abs(b) * _RELATIVE + 64.0 * math.ulp(eps + abs(math.log(delta)))
    return math.nextafter(b, -math.inf)
