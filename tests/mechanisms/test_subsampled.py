"""SubsampledGaussian, Poisson sampling and Gaussians built from their noise (issue 14)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidDataError
from dpbudget.mechanisms import AnalyticGaussian, SubsampledGaussian, analytic_gaussian_delta
from dpbudget.mechanisms.bits import RandomBits
from dpbudget.mechanisms.calibration import analytic_gaussian_epsilon
from dpbudget.mechanisms.subsampled import _tie, poisson_sample

ALPHA = 1e-6  # significance level of every statistical test here


@pytest.mark.statistical
@pytest.mark.parametrize("q", [0.01, 0.3, 2.0 ** -20, 0.1 + 2.0 ** -60])
def test_poisson_sample_rate(q: float) -> None:
    """Binomial test of the kept count at α = 1e-6, with a power check: the same test rejects
    0.7q and 1.3q (it could fail)."""
    n = 400_000 if q > 1e-4 else 4_000_000
    kept = int(poisson_sample(RandomBits(np.random.default_rng(11)), q, n).sum())
    assert stats.binomtest(kept, n, q).pvalue > ALPHA
    if q * n > 200:
        for wrong in (0.7 * q, 1.3 * q):
            assert stats.binomtest(kept, n, wrong).pvalue < ALPHA


def test_poisson_sample_ties_are_settled_exactly() -> None:
    """A word equal to ⌊q·2^64⌋ (probability 2^-64) is settled on q's further bits: the
    Bernoulli of the rest, exactly (here rest = 1/2: one more word decides)."""
    class Scripted(RandomBits):
        def __init__(self, words: list[int]) -> None:
            super().__init__(np.random.default_rng(0))
            self.script = list(words)

        def word(self) -> int:
            return self.script.pop(0)

    assert _tie(Scripted([0]), Fraction(1, 2)) is True
    assert _tie(Scripted([2 ** 63]), Fraction(1, 2)) is False
    assert _tie(Scripted([2 ** 63, 0]), Fraction(1, 2) + Fraction(1, 2 ** 65)) is True


def test_poisson_sample_half_word_ties_go_to_the_rest() -> None:
    """The mask reads 32-bit words: u < ⌊q·2^32⌋ keeps, u > drops, u = ⌊q·2^32⌋ (a tie) is the
    Bernoulli of the rest q·2^32 − ⌊q·2^32⌋ (here 2^-8: a 64-bit word below 2^56 keeps)."""
    class Scripted(RandomBits):
        def __init__(self, halves: list[int], words: list[int]) -> None:
            super().__init__(np.random.default_rng(0))
            self.halves, self.script = halves, list(words)

        def _half_words(self, n: int) -> np.ndarray:
            return np.array(self.halves[:n], dtype=np.uint32)

        def word(self) -> int:
            return self.script.pop(0)

    top = 2 ** 31
    bits = Scripted([top, top, top - 1, top + 1], [0, 2 ** 56])
    assert poisson_sample(bits, 0.5 + 2.0 ** -40, 4).tolist() == [True, False, True, False]
    assert bits.script == []


def test_rows_are_clipped_and_the_noise_is_sigma() -> None:
    """q = 1 and rows far beyond the clip norm: the released sum is n·C·direction plus N(0, σ²)
    noise. KS test at α = 1e-6 of the noise against N(0, σ²); power check against 0.7σ, 1.3σ."""
    m = SubsampledGaussian(2.0, sampling_rate=1.0, sensitivity=0.5)  # σ = 1
    acc = Accountant(None, rng=3)
    rows = np.tile([30.0, 40.0], (10, 1))  # norm 50, clipped to 0.5: each row (0.3, 0.4)
    noise = np.array([acc.release(m, rows) - np.array([3.0, 4.0]) for _ in range(1500)]).ravel()
    assert stats.kstest(noise, "norm", args=(0, 1.0)).pvalue > ALPHA
    for wrong in (0.7, 1.3):
        assert stats.kstest(noise, "norm", args=(0, wrong)).pvalue < ALPHA


def test_each_release_samples_afresh_after_the_debit(monkeypatch) -> None:
    """Every release draws a new Poisson sample from the accountant's sampler, after the debit;
    a refused release draws none."""
    import dpbudget.mechanisms.subsampled as module

    masks: list[np.ndarray] = []
    real = module.poisson_sample

    def spy(bits, q, n):
        masks.append(real(bits, q, n))
        return masks[-1]

    monkeypatch.setattr(module, "poisson_sample", spy)
    acc = Accountant(Budget(1.0, 1e-6), composition="renyi", rng=5)
    m = SubsampledGaussian(1.0, sampling_rate=0.5, sensitivity=1.0)
    n = acc.max_releases(m)
    for _ in range(n):
        acc.release(m, np.ones((64, 1)))
    assert len(masks) == n and len({mask.tobytes() for mask in masks}) == n
    with pytest.raises(Exception):
        acc.release(m, np.ones((64, 1)))
    assert len(masks) == n


def test_declared_costs() -> None:
    m = SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=2.0, delta=1e-5)
    assert m.sigma == 2.0 and m.rho == pytest.approx(0.5) and m.mu is None
    assert m.rdp == ("poisson-discrete-gaussian", 0.01, 1.0)
    assert SubsampledGaussian(1.0, sampling_rate=0.01, noise="float", sensitivity=1.0).rdp == ("poisson-gaussian", 0.01, 1.0)
    # The declared ε is a valid conversion of the step's own curve, below the unsubsampled one.
    assert m.epsilon < analytic_gaussian_epsilon(2.0, 1e-5, 2.0)
    whole = SubsampledGaussian(1.0, sampling_rate=1.0, delta=1e-5, sensitivity=1.0)
    assert whole.epsilon == pytest.approx(analytic_gaussian_epsilon(1.0, 1e-5), rel=1e-6)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"noise_multiplier": 0.0, "sampling_rate": 0.1, "sensitivity": 1.0}, "noise_multiplier"),
    ({"noise_multiplier": 1.0, "sampling_rate": 0.0, "sensitivity": 1.0}, "sampling_rate"),
    ({"noise_multiplier": 1.0, "sampling_rate": 1.5, "sensitivity": 1.0}, "sampling_rate"),
    ({"noise_multiplier": 1.0, "sampling_rate": math.nan, "sensitivity": 1.0}, "sampling_rate"),
    ({"noise_multiplier": 1.0, "sampling_rate": 0.1, "sensitivity": -1.0}, "sensitivity"),
    ({"noise_multiplier": 1.0, "sampling_rate": 0.1, "sensitivity": 1.0, "delta": 1.0}, "delta"),
])
def test_bad_parameters_are_named(kwargs: dict, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"'{name}'"):
        SubsampledGaussian(**kwargs)


def test_bad_rows_are_refused_without_data_and_without_debit() -> None:
    acc = Accountant(Budget(3.0, 1e-5), composition="renyi", rng=0)
    m = SubsampledGaussian(1.0, sampling_rate=0.1, sensitivity=1.0)
    secret = 123456.789
    for bad in ([[1.0, math.nan], [secret, 1.0]], 3.0, np.ones((2, 2, 2)), [[secret, math.inf]]):
        with pytest.raises((InvalidDataError, InvalidArgumentError, TypeError)) as info:
            acc.release(m, bad)
        assert "123456" not in str(info.value)
    assert acc.spent() == Budget(0.0)


def test_gaussian_from_its_noise() -> None:
    m = AnalyticGaussian(sigma=3.0, delta=1e-5, sensitivity=1.5)
    assert m.sigma == 3.0 and m.rho == pytest.approx(1.5 ** 2 / 18)
    assert analytic_gaussian_delta(3.0, m.epsilon, 1.5) <= 1e-5
    assert analytic_gaussian_delta(3.0, m.epsilon * (1 - 1e-6), 1.5) > 1e-5  # smallest ε
    z = AnalyticGaussian(noise_multiplier=2.0, delta=1e-5, sensitivity=1.5)
    assert z.sigma == 3.0 and z.epsilon == m.epsilon
    odd = AnalyticGaussian(noise_multiplier=0.1, delta=1e-5, sensitivity=0.3)
    assert Fraction(odd.sigma) >= Fraction(0.1) * Fraction(0.3)  # never less noise
    with pytest.raises(InvalidArgumentError, match="given alone"):
        AnalyticGaussian(1.0, delta=1e-5, sigma=2.0, sensitivity=1.0)


# -- found by the independent review of issue 14 ------------------------------------------------

def _grid_sum(mech: SubsampledGaussian, rows: np.ndarray) -> np.ndarray:
    """The mechanism's exact integer sum of the clipped rows at q = 1 (what the noise is added to),
    in grid steps."""
    from dpbudget.mechanisms.sums import integer_sum

    clipped, _ = mech.prepare(rows)
    g = mech.grid.granularity_for(rows.shape[1])
    return np.array(integer_sum(np.rint(clipped / g)), dtype=object), g


def test_one_added_row_moves_the_sum_by_at_most_the_calibrated_sensitivity() -> None:
    """The review's attack: 2^20 rows of 1, then 2^21 rows of 0.6 ulp(2^20), plus one row of
    norm C. A float sum moved by C + 2^-12 (the rounding of the running total); the exact integer
    sum moves by at most C/g + √d/2 grid steps, inside the Δ_g = C/g + √d the noise is
    calibrated for."""
    mech = SubsampledGaussian(1.0, sampling_rate=1.0, sensitivity=1.0)
    body = np.zeros((2 ** 20 + 2 ** 21, 2))
    body[: 2 ** 20, 0] = 1.0
    body[2 ** 20:, 0] = 0.6 * 2.0 ** -32
    a, g = _grid_sum(mech, body)
    b, _ = _grid_sum(mech, np.vstack([[[-1.0, 0.0]], body]))
    moved = math.sqrt(float(sum(int(x) ** 2 for x in a - b)))
    assert moved <= 1.0 / g + math.sqrt(2) / 2
    # Negative control: the float sum of the same rows does move by more than C.
    floats = [np.sum(rows, axis=0) for rows in (body, np.vstack([[[-1.0, 0.0]], body]))]
    assert np.linalg.norm(floats[0] - floats[1]) > 1.0


def test_clipped_rows_never_exceed_the_clip_norm_exactly() -> None:
    mech = SubsampledGaussian(1.0, sampling_rate=0.5, sensitivity=1.0)
    rows = np.random.default_rng(0).normal(size=(2000, 3)) * 10.0
    clipped, _ = mech.prepare(rows)
    assert not [r for r in clipped if sum(Fraction(float(x)) ** 2 for x in r) > 1]


def test_huge_and_tiny_rows_are_clipped_not_zeroed() -> None:
    mech = SubsampledGaussian(1.0, sampling_rate=0.5, sensitivity=1.0)
    clipped, _ = mech.prepare(np.array([[1e200, 0.0], [0.5, 0.0], [1e-300, 1e-300]]))
    assert 0.99 < clipped[0, 0] <= 1.0 and clipped[1, 0] == 0.5 and clipped[2, 0] == 1e-300


# -- issue 29, item 7: the step's noise from the source's pool -----------------------------------

def test_a_steps_noise_comes_from_the_sources_pool_and_stops_with_the_release() -> None:
    """The pool belongs to the accountant's source, not to the mechanism: a step run through
    ``Sampler.once`` takes its 31 draws from the source's pool (4,096 made, 31 taken per step),
    and the one-shot sampler it was handed takes nothing once the release has returned."""
    from dpbudget.accountant.values.errors import SamplerSpentError
    from dpbudget.mechanisms.sampling import Sampler

    mech = SubsampledGaussian(2.0, sampling_rate=0.05, sensitivity=1.0)
    assert mech.grid is not None
    key = ("wide_gaussian", mech.grid.noise_s(31))
    source = Sampler(5)
    prepared = mech.prepare(np.random.default_rng(0).normal(size=(455, 31)))
    kept = []
    for step in range(1, 4):
        source.once(lambda v, s: kept.append(s) or mech.draw(v, s), prepared)
        assert len(source.bits._pools[key]) == 4096 - 31 * step
    with pytest.raises(SamplerSpentError):
        kept[0].bits.pooled_many(key, 31, lambda: [0] * 31)
    assert len(source.bits._pools[key]) == 4096 - 31 * 3


def test_the_vector_conversion_rounds_as_to_float() -> None:
    """``_noisy_on_grid`` (int64) gives to_float(t + z, g) bit for bit, at the ties of the
    int64 → double conversion (2^53 + 1, 2^62 − 1), signs, and an overflow to ±inf."""
    from dpbudget.mechanisms.grid import to_float
    from dpbudget.mechanisms.subsampled import _noisy_on_grid

    t = np.array([2 ** 53 + 1, -(2 ** 53) - 3, 2 ** 62 - 1, -(2 ** 62) + 1, 0, 7], dtype=np.int64)
    z = np.array([0, 0, 2 ** 61, -(2 ** 61), -5, 2 ** 54 + 1], dtype=np.int64)
    for g in (2.0 ** -37, 1.0, 2.0 ** 1000):
        want = [to_float(int(a) + int(b), g) for a, b in zip(t.tolist(), z.tolist())]
        assert _noisy_on_grid(t, z, g).tolist() == want
        assert _noisy_on_grid(t.astype(object), z, g).tolist() == want


def test_integer_sum_in_one_chunk_and_in_many_agree() -> None:
    """The int64 path (one chunk) and the chunked Python-int path give the same exact sums."""
    from dpbudget.mechanisms.subsampled import _integer_sum

    rows = np.random.default_rng(3).integers(-2 ** 52, 2 ** 52, size=(3000, 4)).astype(float)
    chunked = _integer_sum(rows)  # 3000 · 2^52 > 2^62: several chunks, Python ints
    assert chunked.dtype == object
    assert chunked.tolist() == [sum(int(x) for x in col) for col in rows.T]
    small = rows[:500] / 2 ** 20  # 500 · 2^32 < 2^62: one int64 chunk
    assert _integer_sum(np.rint(small)).dtype == np.int64
    assert _integer_sum(np.rint(small)).tolist() == [sum(int(x) for x in col)
                                                     for col in np.rint(small).T]
