"""Exact samplers: Bernoulli(exp(−γ)) for rational γ, discrete Laplace and discrete Gaussian.

Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
Algorithms 1 (Bernoulli(exp(−γ))), 2 (discrete Laplace) and 3 (discrete Gaussian). Every
accept/reject decision compares a uniformly random integer with an integer (``Bernoulli(a/b)`` is
``uniform{0..b−1} < a``), so the output law is exactly the stated pmf whatever the floating-point
hardware does: no float ever stands for a probability (docs/theory.md §4).

Each algorithm is written twice with the same steps: once on Python integers (any size; the scalar
path, and the fallback for the rare entries whose integers would not fit in 63 bits) and once on
``int64`` numpy arrays, where each rejection loop runs in bulk on the entries still pending, so a
10^6-element draw is a few dozen array passes. Both read the words of one ``RandomBits``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpbudget.mechanisms.bits import RandomBits

__all__ = ["bernoulli_exp", "bernoulli_exp_array", "discrete_gaussian", "discrete_gaussian_array",
           "discrete_laplace", "discrete_laplace_array", "wide_gaussian", "wide_gaussian_array"]

# Integers handled in int64 arrays stay below 2^62, so that no sum or comparison can overflow.
_SMALL = 1 << 62
# Below this many draws, the Python-integer algorithm is faster than the bulk one.
_BULK = 64


# -- Python integers (exact at any size) --------------------------------------------------------

def _unit(bits: RandomBits, n: int, d: int, k: int = 1) -> bool:
    """Bernoulli(exp(−n/d)) for 0 <= n/d <= 1 (CKS Alg. 1, γ ≤ 1), resumed at counter ``k``.

    K ← 1; while Bernoulli(γ/K): K ← K + 1; return K odd. P(K odd) = Σ_m (−γ)^m/m! = e^{−γ}.
    """
    if k == 1 and n == d:  # Bernoulli(γ/1) with γ = 1 always succeeds: no word needed
        k = 2
    while bits.below(d * k) < n:
        k += 1
    return k % 2 == 1


def bernoulli_exp(bits: RandomBits, n: int, d: int) -> bool:
    """Bernoulli(exp(−n/d)) for integers n >= 0, d >= 1 (CKS 2020, Alg. 1).

    γ > 1 is split as ⌊γ⌋ independent Bernoulli(exp(−1)) draws (all must succeed) and one
    Bernoulli(exp(−(γ − ⌊γ⌋))): exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)).
    """
    whole, rest = divmod(n, d)
    for _ in range(whole):
        if not _unit(bits, 1, 1):
            return False
    return _unit(bits, rest, d)


def _geometric(bits: RandomBits) -> int:
    """The number of Bernoulli(exp(−1)) successes before the first failure: P(V = v) ∝ e^{−v}."""
    v = 0
    while _unit(bits, 1, 1):
        v += 1
    return v


def discrete_laplace(bits: RandomBits, s: int, t: int) -> int:
    """One draw with P(Y = y) ∝ exp(−|y|·s/t) for integers s, t >= 1 (CKS 2020, Alg. 2).

    X = U + t·V with U uniform on {0..t−1} accepted with prob. exp(−U/t) and V geometric has
    P(X = x) ∝ exp(−x/t); Y = ⌊X/s⌋ has P ∝ exp(−y·s/t); a fair sign, rejecting "−0", makes it
    two-sided.
    """
    while True:
        u = bits.below(t)
        if not bernoulli_exp(bits, u, t):
            continue
        y = (u + t * _geometric(bits)) // s
        negative = bits.word() & 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(bits: RandomBits, num: int, den: int) -> int:
    """One draw with P(Y = y) ∝ exp(−y²/(2σ²)), σ² = num/den (CKS 2020, Alg. 3).

    A discrete Laplace proposal of scale t = ⌊σ⌋ + 1 accepted with probability
    exp(−(|Y| − σ²/t)²/(2σ²)) = exp(−(|Y|·t·den − num)² / (2·num·den·t²)).
    """
    t = math.isqrt(num // den) + 1
    scale = 2 * num * den * t * t
    while True:
        y = discrete_laplace(bits, 1, t)
        a = abs(y) * t * den - num
        if bernoulli_exp(bits, a * a, scale):
            return y


def _unit_square(bits: RandomBits, r: int, s: int, k: int = 1) -> bool:
    """Bernoulli(exp(−(r/s)²)) for 0 <= r <= s: Alg. 1 with γ = (r/s)², each Bernoulli(γ/K)
    drawn as the conjunction of two independent ones, Bernoulli(r/s) and Bernoulli(r/(sK)), so
    that no integer is larger than s·K (γ's own numerator r² would be twice as wide)."""
    while bits.below(s) < r and bits.below(s * k) < r:
        k += 1
    return k % 2 == 1


def _square_accept(bits: RandomBits, x: int, s: int) -> bool:
    """Bernoulli(exp(−(x/s)²)) for an integer x >= 0: with x = qs + r, (x/s)² = q² + 2qr/s +
    (r/s)², and exp(−(x/s)²) is the product of three independent Bernoulli(exp(−·)) draws."""
    q, r = divmod(x, s)
    return (bernoulli_exp(bits, q * q, 1) and bernoulli_exp(bits, 2 * q * r, s)
            and _unit_square(bits, r, s))


def _check_even(s: int) -> None:
    if not (isinstance(s, int) and s >= 2 and s % 2 == 0):
        raise ValueError("wide_gaussian needs an even integer s >= 2")


def wide_gaussian(bits: RandomBits, s: int) -> int:
    """One draw with P(Y = y) ∝ exp(−y²/s²), the discrete Gaussian of σ² = s²/2, for even s >= 2.

    CKS 2020 Alg. 3 with the proposal's scale t = s/2 instead of ⌊σ⌋ + 1 (any t > 0 is valid:
    exp(−|y|/t) · exp(−(|y| − σ²/t)²/(2σ²)) ∝ exp(−y²/(2σ²))). With t = s/2, σ²/t = s is an
    integer, so the acceptance exponent is (x/s)² for the integer x = ||y| − s|, and the bulk
    version's integers (s·K, 2qr with q < 64) stay far below 2^62: wide noise (σ ~ 2^38, the
    Gaussian grid's) runs in int64.

    Raises:
        ValueError: s odd or below 2 (the law would not be the one stated).
    """
    _check_even(s)
    while True:
        y = discrete_laplace(bits, 1, s // 2)
        if _square_accept(bits, abs(abs(y) - s), s):
            return y


# -- numpy arrays (the same steps in bulk) ------------------------------------------------------

def _unit_array(bits: RandomBits, n: Any, d: int) -> Any:
    """Bernoulli(exp(−n_i/d)) for an int64 array with 0 <= n_i <= d < 2^62: ``_unit`` in bulk.

    Every entry still looping has the same counter K, so each round is one draw below d·K.
    """
    out = np.empty(n.shape, dtype=bool)
    todo = np.arange(n.size)
    k = 1
    while todo.size:
        if d * k >= _SMALL:  # (never in practice) finish these entries on Python integers
            for i in todo.tolist():
                out[i] = _unit(bits, int(n[i]), d, k)
            break
        if d * k == 1:  # uniform on {0} is 0: Bernoulli(n/1) needs no word (as ``_unit``)
            going = n[todo] >= 1
        else:
            going = bits.below_array(d * k, todo.size) < n[todo]
        out[todo[~going]] = k % 2 == 1
        todo = todo[going]
        k += 1
    return out


def bernoulli_exp_array(bits: RandomBits, n: Any, d: int) -> Any:
    """Bernoulli(exp(−n_i/d)) for each entry of an int64 array n >= 0, integer 1 <= d < 2^62."""
    whole, rest = np.divmod(n, d)
    out = np.ones(n.shape, dtype=bool)
    todo = np.flatnonzero(whole > 0)
    j = 0
    while todo.size:  # the j-th Bernoulli(exp(−1)) of every entry with ⌊γ⌋ > j still alive
        out[todo] = _unit_array(bits, np.ones(todo.size, dtype=np.int64), 1)
        j += 1
        todo = todo[out[todo] & (whole[todo] > j)]
    alive = np.flatnonzero(out)
    out[alive] = _unit_array(bits, rest[alive], d)
    return out


def _geometric_array(bits: RandomBits, n: int) -> Any:
    v = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        todo = todo[_unit_array(bits, np.ones(todo.size, dtype=np.int64), 1)]
        v[todo] += 1
    return v


def discrete_laplace_array(bits: RandomBits, s: int, t: int, n: int) -> Any:
    """``n`` independent draws of :func:`discrete_laplace` (an int64 array, or an object array of
    Python ints if some draw does not fit in 62 bits)."""
    if n < _BULK:  # a few draws: the Python loop beats the numpy calls' fixed cost
        return _int_array([discrete_laplace(bits, s, t) for _ in range(n)])
    if s >= _SMALL or t >= _SMALL >> 8:
        return _object_array([discrete_laplace(bits, s, t) for _ in range(n)])
    out: Any = np.empty(n, dtype=np.int64)
    filled = 0
    reach = _SMALL // t - 1  # V below this keeps X = U + t·V in int64
    while filled < n:
        u = bits.below_array(t, _batch(n - filled))
        keep = np.flatnonzero(bernoulli_exp_array(bits, u, t))
        v = _geometric_array(bits, keep.size)
        far = v >= reach
        x: Any = u[keep] + t * np.where(far, 0, v)
        if far.any():  # (never in practice) this X needs Python integers
            x = x.astype(object)
            x[far] = [int(u[keep[i]]) + t * int(v[i]) for i in np.flatnonzero(far).tolist()]
            out = out.astype(object)
        y = x // s
        negative = (bits.words(keep.size) & np.uint64(1)).astype(bool)
        ok = ~(negative & (y == 0))
        got = np.where(negative, -y, y)[ok][:n - filled]
        out[filled:filled + got.size] = got
        filled += got.size
    return out


def _batch(need: int) -> int:
    """How many proposals to try for ``need`` accepted draws at once: 1.625·need + 16, above
    1/P(accept) for the samplers here (P >= 0.63 for the discrete Laplace's U with t >= 1 and
    its sign, >= 0.60 for ``wide_gaussian``), so one round usually suffices.

    Why the law is kept: the proposals of a round, and of successive rounds, are one sequence of
    independent trials, each accepted or not by its own exact test; the first ``need`` accepted
    in that order are independent draws of the target law (which of them are kept depends on the
    accept/reject pattern, never on their values) — the same as running the one-draw loop
    ``need`` times. Accepted proposals past ``need`` are dropped, never released.
    """
    return need + (need * 5 >> 3) + 16


def discrete_gaussian_array(bits: RandomBits, num: int, den: int, n: int) -> Any:
    """``n`` independent draws of :func:`discrete_gaussian`, as an int64 array.

    The acceptance test runs on int64 while (|Y|·t·den − num)² and 2·num·den·t²·K fit below 2^62;
    the entries (if any) whose proposal is too far out for that are finished on Python integers.
    """
    t = math.isqrt(num // den) + 1
    scale = 2 * num * den * t * t
    if n < _BULK:
        return _int_array([discrete_gaussian(bits, num, den) for _ in range(n)])
    if scale >= _SMALL >> 4 or t >= 1 << 24:
        return _object_array([discrete_gaussian(bits, num, den) for _ in range(n)])
    reach = (math.isqrt(_SMALL) - num) // (t * den)  # |Y| up to this keeps the square in int64
    out: Any = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        y = discrete_laplace_array(bits, 1, t, todo.size)
        far = np.abs(y) > reach
        near = np.where(far, 0, y).astype(np.int64)
        a = np.abs(near) * (t * den) - num
        ok = bernoulli_exp_array(bits, a * a, scale) & ~far
        for i in np.flatnonzero(far).tolist():  # the far tail, on Python integers
            ai = abs(int(y[i])) * t * den - num
            ok[i] = bernoulli_exp(bits, ai * ai, scale)
        if far[ok].any():
            out = out.astype(object)
        out[todo[ok]] = y[ok]
        todo = todo[~ok]
    return out


def _unit_square_array(bits: RandomBits, r: Any, s: int) -> Any:
    """``_unit_square`` in bulk, for an int64 array 0 <= r_i <= s."""
    out = np.empty(r.shape, dtype=bool)
    todo = np.arange(r.size)
    k = 1
    while todo.size:
        if s * k >= _SMALL:  # (never in practice: K grows past 2^22 with probability ~0)
            for i in todo.tolist():
                out[i] = _unit_square(bits, int(r[i]), s, k)
            break
        going = bits.below_array(s, todo.size) < r[todo]
        both = np.flatnonzero(going)
        going[both] = bits.below_array(s * k, both.size) < r[todo[both]]
        out[todo[~going]] = k % 2 == 1
        todo = todo[going]
        k += 1
    return out


# Entries with x >= _FAR·s are decided on Python integers, so that 2qr stays far below 2^62 in
# the bulk path: a proposal gets there with probability about e^{-126}, an output never in practice.
_FAR = 64


def wide_gaussian_array(bits: RandomBits, s: int, n: int) -> Any:
    """``n`` independent draws of :func:`wide_gaussian` (int64 when s < 2^47; Python ints
    beyond, the same algorithm)."""
    _check_even(s)
    if n < _BULK or s >= 1 << 47:
        return _int_array([wide_gaussian(bits, s) for _ in range(n)])
    out: Any = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        m = _batch(n - filled)
        y = discrete_laplace_array(bits, 1, s // 2, m)
        if y.dtype == object:  # (never in practice) a proposal beyond 2^62
            ok = np.array([_square_accept(bits, abs(abs(int(v)) - s), s) for v in y.tolist()])
            out = out.astype(object)
        else:
            x = np.abs(np.abs(y) - s)
            q, r = np.divmod(x, s)
            ok = np.ones(m, dtype=bool)
            far = np.flatnonzero(q >= _FAR)
            ok[far] = [_square_accept(bits, int(x[i]), s) for i in far.tolist()]
            near = np.flatnonzero((q > 0) & (q < _FAR))
            ok[near] = bernoulli_exp_array(bits, q[near] * q[near], 1)
            near = near[ok[near]]
            ok[near] = bernoulli_exp_array(bits, 2 * q[near] * r[near], s)
            live = np.flatnonzero(ok & (q < _FAR))
            ok[live] = _unit_square_array(bits, r[live], s)
        got = y[ok][:n - filled]  # the first accepted, in order (``_batch`` says why)
        out[filled:filled + got.size] = got
        filled += got.size
    return out


def _int_array(values: list[int]) -> Any:
    """int64 when every draw stays below 2^62 (the bound the bulk path keeps, so that adding a
    value below 2^61 cannot wrap), else Python ints."""
    if all(-_SMALL < v < _SMALL for v in values):
        return np.array(values, dtype=np.int64)
    return _object_array(values)


def _object_array(values: list[int]) -> Any:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
