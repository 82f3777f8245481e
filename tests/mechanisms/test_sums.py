"""Exact sums (issue 29, item 6): the true answer of every summing helper — ``clamped_sum``,
``noisy_mean``, ``group_by`` sums and means, ``PTRMean``, ``SampleAndAggregate`` — is the exact
sum of the clamped values, rounded once by the Laplace grid, so the sensitivity the noise is
calibrated for holds for the value actually released.

Each path has the attack: a neighbouring pair whose float sums (the former code, re-created here)
differ by more than the sensitivity — by more than the Δ/g + 1 grid steps the noise parameter
t = ⌈(Δ/g + 1)/ε⌉ covers — while the exact sums stay within it; and a spy on the grid showing
the value released is the exact (rational) sum, which the float sum is not (the control that the
case is not vacuous).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.values.errors import InvalidDataError
from dpbudget.mechanisms import AnalyticGaussian, Laplace, ProposeTestRelease, SampleAndAggregate
from dpbudget.mechanisms.grid import LaplaceGrid
from dpbudget.mechanisms.group_by import group_by
from dpbudget.mechanisms.noisy import noisy_mean
from dpbudget.mechanisms.queries import true_clamped_sum
from dpbudget.mechanisms.sums import exact_sum, exact_sums, integer_sum
from tests.support import snapshot

U40 = 2.0 ** 40  # clamping range [0, 2^40] at ε = 1: the Laplace grid step is then g = 1


def rational_sum(values: Any) -> Fraction:
    """The reference: every double as its exact rational, summed by Python."""
    return sum((Fraction(v) for v in np.asarray(values, dtype=np.float64).tolist()), Fraction(0))


def grid_steps(a: Any, b: Any, mechanism: Laplace) -> int:
    """|round(a/g) − round(b/g)|: how far apart the grid puts two answers, exactly."""
    assert mechanism.grid is not None
    g = Fraction(mechanism.grid.granularity)
    return abs(round(Fraction(a) / g) - round(Fraction(b) / g))


def calibrated_steps(mechanism: Laplace) -> Fraction:
    """Δ/g + 1: the most grid steps apart two neighbours' answers may be for the declared ε."""
    assert mechanism.grid is not None
    return Fraction(mechanism.sensitivity) / Fraction(mechanism.grid.granularity) + 1


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every value handed to a Laplace grid (what the noise is added to)."""
    seen: list[Any] = []
    original = LaplaceGrid.release

    def release(self: LaplaceGrid, bits: Any, value: Any) -> Any:
        seen.append(value)
        return original(self, bits, value)

    monkeypatch.setattr(LaplaceGrid, "release", release)
    return seen


def adversarial_rows(seed: int = 0) -> np.ndarray:
    """2^16 rows in [0, 2^40], the first at the upper bound: without it, np.sum moves by 2^40 + 8
    (8 grid steps more than the sensitivity); the exact sum by 2^40. (Seed 0; checked below.)"""
    rows = np.random.default_rng(seed).uniform(0.0, U40, 2 ** 16)
    rows[0] = U40
    return rows


# -- the exact sum itself -----------------------------------------------------------------------

def test_exact_sum_is_the_rational_sum_across_the_whole_double_range() -> None:
    rng = np.random.default_rng(29)
    for _ in range(300):
        n = int(rng.integers(0, 60))
        exponents = rng.integers(-1100, 1000, n).astype(np.float64)
        x = rng.normal(0.0, 1.0, n) * np.exp2(exponents)
        x = np.where(np.isfinite(x), x, 1.0)  # (a few overflow to inf: keep them finite)
        assert exact_sum(x) == rational_sum(x)
    tiny = np.array([5e-324, 1e308, -1e308, 5e-324])  # subnormals below doubles near the top
    assert exact_sum(tiny) == Fraction(2) * Fraction(5e-324)
    assert float(np.sum(tiny)) != 2 * 5e-324  # (the float sum loses one)


def test_integer_sum_is_exact_past_int64() -> None:
    """The block sums DP-SGD and the exact sums share: 5000 entries near 2^53 sum past 2^63."""
    rows = np.full((5000, 2), 2.0 ** 53 - 1)
    rows[:, 1] *= -1
    assert integer_sum(rows) == [5000 * (2 ** 53 - 1), -5000 * (2 ** 53 - 1)]
    assert integer_sum(np.zeros((0, 3))) == [0, 0, 0]


def test_exact_sums_per_group() -> None:
    rows = adversarial_rows()
    index = np.arange(rows.size) % 4 - 1  # groups 0, 1, rows of −1 and 2 (both ignored)
    assert exact_sums(rows, index, 2) == [rational_sum(rows[index == 0]),
                                          rational_sum(rows[index == 1])]
    rng = np.random.default_rng(6)
    for _ in range(100):
        n = int(rng.integers(0, 40))
        x = rng.normal(0.0, 1.0, n) * np.exp2(rng.integers(-1100, 1000, n).astype(np.float64))
        x = np.where(np.isfinite(x), x, -1.0)
        groups = rng.integers(0, 3, n)
        assert exact_sums(x, groups, 3) == [rational_sum(x[groups == j]) for j in range(3)]


# -- clamped_sum and noisy_mean -------------------------------------------------------------------

def test_clamped_sum_neighbours_stay_within_the_sensitivity() -> None:
    rows = adversarial_rows()
    mech = Laplace(1.0, sensitivity=true_clamped_sum(rows, 0.0, U40).l1_sensitivity)
    assert mech.sensitivity == U40 and mech.grid is not None and mech.grid.granularity == 1.0
    with_row, without = true_clamped_sum(rows, 0.0, U40).value, true_clamped_sum(rows[1:], 0.0, U40).value
    assert with_row == rational_sum(rows) and without == rational_sum(rows[1:])
    assert with_row - without == U40
    assert grid_steps(with_row, without, mech) <= calibrated_steps(mech)
    # Negative control: the former float sum moves by more than the sensitivity, and by more
    # grid steps than the noise is calibrated for.
    old, old_without = float(np.sum(rows)), float(np.sum(rows[1:]))
    assert old - old_without == U40 + 8
    assert grid_steps(old, old_without, mech) == calibrated_steps(mech) + 7


def test_a_centred_sum_is_exact_about_the_exact_midpoint() -> None:
    """lower + upper is not a double here: the old code's float midpoint was off by 0.5."""
    lo, hi = -1.0, 2.0 ** 53 + 2.0
    rows = np.array([hi, 3.0, hi])
    q = true_clamped_sum(rows, lo, hi, centred=True)
    assert q.value == rational_sum(rows) - 3 * (Fraction(lo) + Fraction(hi)) / 2
    assert float(np.sum(rows - (lo + hi) / 2.0)) != q.value  # control: the float one is not
    assert q.l1_sensitivity == (hi - lo) / 2 >= (Fraction(hi) - Fraction(lo)) / 2


