"""Private partition selection (dpbudget.mechanisms.partition_selection) and the binned quantile.

The attack: a key that only one unit creates reveals that unit when it is released. Exactly, from
the discrete Laplace law: a key of one unit clears the threshold with probability at most δ/L0, so
the at most L0 keys of a removed unit appear with probability at most δ; a count one above (the
continuous threshold rounded down) would exceed it. Empirically, with a fixed seed: the release
frequency of a lone key agrees with the exact probability (exact binomial test, α = 1e-6), and the
same test rejects the laws of a threshold one lower and of noise scales 0.7× and 1.3× (power).
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
    """The oracle: P(count + Z >= threshold), the chance that a key with ``count`` distinct units
    is released (Z discrete Laplace of the rate a ≈ ε/L0 the draw uses; exact up to float
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


def test_the_threshold_is_an_integer_above_one_for_any_delta() -> None:
    for delta in (0.4, 0.1, 1e-3, 1e-12):
        t = selection_threshold(Fraction(1), delta)
        assert t >= 2 and isinstance(t, int)


@pytest.mark.statistical
def test_the_release_frequency_of_a_lone_key_is_the_exact_probability() -> None:
    m = PartitionSelection(1.0, delta=0.05, max_groups_per_unit=1)
    n = 40_000
    released = int(m.draw(np.ones(n, dtype=np.int64), Sampler(20261127)).sum())
    p = release_probability(m, 1)
    assert stats.binomtest(released, n, p).pvalue > ALPHA
    # Power: a threshold one lower, and noise scales 0.7× and 1.3×, are each rejected.
    assert stats.binomtest(released, n, release_probability(m, 2)).pvalue < ALPHA
    for factor in (0.7, 1.3):
        a = 1.0 / factor
        wrong = math.exp(-a * (m.threshold - 1)) / (1 + math.exp(-a))
        assert stats.binomtest(released, n, wrong).pvalue < ALPHA


def test_keys_with_many_units_are_released_and_the_draw_is_a_mask() -> None:
    m = PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=1)
    mask = m.draw(m.prepare(np.array([1, 1000, 2])), Sampler(1))
    assert mask.dtype == bool and mask.tolist()[1] is True
    assert m.draw(m.prepare(np.zeros(0, dtype=np.int64)), Sampler(1)).size == 0


@pytest.mark.parametrize("bad,error", [([0, 3], InvalidDataError), ([1.5], InvalidDataTypeError),
                                       ([[1]], InvalidDataTypeError)])
def test_bad_counts_are_refused(bad: object, error: type) -> None:
    with pytest.raises(error):
        PartitionSelection(1.0, delta=1e-6, max_groups_per_unit=1).prepare(np.array(bad))


@pytest.mark.parametrize("kwargs", [{"delta": 0.0}, {"delta": 1.0}, {"max_groups_per_unit": 0}])
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
