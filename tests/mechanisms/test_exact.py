"""The exact samplers (mechanisms.exact, CKS 2020 Alg. 1–3): exhaustive enumeration of every
random choice on small parameters, χ² tests against the exact pmf with power checks, the bulk
(numpy) path against the Python-integer path, and the fallbacks forced on."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable

import numpy as np
import pytest

from dpbudget.mechanisms import exact
from dpbudget.mechanisms.bits import RandomBits
from tests.mechanisms.stat_checks import ALPHA, chi2_with_power


class _Branch(Exception):
    def __init__(self, m: int) -> None:
        self.m = m


class _Scripted:
    """Random bits that replay a fixed sequence of choices, and ask for a branch past its end."""

    def __init__(self, path: list[int]) -> None:
        self.path, self.i = path, 0

    def below(self, m: int) -> int:
        if self.i == len(self.path):
            raise _Branch(m)
        c = self.path[self.i]
        self.i += 1
        return c

    def word(self) -> int:  # only its lowest bit is used (a fair sign)
        return self.below(2)


def enumerate_law(run: Callable[[Any], Any], depth: int) -> tuple[dict[Any, Fraction], Fraction]:
    """The exact law of ``run(bits)`` over every sequence of at most ``depth`` random choices,
    and the probability mass of the longer sequences (left undecided)."""
    law: dict[Any, Fraction] = {}
    undecided = Fraction(0)
    stack: list[tuple[list[int], Fraction]] = [([], Fraction(1))]
    while stack:
        path, weight = stack.pop()
        try:
            out = run(_Scripted(path))
        except _Branch as branch:
            if len(path) >= depth:
                undecided += weight
                continue
            stack.extend((path + [c], weight / branch.m) for c in range(branch.m))
            continue
        law[out] = law.get(out, Fraction(0)) + weight
    return law, undecided


@pytest.mark.parametrize("n, d", [(0, 1), (1, 3), (1, 2), (2, 3), (1, 1), (3, 2), (5, 2)])
def test_bernoulli_exp_is_exact_by_enumeration(n: int, d: int) -> None:
    """Every path of Alg. 1 enumerated: P(True) is e^{−n/d} up to the mass left undecided."""
    law, undecided = enumerate_law(lambda b: exact.bernoulli_exp(b, n, d), depth=9 + 2 * (n // d))
    assert undecided < 1e-3
    p_true = law.get(True, Fraction(0))
    assert float(p_true) <= math.exp(-n / d) <= float(p_true + undecided)


def test_enumeration_catches_a_broken_bernoulli() -> None:
    """Negative control: Alg. 1 with the parity flipped (K even) is told apart."""
    def broken(b: Any) -> bool:
        return not exact._unit(b, 1, 2)

    law, undecided = enumerate_law(broken, depth=9)
    assert abs(float(law[True]) - math.exp(-0.5)) > 100 * float(undecided)


@pytest.mark.parametrize("s, t", [(1, 1), (1, 2), (2, 1)])
def test_discrete_laplace_is_exact_by_enumeration(s: int, t: int) -> None:
    law, undecided = enumerate_law(lambda b: exact.discrete_laplace(b, s, t), depth=12)
    a = s / t
    for y in range(-2, 3):
        pmf = math.tanh(a / 2) * math.exp(-abs(y) * a)
        got = float(law.get(y, Fraction(0)))
        # Rejected attempts restart, so undecided mass can land on any y: a two-sided bound.
        # Every decided path is exact, so no value may ever get more than its pmf; what is missing
        # is bounded by the undecided mass.
        assert got <= pmf + 1e-12 and pmf <= got + float(undecided) + 1e-12, (y, got, pmf)
    assert sum(law.values()) + undecided == 1 and undecided < 0.45


def _dlap_pmf(support: np.ndarray, rate: float) -> np.ndarray:
    return math.tanh(rate / 2) * np.exp(-np.abs(support) * rate)


def _dgauss_pmf(support: np.ndarray, var: float) -> np.ndarray:
    w = np.exp(-(support.astype(float) ** 2) / (2 * var))
    full = np.arange(-int(40 * math.sqrt(var)) - 5, int(40 * math.sqrt(var)) + 6)
    return w / np.exp(-(full.astype(float) ** 2) / (2 * var)).sum()


def _binned(samples: np.ndarray, edge: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts on −edge..edge with the two tails pooled into the end bins."""
    clipped = np.clip(samples.astype(np.int64), -edge - 1, edge + 1)
    counts = np.bincount(clipped + edge + 1, minlength=2 * edge + 3)
    return counts, np.arange(-edge - 1, edge + 2)


def _with_tails(pmf: Callable[[np.ndarray], np.ndarray], edge: int) -> np.ndarray:
    inner = pmf(np.arange(-edge, edge + 1))
    tail = (1.0 - inner.sum()) / 2
    return np.concatenate([[tail], inner, [tail]])


def test_discrete_laplace_array_matches_its_pmf() -> None:
    bits = RandomBits(np.random.default_rng(11))
    t = 10
    samples = exact.discrete_laplace_array(bits, 1, t, 200_000)
    counts, _ = _binned(samples, 40)
    chi2_with_power(counts, lambda scale: _with_tails(lambda y: _dlap_pmf(y, 1 / scale), 40), t)


def test_discrete_laplace_scalar_matches_its_pmf() -> None:
    bits = RandomBits(np.random.default_rng(12))
    samples = np.array([exact.discrete_laplace(bits, 2, 7) for _ in range(30_000)])
    counts, _ = _binned(samples, 12)
    chi2_with_power(counts, lambda scale: _with_tails(lambda y: _dlap_pmf(y, 1 / scale), 12),
                    3.5)