def test_noisy_mean_releases_the_exact_sum(spy: list[Any]) -> None:
    rows = adversarial_rows()
    acc = Accountant(Budget(10.0), rng=3)
    noisy_mean(acc, rows, 0.0, U40, epsilon=1.0)
    count, total = spy
    expected = rational_sum(rows) - rows.size * Fraction(U40) / 2
    assert count == float(rows.size) and total == expected
    assert Fraction(float(np.sum(rows - U40 / 2))) != expected  # control: the old input
    assert acc.spent() == Budget(1.0)


def test_clamped_sum_value_released_through_laplace_is_exact(spy: list[Any]) -> None:
    rows = adversarial_rows()
    q = true_clamped_sum(rows, 0.0, U40)
    Accountant(Budget(1.0), rng=3).release(Laplace(1.0, sensitivity=q.l1_sensitivity), q.value)
    assert spy == [rational_sum(rows)] and Fraction(float(np.sum(rows))) != spy[0]


# -- group_by -------------------------------------------------------------------------------------

@pytest.mark.parametrize("statistic", ["sum", "mean"])
def test_group_by_releases_exact_sums(spy: list[Any], statistic: str) -> None:
    rows = adversarial_rows()
    keys = np.where(np.arange(rows.size) % 2 == 0, "a", "b").tolist()
    acc = Accountant(Budget(10.0), rng=3)
    group_by(acc, keys, ["a", "b"], epsilon=1.0, statistic=statistic, values=rows,
             lower=0.0, upper=U40)
    sums = [rational_sum(rows[0::2]), rational_sum(rows[1::2])]
    index = np.arange(rows.size) % 2
    if statistic == "sum":
        assert list(spy[0]) == sums
        old = np.bincount(index, weights=rows)
    else:
        counts = [rows[0::2].size, rows[1::2].size]
        assert list(spy[1]) == [s - c * Fraction(U40) / 2 for s, c in zip(sums, counts)]
        old = np.bincount(index, weights=rows - U40 / 2)
    released = spy[-1]
    assert any(Fraction(float(o)) != r for o, r in zip(old, released))  # control


