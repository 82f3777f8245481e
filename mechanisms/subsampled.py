"""The Poisson-subsampled Gaussian mechanism: one step of DP-SGD, sampling done by the mechanism.

Invariant: the rows are clipped and Poisson-sampled *inside* the mechanism, the sample drawn
exactly from the accountant's sampler after the debit, fresh for every release — the conditions
the amplification theorem needs are met by construction, not left to the caller.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from dpbudget.accountant.values import _validate, rdp
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError, InvalidDataTypeError
from dpbudget.mechanisms.base import NumericMechanism, noise_kind
from dpbudget.mechanisms.bits import RandomBits
from dpbudget.mechanisms.calibration import analytic_gaussian_epsilon
from dpbudget.mechanisms.gaussian import _GaussianFamily, _grid, _times
from dpbudget.mechanisms.grid import to_float
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.sums import integer_sum

__all__ = ["SubsampledGaussian", "clip_rows", "poisson_sample"]


class SubsampledGaussian(_GaussianFamily):
    """Each row is clipped to L2 norm ``sensitivity`` (C), each row is kept independently with
    probability q (Poisson sampling), the kept rows are summed, and N(0, σ²) is added to each
    coordinate of the sum, σ = z·C (z the noise multiplier). Abadi et al. 2016 (DP-SGD).

    The value released is a matrix of per-example rows (n × d; a vector is n rows of one
    number): the mechanism does the clipping and the sampling itself, so the amplification's
    conditions hold — a fresh Poisson sample each release, drawn exactly (:func:`poisson_sample`)
    from the accountant's sampler after the debit, never reused. Neighbours: adding or removing
    one row (add/remove); the sum's L2 sensitivity is then C.

    **Costs it declares.**

    - Rényi curve (the "renyi" rule): with exact noise (the default: the discrete Gaussian on a
      grid, a record moving the integer sum by a lattice vector of L2 norm <= σ_g/z), the
      Poisson-subsampled discrete Gaussian, ``("poisson-discrete-gaussian", q, z)``: MTZ's A_α,
      which bounds both directions because x ↦ v − x maps the lattice onto itself; with
      ``noise="float"``, the sampled Gaussian mechanism of Mironov–Talwar–Zhang 2019,
      ``("poisson-gaussian", q, z)``.
      (:mod:`dpbudget.accountant.values.rdp`; the bound and its proof: docs/theory.md §4b.)
    - ρ = 1/(2z²) (the "advanced" rule): subsampling never hurts (joint convexity of
      exp((α−1)D_α)), but this charges no amplification: use "renyi" for DP-SGD.
    - (ε, δ) at ``delta`` (the "basic" rule, caps): the smaller of the step's own curve converted
      at its best order and the unsubsampled analytic Gaussian's ε.
    - No Gaussian-DP μ: the "gaussian" rule refuses it.

    Only ``noise_multiplier`` (it sets the noise, as ε does elsewhere) is positional;
    every other parameter is keyword-only, so that z and q cannot be swapped (issue 30).

    Args:
        noise_multiplier: z = σ/C > 0.
        sampling_rate: q in (0, 1]; q = 1 keeps every row (full-batch gradient descent).
        sensitivity: the clipping norm C > 0; required (there is no default clip norm).
        delta: the δ at which the step's (ε, δ) is declared (0 < δ < 1).
        noise: ``"exact"`` (default) or ``"float"`` (textbook float noise, an explicit opt-out).

    >>> m = SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0)
    >>> m.rdp, round(m.rho, 12), round(m.epsilon, 3)
    (('poisson-discrete-gaussian', 0.01, 1.0), 0.5, 1.212)
    """

    query_norm = None  # (it clips rows itself: its sensitivity is the clip norm, stated)
    sensitivity: float

    def __init__(self, noise_multiplier: float, *, sampling_rate: float, sensitivity: float,
                 delta: float = 1e-6, noise: str = "exact") -> None:
        self.noise_multiplier = _validate.positive("noise_multiplier", noise_multiplier)
        q = _validate.real("sampling_rate", sampling_rate)
        if not 0.0 < q <= 1.0:
            raise InvalidArgumentError("sampling_rate", sampling_rate, "a rate in (0, 1]")
        self.sampling_rate = q
        self.sensitivity = _validate.positive("sensitivity", sensitivity)
        self.delta = _validate.probability("delta", delta, low_open=True)
        self.sigma = _times("noise_multiplier", self.noise_multiplier, self.sensitivity)
        kind = noise_kind(noise)
        self._curve = ("poisson-discrete-gaussian" if kind == "exact" else "poisson-gaussian",
                       q, self.noise_multiplier)
        whole = analytic_gaussian_epsilon(self.sigma, self.delta, self.sensitivity)
        self.epsilon = min(whole, _amplified_epsilon(self._curve, self.delta))
        self._noise = kind
        # The grid keeps the discrete noise ρ-zCDP with ρ = Δ²/(2σ²) (σ_g >= σ·Δ_g/Δ): what the
        # curve needs. It is built for the unsubsampled Gaussian's own (ε, δ) at this σ.
        self.grid = (_grid(whole, self.delta, self.sensitivity, self.sigma)
                     if kind == "exact" else None)
        self.declare(Budget(self.epsilon, self.delta), noise=self._noise)

    @property
    def rdp(self) -> tuple[Any, ...]:
        return self._curve

    @property
    def mu(self) -> None:
        return None

    def params(self) -> dict[str, Any]:
        return {"noise_multiplier": self.noise_multiplier, "sampling_rate": self.sampling_rate,
                "sensitivity": self.sensitivity, "sigma": self.sigma, "delta": self.delta,
                "epsilon": self.epsilon, "noise": self._noise}

    def prepare(self, value: Any) -> Any:
        """The rows, clipped: a non-empty n × d array of finite reals (or a vector of n rows of
        one number). Refuses a shape whose largest possible sum the noise grid cannot hold."""
        x = NumericMechanism.prepare(self, value)
        if isinstance(x, float) or x.ndim not in (1, 2):
            raise InvalidDataTypeError("value", value, "per-example rows: an n x d array (or a "
                                       "vector of n numbers)")
        rows = x.reshape(-1, 1) if x.ndim == 1 else x
        n, d = rows.shape
        if self.grid is not None:
            g = self.grid.granularity_for(d)
            if not self.grid.fits(d) or n * self.sensitivity > self.grid.limit_for(d) \
                    or self.sensitivity / g >= 2.0 ** 52:
                raise InvalidDataError("value", value, f"at most "
                                       f"{self.grid.limit_for(d) / self.sensitivity:.6g} rows "
                                       "(the noise grid of this scale cannot hold a larger sum)")
        return (clip_rows(rows, self.sensitivity), x.ndim)

    def draw(self, value: Any, sampler: Sampler) -> Any:
        rows, ndim = value
        keep = poisson_sample(sampler.bits, self.sampling_rate, rows.shape[0])
        if self.grid is None:  # float noise (an opt-out): a float sum, as textbook DP-SGD
            total = rows[keep].sum(axis=0)
            return super().draw(float(total[0]) if ndim == 1 else total, sampler)
        # Exact noise: each kept row rounded to the grid, summed as integers (exactly), then
        # exact discrete Gaussian noise. One added row moves the integer sum by at most
        # C/g + √d/2 in L2 (clip_rows keeps its exact norm <= C), within the Δ_g = C/g + √d the
        # grid's noise is calibrated for — whatever n, unlike a float sum, whose rounding
        # depends on the other rows.
        d = rows.shape[1]
        g = self.grid.granularity_for(d)
        total = _integer_sum(np.rint(rows[keep] / g))
        out = _noisy_on_grid(total, self.grid.noise(sampler.bits, d), g)
        return float(out[0]) if ndim == 1 else out


def _noisy_on_grid(total: Any, z: Any, g: float) -> Any:
    """to_float(t + z, g) for each entry: the double nearest the exact integer t + z, times g.

    In int64 when both are int64 (|t| < 2^62 from ``_integer_sum``, |z| < 2^62 from the sampler,
    so the sum cannot wrap): numpy's int64 → float64 conversion rounds to nearest, ties to even,
    as ``float(int)`` does, and × g (a power of two) is exact unless it overflows to ±inf, as in
    ``to_float``. Else entry by entry on Python integers.
    """
    if total.dtype == np.int64 and z.dtype == np.int64:
        with np.errstate(over="ignore"):
            return (total + z).astype(np.float64) * g
    return np.array([to_float(int(t) + int(zi), g) for t, zi in zip(total.tolist(), z.tolist())])


def clip_rows(rows: Any, bound: float) -> Any:
    """Each row scaled to L2 norm at most ``bound`` — exactly, not just in floating point: rows
    are clipped to bound·(1 − 2^-30), the norm computed on the row divided by its largest entry
    (no overflow for huge rows, no underflow for tiny ones), so the error of computing the norm
    and scaling, (d + 5)·2^-53 relative, stays inside the 2^-30 margin for d < 2^23."""
    target = bound * (1.0 - 2.0 ** -30)
    # The row maxima, exactly (a max never rounds); reduced across the rows of the transpose,
    # since numpy's reduction along a short contiguous axis is ~3x slower (a DP-SGD step's cost).
    peak = np.maximum.reduce(np.ascontiguousarray(np.abs(rows).T))
    safe = np.where(peak > 0.0, peak, 1.0)
    unit = rows / safe[:, None]
    norms = safe * np.sqrt(np.einsum("ij,ij->i", unit, unit))
    scale = np.where(norms > target, target / np.where(norms > 0.0, norms, 1.0), 1.0)
    return rows * scale[:, None]


def _integer_sum(grid_rows: Any) -> Any:
    """The exact column sums of integer-valued float rows (|entries| < 2^53): an int64 array
    (each |sum| < 2^62) when no partial sum can reach 2^62 (a DP-SGD step's rows), else
    ``sums.integer_sum``'s Python ints in an object array."""
    n, d = grid_rows.shape
    ints = grid_rows.astype(np.int64)
    if n == 0 or n * (int(np.abs(ints).max()) + 1) <= 1 << 62:
        return ints.sum(axis=0)
    out = np.empty(d, dtype=object)
    out[:] = integer_sum(grid_rows)
    return out


def _amplified_epsilon(curve: tuple[Any, ...], delta: float) -> float:
    """The step's own (ε, δ): its curve converted at δ (CKS 2020, Prop. 12), best of a grid of
    orders (any order gives a valid ε)."""
    best = math.inf
    for alpha in [1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0,
                  32.0, 48.0, 64.0, 96.0, 128.0, 256.0]:
        if curve[0] == "poisson-discrete-gaussian":
            value = rdp.poisson_discrete_gaussian(curve[1], curve[2], alpha)
        else:
            value = rdp.poisson_gaussian(curve[1], curve[2], alpha)
        best = min(best, rdp.epsilon(value, alpha, delta))
    return best


def poisson_sample(bits: RandomBits, q: float, n: int) -> Any:
    """A boolean mask of ``n`` independent Bernoulli(q) draws, exact for the double q.

    q = a/2^k exactly. Each row compares a uniform 32-bit word u with ⌊q·2^32⌋: u below it is
    a success, above it a failure (q < (⌊q·2^32⌋ + 1)/2^32), and a tie (probability 2^-32 per
    row) is settled by comparing further bits with the rest of q's expansion, exactly:
    P(keep) = ⌊q·2^32⌋/2^32 + 2^-32·(q·2^32 − ⌊q·2^32⌋) = q. (32-bit words: half the CSPRNG
    bytes of 64-bit ones, a tenth of a DP-SGD step's cost.)
    """
    if q >= 1.0:
        return np.ones(n, dtype=bool)
    top, rest = _threshold(q)
    words = bits._half_words(n)
    keep = words < np.uint32(top)  # (q < 1, so top < 2^32)
    for i in np.flatnonzero(words == np.uint32(top)):
        keep[i] = _tie(bits, rest)
    return keep


@functools.lru_cache(maxsize=256)
def _threshold(q: float) -> tuple[int, Fraction]:
    """⌊q·2^32⌋ and the rest q·2^32 − ⌊q·2^32⌋, exactly (a function of the public q alone)."""
    scaled = Fraction(q) * (1 << 32)
    top = math.floor(scaled)
    return top, scaled - top


def _tie(bits: RandomBits, rest: Fraction) -> bool:
    """Bernoulli(rest) for a dyadic rest in [0, 1): compare a lazily drawn uniform with it."""
    while rest > 0:
        word = bits.word()
        scaled = rest * (1 << 64)
        top = math.floor(scaled)
        if word != top:
            return word < top
        rest = scaled - top
    return False

