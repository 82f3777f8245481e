"""Pure composition and conversion bounds, each from a named theorem (docs/theory.md §2).

Invariant: every function here is a pure function of its arguments and returns a value on the
safe side of privacy: an ε or δ that is never *below* the exact bound (up to the last bits of
double precision), and a budget (ρ_B, μ_B, k_max) that is never *above* the exact one. Rules call
these once, when a budget is created (or once per batch), never on the per-release hot path.

Which of these may be used as a running filter under full adaptivity is decided in the rules, not
here: KOV and DRV below are theorems for parameters fixed in advance (docs/theory.md §1).

Never use the "textbook shortcut" ε' = 2ε·sqrt(2k ln(1/δ')) (Dwork–Roth Cor 3.21): it holds only
when ε' < 1 and understates privacy loss beyond (k=1000, ε=0.5, δ'=1e-5 gives 151.74 < 186.12).
"""

from __future__ import annotations

import math
from fractions import Fraction
from collections.abc import Callable, Sequence

import numpy as np

from dpbudget.accountant.values import _numeric, _validate
from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = [
    "cks_epsilon", "cks_rho_budget", "drv_epsilon", "gdp_delta", "gdp_epsilon", "gdp_mu",
    "kov_delta", "kov_epsilon", "kov_heterogeneous_epsilon", "kov_max_steps",
]

# Bisections run until the bracket stops shrinking (at most this many halvings).
# Terms of the binomial sum further than this many sqrt(k) below the mean carry total mass
# <= exp(-2 * 20**2) = exp(-800) by Hoeffding's inequality: below the smallest double.
_WINDOW = 20.0
# k_max beyond this is refused rather than computed (a per-query cost too small to mean anything).
_MAX_STEPS = 10 ** 12


def _up(x: float, ulps: int = 2) -> float:
    for _ in range(ulps):
        x = math.nextafter(x, math.inf)
    return x


def _down(x: float, ulps: int = 2) -> float:
    for _ in range(ulps):
        x = math.nextafter(x, -math.inf)
    return x


# -- zCDP → (ε, δ): Canonne–Kamath–Steinke 2020 -----------------------------------------------