def test_group_by_sum_neighbours_stay_within_the_sensitivity() -> None:
    rows = adversarial_rows(2)  # (a seed where bincount's running sum moves by 2^40 + 8)
    index = np.zeros(rows.size, dtype=np.int64)
    mech = Laplace(1.0, sensitivity=U40)  # group_by's Δ₁ for sums under add/remove: max(|L|, |U|)
    new = exact_sums(rows, index, 1)[0], exact_sums(rows[1:], index[1:], 1)[0]
    assert grid_steps(*new, mech) <= calibrated_steps(mech)
    old = (np.bincount(index, weights=rows)[0], np.bincount(index[1:], weights=rows[1:])[0])
    assert grid_steps(*old, mech) > calibrated_steps(mech)  # negative control: the old sums


# -- PTRMean and SampleAndAggregate: values near 2^50, where a double's last place is 1/4 ----------

L50, U50 = 2.0 ** 50, 2.0 ** 50 + 1.0


def near_2_50(n: int, seed: int, width: float = 1.0) -> np.ndarray:
    """n values in [2^50, 2^50 + width]: multiples of 1/4, the doubles' spacing there."""
    return L50 + np.random.default_rng(seed).integers(0, int(4 * width) + 1, n) / 4.0


def test_ptr_mean_releases_the_exact_mean_and_neighbours_stay_within_the_bound(
        spy: list[Any]) -> None:
    upper = L50 + 64.0
    rows = near_2_50(2 ** 14, 1, 64.0)  # (a seed where the float means differ by 1/4)
    rows[0] = upper
    bound = 2.0 ** -4  # local sensitivity (U − L)/n = 2^-8 here: far from any that exceeds it
    m = ProposeTestRelease(1.0, delta=1e-6, bound=bound, statistic="mean", lower=L50, upper=upper)
    out = Accountant(Budget(1.0, 1e-5), rng=0).release(m, rows)
    assert isinstance(out, float)
    exact = rational_sum(rows) / rows.size
    assert spy == [exact] and Fraction(float(np.sort(rows).mean())) != exact  # control
    answer = Laplace(0.5, sensitivity=bound)  # what PTR releases the mean with
    new = exact, rational_sum(rows[1:]) / (rows.size - 1)
    assert abs(new[0] - new[1]) <= Fraction(upper - L50) / rows.size
    assert grid_steps(*new, answer) <= calibrated_steps(answer)
    old = float(np.sort(rows).mean()), float(np.sort(rows[1:]).mean())
    assert abs(old[0] - old[1]) > bound  # negative control: the float mean breaks the bound
    assert grid_steps(*old, answer) > calibrated_steps(answer)


def test_sample_and_aggregate_releases_the_exact_mean(spy: list[Any]) -> None:
    answers: list[float] = []

    def first(rows: np.ndarray) -> float:  # records what it answers (test only: not pure)
        answers.append(float(rows[0]) if len(rows) else L50)
        return answers[-1]

    k = 2 ** 12
    m = SampleAndAggregate(1.0, function=first, chunks=k, lower=L50, upper=U50)
    Accountant(Budget(1.0), rng=0).release(m, near_2_50(2 ** 14, 2))
    exact = rational_sum(answers) / k
    assert len(answers) == k and spy == [exact]
    old = 0.0
    for a in answers:  # the former code: a running float total
        old += a
    assert Fraction(old / k) != exact  # control


def test_sample_and_aggregate_neighbours_stay_within_the_sensitivity() -> None:
    """One chunk's answer moves from lower to upper: the mean may move by (U − L)/k."""
    k = 2 ** 12
    answers = near_2_50(k, 12)  # (a seed where the running float total moves by 2^10)
    answers[-1] = L50
    moved = answers.copy()
    moved[-1] = U50
    mech = Laplace(1.0, sensitivity=(U50 - L50) / k)
    new = exact_sum(answers) / k, exact_sum(moved) / k
    assert new[1] - new[0] == Fraction(U50 - L50) / k
    assert grid_steps(*new, mech) <= calibrated_steps(mech)

    def old(values: np.ndarray) -> float:
        total = 0.0
        for a in values.tolist():
            total += a
        return total / k

    assert abs(old(moved) - old(answers)) > mech.sensitivity  # negative control
    assert grid_steps(old(answers), old(moved), mech) > calibrated_steps(mech)


