"""Privacy-loss distributions (PLDs) of the Poisson-subsampled Gaussian, discretised on the safe
side, and the largest number of its self-compositions within an (ε, δ) limit.

Invariant: every PLD here *dominates* the true one: each grid bucket's mass is split between the
bucket's two ends keeping both laws' masses (connect-the-dots), tails are moved to the +∞ atom or
rounded up onto the grid's lowest point, so every δ(ε) computed from it is at least the exact
one; float error of the masses and of the convolutions is covered by explicit margins.
numpy/scipy only (dp-accounting is a test oracle, never imported here).

Sources: the PLD and its composition by convolution (Sommer–Meiser–Mohammadi 2019, "Privacy loss
classes"; Koskela–Jälkö–Honkela 2020); the pessimistic (rounded-up) discretisation
(Meiser–Mohammadi 2018, "Tight on budget?"; Doroshenko et al. 2022, "Connect the dots: tighter
discrete approximations of privacy loss distributions", PETS, §3); dominating pairs of the Poisson-subsampled Gaussian
under add/remove neighbours and their adaptive composition (Zhu–Dong–Wang 2022, "Optimal accounting
of differential privacy via characteristic function", AISTATS: dominating pairs, their adaptive
composition theorem, and the pairs of Poisson subsampling). docs/theory.md §2 (pld).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["GRID", "MAX_STEPS", "delta", "max_steps"]

#: The loss grid's spacing (dp-accounting's default, with the same connect-the-dots method).
GRID = 1e-4
#: A documented cap on the steps a budget may declare (the powers of two searched).
MAX_STEPS = 1 << 22
# Mass moved from each tail per truncation: the upper tail to the +∞ atom (it adds to δ), the lower
# tail onto the lowest point kept (its losses rounded up). Both safe; above the FFT's noise floor,
# so that the support stops growing; ≤ 1e-13 · 2·log2(MAX_STEPS) of δ in all.
_TAIL = 1e-13
# Float error of one FFT convolution c = a * b of non-negative vectors (length n of the result):
# the FFT's computed transform has relative 2-norm error ≤ c·u·log2 n (Higham 2002, "Accuracy and
# Stability of Numerical Algorithms", §24.1, Thm 24.2), so the product of transforms and the inverse
# put an error ≤ c·u·log2 n·(‖a‖₂‖b‖₁ + ‖a‖₁‖b‖₂) on c in 2-norm, ≤ √n times that in 1-norm. We
# take c = 16 (generous; the tests check it against exact convolution).
_FFT_ERROR = 16 * np.finfo(float).eps


class _PLD:
    """A discrete PLD: mass ``p[i]`` at loss ``(offset + i)·GRID``, plus ``inf`` at +∞, and
    ``err``, a bound on the L1 float error of ``p``."""

    __slots__ = ("err", "inf", "offset", "p")

    def __init__(self, p: np.ndarray, offset: int, inf: float, err: float) -> None:
        self.p, self.offset, self.inf, self.err = p, offset, inf, err

    def compose(self, other: "_PLD") -> "_PLD":
        """The PLD of the product pair (Sommer et al. 2019): the convolution; ∞ absorbs."""
        from scipy.signal import fftconvolve  # here, not above: importing SciPy takes ~0.3 s

        a, b = self.p, other.p
        p = np.maximum(fftconvolve(a, b), 0.0)
        l1a, l1b = max(1.0, float(a.sum())), max(1.0, float(b.sum()))
        fft = (_FFT_ERROR * math.log2(max(2, p.size)) * math.sqrt(p.size)
               * (float(np.linalg.norm(a)) * l1b + l1a * float(np.linalg.norm(b))))
        # Errors already in a and b reach c at most multiplied by the other's mass.
        err = self.err * l1b + other.err * l1a + fft
        inf = self.inf + other.inf - self.inf * other.inf
        return _truncate(p, self.offset + other.offset, inf, err)

    def delta(self, eps: float) -> float:
        """δ(ε) = P[L = ∞] + Σ_{L > ε} p(L)(1 − e^{ε−L}), plus the float-error bound."""
        losses = (self.offset + np.arange(self.p.size)) * GRID
        above = losses > eps
        tail = float(np.sum(self.p[above] * -np.expm1(eps - losses[above])))
        return tail + self.inf + self.err


def _truncate(p: np.ndarray, offset: int, inf: float, err: float) -> _PLD:
    """Drop at most ``_TAIL`` from each end: the top into ``inf``, the bottom onto the lowest
    point kept (its loss rounded up)."""
    c = np.cumsum(p)
    lo = int(np.searchsorted(c, _TAIL, side="right"))
    top = np.cumsum(p[::-1])
    hi = p.size - int(np.searchsorted(top, _TAIL, side="right"))
    lo = min(lo, hi - 1)
    kept = p[lo:hi].copy()
    kept[0] += float(c[lo - 1]) if lo > 0 else 0.0
    return _PLD(kept, offset + lo, inf + (float(top[p.size - hi - 1]) if hi < p.size else 0.0),
                err)


def _log_mass(x_a: np.ndarray, x_b: np.ndarray, mean: float, z: float) -> np.ndarray:
    """log P[x_a < X ≤ x_b] for X ~ N(mean, z²), accurate in both tails."""
    from scipy.special import log_ndtr  # here, not above: importing SciPy takes ~0.3 s

    a, b = (x_a - mean) / z, (x_b - mean) / z
    lower = log_ndtr(b) + np.log(-np.expm1(np.minimum(log_ndtr(a) - log_ndtr(b), -1e-300)))
    upper = log_ndtr(-a) + np.log(-np.expm1(np.minimum(log_ndtr(-b) - log_ndtr(-a), -1e-300)))
    out: np.ndarray = np.where(a > 0.0, upper, lower)
    return out


def _single(q: float, z: float, remove: bool) -> _PLD:
    """The one-step PLD of the Poisson-subsampled Gaussian (sensitivity 1, noise z), discretised
    on the safe side by connecting the dots (Doroshenko et al. 2022, §3).

    Dominating pairs (Zhu–Dong–Wang 2022, Poisson subsampling; Koskela et al. 2020): remove
    P = (1−q)N(0, z²) + qN(1, z²) against Q = N(0, z²); add, Q against P. With
    s(x) = log(1 − q + q·e^{(2x−1)/(2z²)}) (increasing in x) the loss is s(x) (remove) or −s(x)
    (add); the loss bucket (ε_j, ε_{j+1}] of the grid is an interval of x, through
    x(l) = z²·log((e^l − 1 + q)/q) + 1/2. Each bucket's mass, P_j under the pair's first law and
    Q_j under its second, is split between the bucket's two ends so that both are kept: u_j at
    ε_{j+1} and ℓ_j = P_j − u_j at ε_j with u_j·e^{−ε_{j+1}} + ℓ_j·e^{−ε_j} = Q_j, i.e.
    u_j = e^{Δ}(P_j − e^{ε_j}Q_j)/(e^{Δ} − 1). The result's δ(ε) equals the exact one at every
    grid point and is linear in e^ε between them, where the exact one is convex: it dominates
    (and it is a valid PLD: Σ mass·e^{−loss} = ΣQ_j ≤ 1). Mass above the grid goes to +∞.
    """
    # The loss range that matters: x within ±10 z of 0 (beyond: < 1e-22, put at +∞).
    span = 10.0 * z
    s_lo = math.log1p(-q) if q < 1.0 else (-2 * span - 1.0) / (2 * z * z)
    s_hi = math.log1p(q * math.expm1((2 * span + 1.0) / (2 * z * z)))
    lo_l, hi_l = (s_lo, s_hi) if remove else (-s_hi, -s_lo)
    i0, i1 = math.floor(lo_l / GRID), math.ceil(hi_l / GRID)
    edges = np.arange(i0, i1 + 1) * GRID  # bucket j is (edges[j], edges[j+1]]

    def x_of(s: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = np.log(np.expm1(s) + q) - math.log(q)
        x = z * z * inner + 0.5
        return np.where(np.expm1(s) + q <= 0.0, -np.inf, x)

    if remove:  # loss s(x) in (ε_j, ε_{j+1}]  ⟺  x in (x(ε_j), x(ε_{j+1})]
        xs = x_of(edges)
        xa, xb = xs[:-1], xs[1:]
    else:  # loss −s(x) in (ε_j, ε_{j+1}]  ⟺  x in [x(−ε_{j+1}), x(−ε_j))
        xs = x_of(-edges)
        xa, xb = xs[1:], xs[:-1]
    n0 = np.exp(_log_mass(xa, xb, 0.0, z))
    n1 = np.exp(_log_mass(xa, xb, 1.0, z))
    mix = (1.0 - q) * n0 + q * n1
    t = np.exp(edges[:-1])
    if remove:  # first law the mixture, second N(0, z²); P_j − tQ_j = q·n1 − (t − 1 + q)·n0
        first, second = mix, n0
        excess = q * n1 - (t - 1.0 + q) * n0
    else:  # first law N(0, z²), second the mixture
        first, second = n0, mix
        excess = n0 * (1.0 - t * (1.0 - q)) - t * q * n1
    width = math.expm1(GRID)
    excess = np.clip(excess, 0.0, width * t * second)  # the exact value lies in this range
    up = np.minimum(first, math.exp(GRID) * excess / width)
    # Float error: the bucket masses are within a relative 1e-10 (log-space differences at this
    # grid), which moves ``up`` by at most 2e-10/(e^Δ − 1) of the mass; move 1e-5 of each
    # bucket's mass up instead (raising losses only raises δ), and raise every mass by 1e-10.
    up = np.minimum(first, up + 1e-5 * first) * (1.0 + 1e-10)
    low = np.maximum(first * (1.0 + 1e-10) - up, 0.0)
    p = np.zeros(edges.size)
    p[:-1] += low
    p[1:] += up
    # Mass not on the grid (beyond ±10 z): < 1e-22; put the whole remainder at +∞.
    inf = max(0.0, 1.0 - math.fsum(p.tolist()))
    return _truncate(p, i0, inf, 0.0)


def _max_steps_one(q: float, z: float, eps: float, target: float, remove: bool) -> int:
    """The largest k ≤ MAX_STEPS with the k-fold composition's δ(ε) ≤ target, one direction:
    powers of two, then the binary digits from the top (δ(ε) only grows with k)."""
    powers = [_single(q, z, remove)]
    if powers[0].delta(eps) > target:
        return 0
    while (1 << len(powers)) <= MAX_STEPS:
        nxt = powers[-1].compose(powers[-1])
        if nxt.delta(eps) > target:
            break
        powers.append(nxt)
    acc, k = powers[-1], 1 << (len(powers) - 1)
    for j in range(len(powers) - 2, -1, -1):
        if k + (1 << j) > MAX_STEPS:
            continue
        cand = acc.compose(powers[j])
        if cand.delta(eps) <= target:
            acc, k = cand, k + (1 << j)
    return k


def max_steps(q: float, z: float, eps: float, target: float) -> int:
    """The largest k (≤ ``MAX_STEPS``) such that k Poisson-subsampled Gaussian steps (rate q,
    noise multiplier z) are (ε, δ)-DP under add/remove neighbours by the pessimistic PLD: the
    worse of the two directions at each ε (Zhu–Dong–Wang 2022), so the smaller k of the two."""
    return min(_max_steps_one(q, z, eps, target, True),
               _max_steps_one(q, z, eps, target, False))


def delta(q: float, z: float, k: int, eps: float) -> float:
    """δ(ε) of k steps by the pessimistic PLD, worse direction (for tests and benchmarks)."""
    out = 0.0
    for remove in (True, False):
        one = _single(q, z, remove)
        acc: _PLD | None = None
        base, n = one, k
        while n:
            if n & 1:
                acc = base if acc is None else acc.compose(base)
            n >>= 1
            if n:
                base = base.compose(base)
        out = max(out, acc.delta(eps) if acc is not None else 0.0)
    return out