def _cks_slack(alpha: float, log_inv_delta: float) -> float:
    """(ln(1/δ) + (α−1) ln(1−1/α) − ln α)/(α−1), the part of the CKS bound that is not αρ."""
    am1 = alpha - 1.0
    return (log_inv_delta + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / am1


def _best_alpha(objective: Callable[[float], float], guess: float) -> float:
    """The α > 1 minimising ``objective(α)``, searched on t = ln(α − 1): a coarse grid around the
    guess picks the basin, bounded Brent refines it. Any α > 1 gives a valid bound, so the search
    only affects tightness, never validity."""
    from scipy.optimize import minimize_scalar  # here, not above: importing SciPy takes ~0.3 s

    t0 = math.log(guess - 1.0)
    grid = [t0 + s for s in np.linspace(-12.0, 12.0, 97)]
    values = [objective(1.0 + math.exp(t)) for t in grid]
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    res = minimize_scalar(lambda t: objective(1.0 + math.exp(t)), bounds=(lo, hi),
                          method="bounded", options={"xatol": 1e-13, "maxiter": 500})
    best = float(res.x) if res.fun <= values[i] else grid[i]
    return 1.0 + math.exp(best)


def cks_epsilon(rho: float, delta: float) -> float:
    """The ε at which ρ-zCDP implies (ε, δ)-DP.

    Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy", Prop. 12 with
    Cor. 13 (ρ-zCDP is (α, αρ)-RDP for every α > 1):
    ε = min_{α>1} [αρ + (ln(1/δ) + (α−1) ln(1−1/α) − ln α)/(α−1)].
    The minimum is found numerically; the value returned is the bound evaluated at the α found
    (valid for any α), rounded up.

    Args:
        rho: ρ >= 0.
        delta: 0 < δ < 1 (δ = 0 gives ``inf`` for ρ > 0).

    >>> round(cks_epsilon(0.5, 1e-5), 9)
    4.728386985
    """
    rho = _validate.non_negative("rho", rho)
    delta = _validate.probability("delta", delta)
    if rho == 0.0:
        return 0.0
    if delta == 0.0:
        return math.inf
    lid = -math.log(delta)

    def objective(alpha: float) -> float:
        return alpha * rho + _cks_slack(alpha, lid)

    alpha = _best_alpha(objective, 1.0 + math.sqrt(lid / rho))
    return max(0.0, _up(objective(alpha)))


def cks_rho_budget(epsilon: float, delta: float) -> float:
    """The largest ρ whose CKS conversion (:func:`cks_epsilon`) at δ is <= ε.

    For each α, αρ + c(α) <= ε iff ρ <= (ε − c(α))/α, so ρ_B = max_{α>1} (ε − c(α))/α
    (Canonne–Kamath–Steinke 2020, Prop. 12/Cor. 13, inverted). The value is rounded down until
    :func:`cks_epsilon` (which rounds up) re-checks it to be <= ε.

    >>> round(cks_rho_budget(1.0, 1e-6), 15)  # docs/theory.md §2: 0.024355970359538525
    0.024355970359538
    """
    epsilon = _validate.non_negative("epsilon", epsilon)
    delta = _validate.probability("delta", delta)
    if delta == 0.0 or epsilon == 0.0:
        return 0.0
    if math.isinf(epsilon):
        return math.inf
    lid = -math.log(delta)
    alpha = _best_alpha(lambda a: -(epsilon - _cks_slack(a, lid)) / a,
                        1.0 + math.sqrt(lid / max(epsilon * epsilon / (4.0 * lid), 1e-300)))
    rho = (epsilon - _cks_slack(alpha, lid)) / alpha
    if not rho > 0.0:
        return 0.0
    rho = _down(rho)
    # Safe-side re-check with the public conversion itself (which rounds up).
    while cks_epsilon(rho, delta) > epsilon:
        rho = _down(rho * (1.0 - 1e-15))
    return rho


# -- Kairouz–Oh–Viswanath 2015, Thm 3.3: optimal homogeneous composition ---------------------

def _log_delta_rr(k: int, eps0: float, epsilon: float) -> float:
    """ln δ_RR(ε) = ln E[(1 − e^{ε − L})_+], L = (k − 2ℓ)ε₀, ℓ ~ Binomial(k, 1/(1+e^{ε₀})),
    by logsumexp over the ℓ with L > ε (log-binomial pmf), in a Hoeffding window below the mean."""
    from scipy.special import expit, logsumexp  # here, not above: importing SciPy takes ~0.3 s
    from scipy.stats import binom

    top = math.ceil((k - epsilon / eps0) / 2.0) - 1  # largest ℓ with (k − 2ℓ)ε₀ > ε
    while top >= 0 and (k - 2 * top) * eps0 <= epsilon:
        top -= 1
    while (k - 2 * (top + 1)) * eps0 > epsilon:
        top += 1
    if top < 0:
        return -math.inf
    p = float(expit(-eps0))
    low = max(0, math.floor(k * p - _WINDOW * math.sqrt(k)))
    if low > top:
        return -math.inf
    ell = np.arange(low, top + 1, dtype=np.float64)
    loss = (k - 2.0 * ell) * eps0
    terms = binom.logpmf(ell, k, p) + np.log(-np.expm1(epsilon - loss))
    return float(logsumexp(terms))


def kov_delta(k: int, eps0: float, epsilon: float, delta0: float = 0.0) -> float:
    """The exact δ_g at which k-fold composition of (ε₀, δ₀)-DP mechanisms is (ε, δ_g)-DP.

    Kairouz, Oh, Viswanath 2015, "The Composition Theorem for Differential Privacy", Thm 3.3
    (tight; attained by randomized response): δ_g = 1 − (1−δ₀)^k (1 − δ_RR(ε)) with
    δ_RR(ε) = E[(1 − e^{ε − L})_+], L = (k − 2ℓ)ε₀, ℓ ~ Binomial(k, 1/(1+e^{ε₀})), evaluated in
    log space. Valid for adaptively chosen mechanisms with the costs fixed in advance.

    >>> kov_delta(10, 0.1, 0.9936911768) < 1.0000001e-5
    True
    """
    k = _validate.positive_int("k", k) if k != 0 else 0
    eps0 = _validate.positive("eps0", eps0)
    epsilon = _validate.non_negative("epsilon", epsilon)
    delta0 = _validate.probability("delta0", delta0)
    if k == 0:
        return 0.0
    if delta0 == 0.0 and k * Fraction(eps0) <= Fraction(epsilon):
        # Pure steps whose total kε₀ is within ε (exactly, in rationals): the privacy loss is
        # bounded by kε₀ pointwise, so δ_g is exactly 0 — not the subnormal _up(0) would give,
        # which a pure limit (δ_B = 0) would refuse.
        return 0.0
    log_rr = _log_delta_rr(k, eps0, epsilon)
    if log_rr >= 0.0:  # δ_RR rounds to 1: nothing is guaranteed
        return 1.0
    log_keep = k * math.log1p(-delta0) + math.log1p(-math.exp(log_rr))
    return min(1.0, _up(-math.expm1(log_keep)))


def kov_epsilon(k: int, eps0: float, delta: float, delta0: float = 0.0) -> float:
    """The smallest ε with k-fold composition of (ε₀, δ₀)-DP mechanisms (ε, δ)-DP.

    Kairouz–Oh–Viswanath 2015, Thm 3.3 (see :func:`kov_delta`), solved for ε by bisection to
    full double precision; the upper end of the bracket is returned (safe side). ``inf`` when no
    ε works (δ below 1 − (1−δ₀)^k).

    >>> round(kov_epsilon(100, 0.1, 1e-5), 9)
    4.306791373
    >>> round(kov_epsilon(20, 0.05, 1e-3), 10)
    0.4979864081
    """
    k = _validate.positive_int("k", k)
    eps0 = _validate.positive("eps0", eps0)
    delta = _validate.probability("delta", delta)
    if kov_delta(k, eps0, 0.0, delta0) <= delta:
        return 0.0
    lo, hi = 0.0, k * eps0
    if kov_delta(k, eps0, hi, delta0) > delta:
        return math.inf
    return _numeric.bisect(lambda e: kov_delta(k, eps0, e, delta0) <= delta, lo, hi)[1]


def kov_max_steps(epsilon: float, delta: float, eps0: float, delta0: float = 0.0) -> int:
    """The largest k such that k-fold composition of (ε₀, δ₀)-DP mechanisms is (ε, δ)-DP.

    Kairouz–Oh–Viswanath 2015, Thm 3.3 (:func:`kov_delta` is increasing in k): exponential
    search then bisection on k, O(log k) evaluations of the log-space sum.

    >>> kov_max_steps(1.0, 1e-6, 0.01)
    562
    """
    epsilon = _validate.non_negative("epsilon", epsilon)
    eps0 = _validate.positive("eps0", eps0)

    def fits(k: int) -> bool:
        return kov_delta(k, eps0, epsilon, delta0) <= delta

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > _MAX_STEPS:
            raise InvalidArgumentError("per_query", eps0, "a per-query epsilon for which fewer "
                                       f"than {_MAX_STEPS} releases fit the limit")
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


# -- Heterogeneous and classic advanced composition ----------------------------------------

def kov_heterogeneous_epsilon(epsilons: Sequence[float], slack: float) -> float:
    """ε of the composition of ε_i-DP mechanisms at slack δ̃ (the δ_i add separately).

    Kairouz–Oh–Viswanath 2015, Thm 3.5: the composition is (ε̃, 1 − (1−δ̃)Π(1−δ_i))-DP with
    ε̃ = min{ Σε_i,
              Σ(e^{ε_i}−1)ε_i/(e^{ε_i}+1) + sqrt(2Σε_i² ln(e + sqrt(Σε_i²)/δ̃)),
              Σ(e^{ε_i}−1)ε_i/(e^{ε_i}+1) + sqrt(2Σε_i² ln(1/δ̃)) }.
    (e^ε−1)/(e^ε+1) is computed as tanh(ε/2). Valid for parameters fixed in advance.

    >>> round(kov_heterogeneous_epsilon([0.05] * 20, 1e-3), 10)
    0.7613352286
    """
    eps = np.asarray([_validate.non_negative("epsilons", e) for e in epsilons], dtype=np.float64)
    slack = _validate.probability("slack", slack)
    total = float(math.fsum(eps))
    if slack == 0.0 or total == 0.0:
        return total
    drift = math.fsum(eps * np.tanh(eps / 2.0))
    sq = math.fsum(eps * eps)
    b = drift + math.sqrt(2.0 * sq * math.log(math.e + math.sqrt(sq) / slack))
    c = drift + math.sqrt(2.0 * sq * -math.log(slack))
    return _up(min(total, b, c))


def drv_epsilon(k: int, epsilon: float, delta: float) -> float:
    """Advanced composition: k-fold ε-DP is (ε', kδ + δ')-DP with
    ε' = sqrt(2k ln(1/δ'))ε + kε(e^ε − 1).

    Dwork, Rothblum, Vadhan 2010, "Boosting and Differential Privacy", Thm III.3 (Dwork–Roth 2014,
    Thm 3.20). Valid for parameters fixed in advance; provided for comparison, not used as a filter.

    >>> round(drv_epsilon(100, 0.1, 1e-5), 9)
    5.850235093
    """
    k = _validate.positive_int("k", k)
    epsilon = _validate.non_negative("epsilon", epsilon)
    delta = _validate.probability("delta", delta, low_open=True)
    return _up(math.sqrt(2.0 * k * -math.log(delta)) * epsilon + k * epsilon * math.expm1(epsilon))


# -- Gaussian differential privacy: Dong, Roth, Su 2019 -------------------------------------

def _log_gdp_delta(mu: float, epsilon: float) -> float:
    from scipy.special import log_ndtr  # here, not above: importing SciPy takes ~0.3 s

    log_a = log_ndtr(-epsilon / mu + mu / 2.0)
    log_b = epsilon + log_ndtr(-epsilon / mu - mu / 2.0)
    if log_b >= log_a:
        return -math.inf
    return float(log_a + math.log(-math.expm1(log_b - log_a)))


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).

    Dong, Roth, Su 2019, "Gaussian Differential Privacy", Cor. 2.13 (μ-GDP holds iff
    (ε, δ(ε))-DP for every ε >= 0). Evaluated in log space, rounded up.

    >>> gdp_delta(1.0, 4.377178096) < 1.000001e-5
    True
    """
    mu = _validate.positive("mu", mu)
    epsilon = _validate.non_negative("epsilon", epsilon)
    return min(1.0, _up(math.exp(_log_gdp_delta(mu, epsilon))))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε at which μ-GDP is (ε, δ)-DP (Dong–Roth–Su 2019, Cor. 2.13), by bisection;
    the upper end is returned (safe side).

    >>> round(gdp_epsilon(1.0, 1e-5), 9)
    4.377178096
    """
    mu = _validate.positive("mu", mu)
    delta = _validate.probability("delta", delta, low_open=True)
    target = math.log(delta)
    if _log_gdp_delta(mu, 0.0) <= target:
        return 0.0
    hi = 1.0
    while _log_gdp_delta(mu, hi) > target:
        hi *= 2.0
    return _numeric.bisect(lambda e: _log_gdp_delta(mu, e) <= target, 0.0, hi)[1]


_GDP_MU_MARGIN = 1e-10


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest μ such that μ-GDP is (ε, δ)-DP (δ(ε) of μ-GDP increases with μ;
    Dong–Roth–Su 2019, Cor. 2.13), by bisection; the lower end is returned (safe side).

    >>> round(gdp_mu(4.377178096, 1e-5), 6)
    1.0
    """
    epsilon = _validate.non_negative("epsilon", epsilon)
    delta = _validate.probability("delta", delta)
    if delta == 0.0:
        return 0.0
    target = math.log(delta)
    hi = 1.0
    while _log_gdp_delta(hi, epsilon) <= target:
        hi *= 2.0
    mu = _numeric.bisect(lambda m: _log_gdp_delta(m, epsilon) > target, 0.0, hi)[0]
    # The log-space δ(μ) carries rounding error (measured up to ~2e-12 relative in μ at the
    # root); μ_B must never be above the exact root, so step down by a margin 50× that.
    return math.nextafter(mu * (1.0 - _GDP_MU_MARGIN), 0.0)