# -- Laplace and exact rationals ------------------------------------------------------------------

def test_laplace_rounds_a_rational_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the noise set to 0, the output is round(x/g)·g of the rational x itself: 2^60 + ½ + a
    hair rounds up to 2^60 + 1, where its nearest double (2^60) would give 2^60."""
    mech = Laplace(1.0, sensitivity=1.0)
    assert mech.grid is not None
    g = Fraction(mech.grid.granularity)
    x = (2 ** 60 + Fraction(1, 2) + Fraction(1, 2 ** 80)) * g
    monkeypatch.setattr("dpbudget.mechanisms.grid.discrete_laplace_array",
                        lambda bits, s, t, size: np.zeros(size, dtype=np.int64))
    out = Accountant(Budget(1.0), rng=0).release(mech, x)
    assert out == float((2 ** 60 + 1) * g) and float(x) == float(2 ** 60 * g)
    vector = np.empty(2, dtype=object)
    vector[:] = [x, -x]
    out = Accountant(Budget(1.0), rng=0).release(mech, vector)
    assert out.tolist() == [float((2 ** 60 + 1) * g), -float((2 ** 60 + 1) * g)]


def test_a_rational_beyond_the_grid_is_refused_before_the_debit() -> None:
    mech = Laplace(1.0, sensitivity=1.0)
    assert mech.grid is not None
    acc = Accountant(Budget(1.0), rng=0)
    before = snapshot(acc.ledger)
    with pytest.raises(InvalidDataError, match="at most"):
        acc.release(mech, Fraction(mech.grid.limit) * 2)
    assert acc.spent() == Budget(0.0) and snapshot(acc.ledger) == before


def test_float_noise_takes_the_nearest_double() -> None:
    mech = Laplace(1.0, sensitivity=1.0, noise="float")
    assert mech.prepare(Fraction(1, 3)) == 1 / 3
    vector = np.empty(2, dtype=object)
    vector[:] = [Fraction(1, 3), Fraction(2)]
    assert mech.prepare(vector).tolist() == [1 / 3, 2.0]


def test_the_gaussian_grid_rounds_a_rational_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's path: a clamped sum released with ``AnalyticGaussian``. With the noise set
    to 0 the output is round(x/g)·g of the exact sum, not of its nearest double."""
    rows = adversarial_rows()
    q = true_clamped_sum(rows, 0.0, U40)
    mech = AnalyticGaussian(1.0, delta=1e-7, sensitivity=q.l2_sensitivity)
    assert mech.grid is not None
    g = Fraction(mech.grid.granularity)
    monkeypatch.setattr("dpbudget.mechanisms.gaussian_grid.wide_gaussian_array",
                        lambda bits, s, size: np.zeros(size, dtype=np.int64))
    out = Accountant(Budget(1.0, 1e-6), rng=0).release(mech, q.value)
    assert out == float(round(rational_sum(rows) / g) * g)
    x = (2 ** 60 + Fraction(1, 2) + Fraction(1, 2 ** 80)) * g  # rounds up; its double does not
    out = Accountant(Budget(1.0, 1e-6), rng=0).release(mech, x)
    assert out == float((2 ** 60 + 1) * g) and float(x) == float(2 ** 60 * g)


def test_an_array_subclass_of_rationals_gets_its_lengths_grid_limit() -> None:
    """Found by review: a numpy array subclass (a masked array, say) of Fractions was held to
    the scalar's grid limit, larger than a vector's: admitted, then failing after the debit."""
    from dpbudget.accountant import Accountant, Budget, InvalidDataError
    from dpbudget.mechanisms import Laplace

    class Tagged(np.ndarray):
        pass

    m = Laplace(1.0, sensitivity=1.0)
    big = Fraction(m.grid.limit_for(1)) * Fraction(9, 10)
    value = np.array([big, big], dtype=object).view(Tagged)
    acc = Accountant(Budget(10.0))
    with pytest.raises(InvalidDataError):
        acc.release(m, value)
    assert acc.spent() == Budget(0.0)
