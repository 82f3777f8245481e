"""Exact Gaussian noise on floats (mechanisms.gaussian_grid): Lemma G checked against a
high-precision computation, the calibration re-derived independently with mpmath, the wide discrete
Gaussian sampler against its pmf (with a power check), the float attack, and the refusals."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError, MechanismNotAllowedError
from dpbudget.mechanisms import AnalyticGaussian, Gaussian
from dpbudget.mechanisms import exact
from dpbudget.mechanisms.bits import RandomBits
from dpbudget.mechanisms.exact import wide_gaussian, wide_gaussian_array
from dpbudget.mechanisms.gaussian_grid import tv_bound
from tests.mechanisms.test_grid import EPSILON, measured_losses

mpf = mpmath.mpf


def _tv_exact(sigma: float) -> mpmath.mpf:
    """TV(N_Z(0, σ²), round(N(0, σ²))), summed to |k| <= 40σ at 40 digits."""
    with mpmath.workdps(40):
        s = mpf(sigma)
        ks = range(-int(40 * sigma) - 5, int(40 * sigma) + 6)
        w = [mpmath.exp(-mpf(k) ** 2 / (2 * s * s)) for k in ks]
        theta = mpmath.fsum(w)
        r = [mpmath.ncdf((k + mpf(1) / 2) / s) - mpmath.ncdf((k - mpf(1) / 2) / s) for k in ks]
        return mpmath.fsum(abs(a / theta - b) for a, b in zip(w, r)) / 2


@pytest.mark.parametrize("sigma", [2.0, 2.5, 4.0, 8.0, 16.0])
def test_lemma_g_holds_and_is_not_vacuous(sigma: float) -> None:
    """TV <= 1/(5σ²) (the module's Lemma G); the true value is about 0.02/σ², so the bound is
    within a factor 12 of it, not an empty statement."""
    tv = _tv_exact(sigma)
    assert tv <= tv_bound(sigma, 1)
    assert tv >= tv_bound(sigma, 1) / 12
    assert tv_bound(sigma, 7) >= 7 * tv


def test_lemma_g_is_refused_below_its_range() -> None:
    with pytest.raises(ValueError, match="sigma >= 2"):
        tv_bound(1.5, 1)


def _delta_bw(sigma: mpmath.mpf, sens: mpmath.mpf, eps: float) -> mpmath.mpf:
    """Balle–Wang Thm 8 at 60 digits: Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ)."""
    a = sens / (2 * sigma)
    b = mpf(eps) * sigma / sens
    return mpmath.ncdf(a - b) - mpmath.exp(eps) * mpmath.ncdf(-a - b)


@pytest.mark.parametrize(("make", "n", "extra"), [
    (lambda: AnalyticGaussian(1.0, delta=1e-5, sensitivity=1.0), 1, 1e-9),
    (lambda: AnalyticGaussian(1.0, delta=1e-5, sensitivity=1.0), 1000, 1e-7),
    (lambda: AnalyticGaussian(0.05, delta=1e-9, sensitivity=3.0), 10 ** 6, 1e-5),
    (lambda: AnalyticGaussian(8.0, delta=1e-3, sensitivity=0.01), 7, 1e-7),
    (lambda: AnalyticGaussian(1.0, delta=1e-14, sensitivity=1.0), 10 ** 6, 1e-5),
    # near the end of the range (the TV term is then ~half of δ): still safe, 0.07% noisier
    (lambda: AnalyticGaussian(1.0, delta=1e-14, sensitivity=1.0), 10 ** 8, 1e-3),
    (lambda: Gaussian(0.5, delta=1e-6, sensitivity=2.0), 1, 1e-9),
    (lambda: Gaussian(0.9, delta=1e-5, sensitivity=1.0), 4096, 1e-7),
    # extreme parameters take a finer grid: the extra noise stays small
    (lambda: Gaussian(1e-12, delta=1e-5, sensitivity=1.0), 1, 2e-5),
    (lambda: AnalyticGaussian(1e-9, delta=1e-10, sensitivity=1.0), 10 ** 6, 2e-5),
    (lambda: AnalyticGaussian(1.0, delta=1e-23, sensitivity=1.0), 1, 2e-5),
    (lambda: AnalyticGaussian(1.0, delta=1e-300, sensitivity=1.0), 1, 2e-5),
    (lambda: AnalyticGaussian(45.0, delta=1e-5, sensitivity=1.0), 1, 2e-5),
    (lambda: AnalyticGaussian(710.0, delta=0.4, sensitivity=1.0), 1, 1e-4),
    (lambda: AnalyticGaussian(1.0, delta=1e-5, sensitivity=1e-200), 3, 2e-5),
])
def test_calibration_keeps_the_declared_cost(make, n: int, extra: float) -> None:
    """Recomputed independently at 60 digits from the sampler's integer s: the grid release of n
    entries is (ε, δ_BW(σ_g, Δ_g) + (1 + e^ε)·n/(5σ_g²))-DP with that at most the declared δ, its
    zCDP ρ = Δ_g²/(2σ_g²) at most the declared ρ, and its noise exceeds σ by at most ``extra``
    (relative)."""
    m = make()
    s = m.grid.noise_s(n)
    assert s % 2 == 0
    with mpmath.workdps(60):
        g = mpf(m.grid.granularity_for(n))
        sigma_g = mpf(s) / mpmath.sqrt(2)
        d_g = mpf(m.sensitivity) / g + mpmath.sqrt(n)
        delta = _delta_bw(sigma_g, d_g, mpf(m.epsilon)) + (1 + mpmath.exp(m.epsilon)) * n / (
            5 * sigma_g ** 2)
        assert delta <= mpf(m.delta)
        assert d_g ** 2 / (2 * sigma_g ** 2) <= mpf(m.rho)
        assert sigma_g * g / mpf(m.sigma) <= 1 + mpf(extra)
        assert sigma_g * g >= mpf(m.sigma)


def test_no_double_grid_is_refused_before_the_debit() -> None:
    """ε = 700, δ = 1e-300 at sensitivity 2^-59: a scalar fits on a grid near 2^-1070, but 10^6
    entries would need one below 2^-1074. A typed refusal naming the value (not showing it),
    nothing drawn, nothing debited; where not even a scalar fits, construction is refused."""
    acc = Accountant(Budget(1000.0, 0.5), rng=1)
    m = AnalyticGaussian(700.0, delta=1e-300, sensitivity=2.0 ** -59)
    assert m.grid.fits(1) and not m.grid.fits(10 ** 6)
    values = np.full(10 ** 6, 3.25)
    with pytest.raises(InvalidDataError) as info:
        acc.release(m, values)
    assert info.value.argument == "value" and "3.25" not in str(info.value)
    assert "noise='float'" in str(info.value)
    assert acc.spent() == Budget(0.0)
    assert acc.release(m, 1e-16) is not None  # a grid of 2^-1071 holds only tiny values
    with pytest.raises(InvalidArgumentError, match="parameters"):
        AnalyticGaussian(700.0, delta=1e-300, sensitivity=1e-100)
    assert AnalyticGaussian(700.0, delta=1e-300, sensitivity=1e-100, noise="float").sigma > 0


def test_extreme_delta_still_releases_exactly() -> None:
    """δ = 1e-300 needs σ_g ~ 2^500 grid steps: the Python-integer sampler takes over."""
    m = AnalyticGaussian(1.0, delta=1e-300, sensitivity=1.0)
    out = Accountant(None, rng=2).release(m, np.zeros(3))
    g = m.grid.granularity_for(3)
    assert np.all(out / g == np.floor(out / g)) and np.all(np.abs(out) < 60 * m.sigma)


def test_values_beyond_the_grid_are_refused_before_the_debit() -> None:
    acc = Accountant(Budget(10.0, 0.5), rng=1)
    m = AnalyticGaussian(1.0, delta=1e-5, sensitivity=1.0)
    big = m.grid.limit_for(2) * 2
    with pytest.raises(InvalidDataError) as info:
        acc.release(m, np.array([0.0, big]))
    assert repr(big) not in str(info.value)
    assert acc.spent() == Budget(0.0)


def _pmf(s: int, ys: np.ndarray) -> np.ndarray:
    p = np.exp(-(ys.astype(float) ** 2) / (s * s))
    return p / p.sum()


def _chi2_pvalue(draws: np.ndarray, s: int) -> float:
    ys = np.arange(-8 * s, 8 * s + 1)
    p = _pmf(s, ys)
    counts = np.array([(draws == y).sum() for y in ys])
    keep = p * draws.size >= 5
    observed = np.append(counts[keep], draws.size - counts[keep].sum())
    expected = np.append(p[keep] * draws.size, draws.size * (1 - p[keep].sum()))
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.statistical
@pytest.mark.parametrize("s", [2, 6, 20])
def test_wide_gaussian_matches_its_pmf(s: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """χ² of 100,000 bulk and 30,000 scalar draws against P(y) ∝ exp(−y²/s²), α = 1e-4 each
    (fixed seeds), and of 30,000 bulk draws with every entry sent down the far path (decided on
    Python integers from the same state). Power: the same test rejects the pmf of s + 2 for those
    very draws."""
    bits = RandomBits(np.random.default_rng(s))
    bulk = wide_gaussian_array(bits, s, 100_000)
    scalar = np.array([wide_gaussian(bits, s) for _ in range(30_000)])
    monkeypatch.setattr(exact, "_FAR", 0)
    far = wide_gaussian_array(bits, s, 30_000)
    assert bulk.dtype == np.int64
    for draws in (bulk, scalar, far):
        assert _chi2_pvalue(draws, s) > 1e-4
    assert _chi2_pvalue(bulk, s + 2) < 1e-4


@pytest.mark.parametrize("s", [0, 1, 3, 7, 2.0])
def test_wide_gaussian_refuses_a_parameter_off_its_law(s: object) -> None:
    with pytest.raises(ValueError, match="even integer"):
        wide_gaussian(RandomBits(None), s)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="even integer"):
        wide_gaussian_array(RandomBits(None), s, 100)  # type: ignore[arg-type]


class _Words(RandomBits):
    """Half-words given in advance (to hit the rejection boundary of ``below_array``)."""

    def __init__(self, halves: list[int]) -> None:
        super().__init__(np.random.default_rng(0))
        self._queue = list(halves)

    def _half_words(self, n: int) -> np.ndarray:
        out, self._queue = self._queue[:n], self._queue[n:]
        return np.array(out, dtype=np.uint32)


@pytest.mark.parametrize(("m", "words", "expected"), [
    (3, [2 ** 32 - 1, 2 ** 32 - 2], [(2 ** 32 - 2) % 3]),  # 2^32 − 1 is the one rejected word
    (2 ** 32 - 1, [2 ** 32 - 1, 7], [7]),
    (2 ** 32, [2 ** 32 - 1], [2 ** 32 - 1]),  # every word accepted as it is
    (5, [0, 4, 2 ** 32 - 7], [0, 4, (2 ** 32 - 7) % 5]),
])
def test_below_array_half_words_reject_exactly_the_biased_tail(m: int, words: list[int],
                                                                 expected: list[int]) -> None:
    assert _Words(words).below_array(m, len(expected)).tolist() == expected


@pytest.mark.statistical
def test_below_array_is_uniform_where_a_modulo_bias_would_show() -> None:
    """m = 3·2^30: without rejection, r mod m would put probability 1/2 on [0, 2^30) instead of
    1/3. 200,000 draws: 1 s.e. is 0.0011, we allow 0.006 (α < 1e-7); the biased rule (0.5) is
    far outside (power)."""
    draws = RandomBits(np.random.default_rng(17)).below_array(3 * 2 ** 30, 200_000)
    share = float(np.mean(draws < 2 ** 30))
    assert abs(share - 1 / 3) < 0.006
    assert abs(0.5 - 1 / 3) > 0.006 * 20
    assert int(draws.max()) < 3 * 2 ** 30


@pytest.mark.statistical
def test_wide_gaussian_at_grid_scale_has_the_right_spread() -> None:
    """At the grid's scale (s ≈ 2^38) the bulk path stays in int64 and the sample sd is σ = s/√2
    within 1% (n = 200,000: 1 s.e. is 0.16%; α < 1e-9)."""
    s = 2 * int(2 ** 37.6)
    draws = wide_gaussian_array(RandomBits(np.random.default_rng(9)), s, 200_000)
    assert draws.dtype == np.int64
    assert float(np.std(draws.astype(float))) == pytest.approx(s / math.sqrt(2), rel=0.01)


def test_exact_gaussian_outputs_stay_on_the_grid() -> None:
    acc = Accountant(None, rng=7)
    m = AnalyticGaussian(1.0, delta=1e-5, sensitivity=1.0)
    g = m.grid.granularity
    for x in (0.0, 1.0, 0.1, -3.3, 1e6 + 0.123456789):
        outs = acc.release(m, np.full(500, x))
        assert np.all(outs / g == np.floor(outs / g)), x
        out = acc.release(m, x)
        assert out / g == math.floor(out / g)


def test_exact_gaussian_resists_the_float_attack() -> None:
    """The float-attack events of test_grid, on AnalyticGaussian(1, 1e-5): the bit events
    never fire; the only measurable loss is the honest one of "below 0" (true value 0.24)."""
    acc = Accountant(None, rng=20261122)
    m = AnalyticGaussian(EPSILON, delta=1e-5, sensitivity=1.0)
    losses = measured_losses(lambda x: acc.release(m, x))
    assert max(v for k, v in losses.items() if k != "below 0") == 0.0, losses
    assert 0.1 < losses["below 0"] <= 0.25, losses


def test_the_float_gaussian_is_caught() -> None:
    """Negative control: the textbook float Gaussian through the same API leaks on bit events."""
    acc = Accountant(None, rng=20261122)
    m = AnalyticGaussian(EPSILON, delta=1e-5, noise="float", sensitivity=1.0)
    losses = measured_losses(lambda x: acc.release(m, x))
    assert losses["in (0, 0.5), not a multiple of 2^-53"] > 4 * EPSILON, losses


def test_gaussian_rule_refuses_exact_gaussians_and_says_what_to_do() -> None:
    acc = Accountant(Budget(1.0, 1e-6), composition="gaussian", rng=0)
    with pytest.raises(MechanismNotAllowedError, match="advanced"):
        acc.release(AnalyticGaussian(0.1, delta=1e-8, sensitivity=1.0), 1.0)
    assert acc.spent() == Budget(0.0)
    adv = Accountant(Budget(1.0, 1e-6), composition="advanced", rng=0)
    exact, floating = AnalyticGaussian(0.1, delta=1e-8, sensitivity=1.0), AnalyticGaussian(0.1, delta=1e-8, noise="float", sensitivity=1.0)
    assert adv.max_releases(exact) == adv.max_releases(floating) > 10


def test_seeded_exact_gaussian_is_reproducible_and_recorded() -> None:
    a, b = Accountant(None, rng=11), Accountant(None, rng=11)
    m = AnalyticGaussian(0.5, delta=1e-6, sensitivity=2.0)
    x = np.linspace(-5, 5, 100)
    assert np.array_equal(a.release(m, x), b.release(m, x))
    record = list(a.ledger.entries())[-1].record
    assert record["noise"] == "exact-seeded"


@pytest.mark.statistical
def test_a_gradients_pooled_grid_noise_matches_the_discrete_gaussian() -> None:
    """DP-SGD's noise (issue 29, item 7): ``GaussianGrid.noise`` for a 31-entry gradient, taken
    from the source's pool, 62,000 draws at the grid's own scale (s ≈ 2^39). χ² on 24 bins of
    width σ/4 (edges on half-integers, the tails pooled) against the discrete Gaussian's bin
    probabilities — the normal CDF at the half-integer edges, exact to ~e^{−2π²σ²} at this σ —
    at α = 1e-6, with the power check at σ × 0.7 and × 1.3."""
    from dpbudget.mechanisms import SubsampledGaussian
    from tests.mechanisms.stat_checks import chi2_with_power

    grid = SubsampledGaussian(2.0, sampling_rate=0.05, sensitivity=1.0).grid
    assert grid is not None
    s = grid.noise_s(31)
    sigma = s / math.sqrt(2)
    bits = RandomBits(np.random.default_rng(2029))
    draws = np.concatenate([grid.noise(bits, 31) for _ in range(2000)])
    assert draws.dtype == np.int64 and ("wide_gaussian", s) in bits._pools
    edges = np.floor(np.arange(-12, 13) * sigma / 4) + 0.5
    counts = np.bincount(np.searchsorted(edges, draws), minlength=edges.size + 1)

    def probs(sd: float) -> np.ndarray:
        return np.diff(np.concatenate([[0.0], stats.norm.cdf(edges / sd), [1.0]]))

    chi2_with_power(counts, probs, sigma)
