"""Private partition selection (dpbudget.mechanisms.partition_selection) and the binned quantile.

The attack: a key that only one unit creates reveals that unit when it is released. Exactly, from
the discrete Laplace law: a key of one unit — count up to L∞ rows (C with a total cap, 1 for
distinct units) — clears the threshold with probability at most δ over the number of keys one
unit can create (L0, or C), so a removed unit's keys appear with probability at most δ; a
threshold one step lower would exceed it. Empirically, with a fixed seed: the release frequency
of a lone key at its largest count agrees with the exact probability (exact binomial test,
α = 1e-6), and the same test rejects the laws of a threshold one lower, of the threshold for a
count of 1 (the distinct-unit threshold used on rows) and of noise scales 0.7× and 1.3× (power).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant.values.errors import (InvalidArgumentError, InvalidDataError,
                                               InvalidDataTypeError)
from dpbudget.mechanisms import BinnedQuantile, PartitionSelection, Quantile
from dpbudget.mechanisms.partition_selection import selection_threshold
from dpbudget.mechanisms.sampling import Sampler

ALPHA = 1e-6


def release_probability(m: PartitionSelection, count: int) -> float:
    """The oracle: P(count + Z >= threshold), the chance that a key with ``count`` (rows or
    distinct units) is released (Z discrete Laplace of the rate a ≈ ε/Δ₁ the draw uses; exact up to float
    rounding of the closed form P(Z >= m) = e^{−am}/(1 + e^{−a}) for m >= 1, by symmetry below).
    Only the tests use it: moved here from the mechanism."""
    a = m._s / m._t

    def tail(k: int) -> float:
        return math.exp(-a * k) / (1.0 + math.exp(-a))
    k = m.threshold - count
    return 1.0 - tail(1 - k) if k <= 0 else tail(k)


@pytest.mark.parametrize("eps,delta,l0", [(1.0, 1e-6, 1), (0.5, 1e-6, 20), (1.0, 1e-9, 3),
                                          (0.1, 1e-5, 2), (2.0, 0.05, 1)])
def test_a_lone_units_keys_appear_with_probability_at_most_delta(eps: float, delta: float,
                                                                   l0: int) -> None:
    m = PartitionSelection(eps, delta=delta, max_groups_per_unit=l0)
    a = eps / l0
    exact = math.exp(-a * (m.threshold - 1)) / (1 + math.exp(-a))  # P(1 + Z >= T)
    assert release_probability(m, 1) == pytest.approx(exact, rel=1e-12)
    assert l0 * release_probability(m, 1) <= delta
    # The threshold is the lowest that does: one lower releases a lone key too often.
    assert l0 * release_probability(m, 2) > delta
    # At or just above the continuous-noise threshold τ = 1 + L0·ln(1/(2δ/L0))/ε (Wilson et al.).
    tau = 1 + l0 * math.log(1 / (2 * delta / l0)) / eps
    assert tau <= m.threshold < tau + 1.5


@pytest.mark.parametrize("eps,delta,l0,linf,cap,lone,keys", [
    (1.0, 1e-6, 20, 20, 20, 20, 20),      # Q5: C = 20 rows per person; a lone key holds <= 20
    (1.0, 1e-6, 3, 5, None, 5, 3),        # L0 = 3 keys of L∞ = 5 rows: Δ₁ = 15
    (0.5, 1e-9, 4, 10, 12, 10, 4),        # C = 12 below L0·L∞: Δ₁ = 12, still 4 keys of <= 10
    (2.0, 0.05, 2, 3, None, 3, 2)])
def test_a_lone_units_row_counts_appear_with_probability_at_most_delta(
        eps: float, delta: float, l0: int, linf: int, cap: int | None, lone: int,
        keys: int) -> None:
    """The one-step count: Δ₁ = min(L0·L∞, C), a lone key's count <= min(L∞, C), at most
    min(L0, C) lone keys; their union is released with probability <= δ, and one step lower
    is not."""
    m = PartitionSelection(eps, delta=delta, max_groups_per_unit=l0, max_rows_per_group=linf,
                           max_rows_per_unit=cap)
    sensitivity = min(l0 * linf, cap or l0 * linf)
    assert m.sensitivity == sensitivity and m.scale == pytest.approx(sensitivity / eps)
    a = eps / sensitivity
    exact = math.exp(-a * (m.threshold - lone)) / (1 + math.exp(-a))  # P(lone + Z >= T)
    assert release_probability(m, lone) == pytest.approx(exact, rel=1e-12)
    assert keys * release_probability(m, lone) <= delta
    # Negative control: one step lower, the lone keys together exceed δ.
    assert keys * release_probability(m, lone + 1) > delta
    # At or just above the continuous threshold (SmartNoise's censor_dims for C rows:
    # τ = L∞ + Δ₁·ln(keys/(2δ))/ε = C·(1 − ln(2δ/C)/ε)).
    tau = lone + sensitivity * math.log(keys / (2 * delta)) / eps
    assert tau <= m.threshold < tau + 1.5


def test_rows_need_the_row_threshold_not_the_units_one() -> None:
    """Negative control for the shift: thresholding row counts with the distinct-unit threshold
    (a lone key counted as 1, not L∞) lets 20 lone keys of 20 rows out with e^{ε·19/20} ≈ 2.6
    times δ."""
    rows = PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=20, max_rows_per_group=20,
                              max_rows_per_unit=20)
    units_like = rows.threshold - (20 - 1)
    a = rows._s / rows._t
    assert 20 * math.exp(-a * (units_like - 20)) / (1 + math.exp(-a)) > 2.5 * rows.delta


def test_the_threshold_is_an_integer_above_one_for_any_delta() -> None:
    for delta in (0.4, 0.1, 1e-3, 1e-12):
        t = selection_threshold(Fraction(1), delta)
        assert t >= 2 and isinstance(t, int)


@pytest.mark.statistical
@pytest.mark.parametrize("linf", [1, 4])
def test_the_release_frequency_of_a_lone_key_is_the_exact_probability(linf: int) -> None:
    """A lone key at its largest count (L∞ rows; 1 unit): α = 1e-6, 40,000 draws."""
    m = PartitionSelection(1.0, delta=0.05, max_groups_per_unit=1, max_rows_per_group=linf)
    n = 40_000
    out = m.draw(np.full(n, linf, dtype=np.int64), Sampler(20261127))
    released = int((out > 0).sum())
    assert bool((out[out > 0] >= m.threshold).all())  # a released count clears the threshold
    p = release_probability(m, linf)
    assert p <= m.delta and stats.binomtest(released, n, p).pvalue > ALPHA
    # Power: a threshold one lower, and noise scales 0.7× and 1.3×, are each rejected.
    assert stats.binomtest(released, n, release_probability(m, linf + 1)).pvalue < ALPHA
    for factor in (0.7, 1.3):
        a = 1.0 / (linf * factor)
        wrong = math.exp(-a * (m.threshold - linf)) / (1 + math.exp(-a))
        assert stats.binomtest(released, n, wrong).pvalue < ALPHA


def test_a_key_clearing_the_threshold_releases_its_noisy_count_and_others_nothing() -> None:
    """One step: the released value is the noisy count (its noise law is checked above); a key
    below the threshold releases 0, never its noisy count."""
    m = PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=1)
    out = m.draw(m.prepare(np.array([1, 1000, 2])), Sampler(1))
    assert out.dtype == np.int64 and out[0] == 0 and out[2] == 0
    assert out[1] >= m.threshold and abs(int(out[1]) - 1000) < 40
    assert m.draw(m.prepare(np.zeros(0, dtype=np.int64)), Sampler(1)).size == 0


@pytest.mark.parametrize("bad,error", [([0, 3], InvalidDataError), ([1.5], InvalidDataTypeError),
                                       ([[1]], InvalidDataTypeError)])
def test_bad_counts_are_refused(bad: object, error: type) -> None:
    with pytest.raises(error):
        PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=1).prepare(np.array(bad))


@pytest.mark.parametrize("kwargs", [{"delta": 0.0}, {"delta": 1.0}, {"max_groups_per_unit": 0},
                                    {"max_rows_per_group": 0}, {"max_rows_per_unit": 0}])
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    given = {"delta": 1e-6, "max_groups_per_unit": 1, **kwargs}
    with pytest.raises((InvalidArgumentError, TypeError)):
        PartitionSelection(1.0, **given)  # type: ignore[arg-type]


def test_binned_quantile_with_one_row_per_unit_is_quantiles_law() -> None:
    """From bin counts, the scores are those ``Quantile`` computes from the values themselves."""
    values = np.array([0.5, 1.0, 2.2, 2.7, 3.9, 4.0, 1.1])
    q = Quantile(1.0, q=0.3, lower=0.0, upper=4.0, bins=8)
    b = BinnedQuantile(1.0, q=0.3, lower=0.0, upper=4.0, bins=8, rows_per_unit=1)
    counts = np.bincount(np.searchsorted(np.asarray(q.candidates), values, side="left"),
                         minlength=len(q.candidates))
    assert b.scores(b.prepare(counts)) == q.scores(q.prepare(values))
    assert b._rate == q._rate


def test_binned_quantile_divides_epsilon_by_the_rows_kept() -> None:
    b = BinnedQuantile(1.0, q=0.5, lower=0.0, upper=1.0, bins=4, rows_per_unit=20)
    assert b._rate == Fraction(1, 2 * 2 * 20) and b.params()["rows_per_unit"] == 20
    assert b.cost.epsilon == 1.0
    with pytest.raises(InvalidDataTypeError):
        b.prepare(np.ones(3, dtype=np.int64))  # one count per candidate (5)
    with pytest.raises(InvalidDataError):
        b.prepare(np.array([1, -1, 0, 0, 0]))