def test_discrete_gaussian_array_matches_its_pmf() -> None:
    bits = RandomBits(np.random.default_rng(13))
    samples = exact.discrete_gaussian_array(bits, 100, 1, 200_000)
    counts, _ = _binned(samples, 35)
    chi2_with_power(counts, lambda s: _with_tails(lambda y: _dgauss_pmf(y, s * s), 35), 10.0)


def test_discrete_gaussian_scalar_with_a_rational_variance() -> None:
    bits = RandomBits(np.random.default_rng(14))
    samples = np.array([exact.discrete_gaussian(bits, 7, 3) for _ in range(30_000)])
    counts, _ = _binned(samples, 6)
    chi2_with_power(counts, lambda s: _with_tails(lambda y: _dgauss_pmf(y, s * s), 6),
                    math.sqrt(7 / 3))


def test_fallbacks_to_python_integers_give_the_same_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the int64 limit forced down, the rare Python-integer paths run on most entries (the
    Bernoulli counter, a whole discrete Laplace, the Gaussian's far tail) and the law holds."""
    monkeypatch.setattr(exact, "_SMALL", 1 << 14)
    bits = RandomBits(np.random.default_rng(15))
    lap = exact.discrete_laplace_array(bits, 1, 100, 20_000)  # t >= _SMALL >> 8: all Python
    counts, _ = _binned(lap, 250)
    pmf = _with_tails(lambda y: _dlap_pmf(y, 1 / 100), 250)
    from scipy import stats
    assert stats.chisquare(counts, counts.sum() * pmf).pvalue > ALPHA
    monkeypatch.setattr(exact, "_SMALL", 1 << 30)
    gauss = exact.discrete_gaussian_array(bits, 100, 1, 50_000)  # reach is small: far tail runs
    counts, _ = _binned(gauss, 35)
    assert stats.chisquare(counts, counts.sum() * _with_tails(
        lambda y: _dgauss_pmf(y, 100.0), 35)).pvalue > ALPHA


def test_small_draws_beyond_2_62_are_python_ints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exact, "discrete_laplace", lambda bits, s, t: 2 ** 62)
    out = exact.discrete_laplace_array(RandomBits(None), 1, 5, 3)
    assert out.dtype == object and out.tolist() == [2 ** 62] * 3


# -- issue 29, item 7: pooled vector draws and batched rejection rounds -------------------------

def _wide_chi2(samples: np.ndarray, s: int) -> None:
    """χ² of wide-Gaussian draws (P(y) ∝ exp(−y²/s²), σ² = s²/2) against the exact pmf at
    α = 1e-6, with the power check: the same counts reject σ × 0.7 and σ × 1.3."""
    edge = int(3.5 * s / math.sqrt(2))
    counts, _ = _binned(samples, edge)
    chi2_with_power(counts, lambda sd: _with_tails(lambda y: _dgauss_pmf(y, sd * sd), edge),
                    s / math.sqrt(2))


@pytest.mark.statistical
def test_pooled_vector_draws_match_the_pmf() -> None:
    """DP-SGD's path: 31 draws at a time from the source's pool (refilled by the bulk sampler),
    60,000 in all, against the exact discrete Gaussian pmf."""
    bits, s = RandomBits(np.random.default_rng(29)), 20

    def refill() -> list[int]:
        return list(exact.wide_gaussian_array(bits, s, 4096).tolist())

    draws = np.concatenate([bits.pooled_many(("wide_gaussian", s), 31, refill)
                            for _ in range(60_000 // 31)])
    _wide_chi2(draws, s)


@pytest.mark.statistical
def test_batched_rounds_keep_the_law_however_many_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bulk samplers try ``_batch(need)`` proposals a round and keep the first accepted in
    order. With the batch forced down to 16 (most draws need many rounds: the remainder of each
    round is the next round's ``need``) and up to 4·need (most accepted proposals dropped), the
    discrete Laplace and the wide Gaussian still match their pmfs (α = 1e-6, with power)."""
    for batch in (lambda need: 16, lambda need: 4 * need + 16):
        monkeypatch.setattr(exact, "_batch", batch)
        bits = RandomBits(np.random.default_rng(31))
        _wide_chi2(exact.wide_gaussian_array(bits, 20, 60_000), 20)
        lap = exact.discrete_laplace_array(bits, 1, 10, 60_000)
        counts, _ = _binned(lap, 40)
        chi2_with_power(counts, lambda t: _with_tails(lambda y: _dlap_pmf(y, 1 / t), 40), 10)


def test_keeping_accepted_draws_by_value_would_be_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control for the batched rounds: a sampler that kept the accepted proposals of
    smallest |y| (a choice by value, not by order) is told apart by the same χ² test."""
    bits = RandomBits(np.random.default_rng(32))
    s, n = 20, 60_000
    pool = exact.wide_gaussian_array(bits, s, 2 * n)
    by_value = pool[np.argsort(np.abs(pool), kind="stable")[:n]]
    from scipy import stats
    edge = int(3.5 * s / math.sqrt(2))
    for draws, rejected in ((by_value, True), (pool[:n], False)):
        counts, _ = _binned(draws, edge)
        expected = n * _with_tails(lambda y: _dgauss_pmf(y, s * s / 2), edge)
        assert bool(stats.chisquare(counts, expected).pvalue < ALPHA) is rejected
