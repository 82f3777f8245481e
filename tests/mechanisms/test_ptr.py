"""``ProposeTestRelease``: a dataset at distance 0 passes the test with probability at most δ
(exactly, and empirically: binomial test at α = 1e-6 with a power check, and the course notes'
threshold as a negative control that the same test catches), the distances are those of their
theorems (checked against brute force), the whole (ε, δ) is debited — also when the test refuses —
and bad input is typed, shows no data and changes nothing."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.mechanisms.ptr import PTRMean, PTRMedian, PTRRefused, ProposeTestRelease
from dpbudget.mechanisms.sampling import Sampler
from tests.mechanisms.stat_checks import ALPHA


def pass_probability_at_distance_zero(epsilon: float, threshold: float) -> float:
    """P[γ + Z > T] at γ = 0 for the test's discrete Laplace Z of rate ε/2 (T an integer)."""
    rate = epsilon / 2
    return math.exp(-rate * (math.floor(threshold) + 1)) / (1 + math.exp(-rate))


@pytest.mark.parametrize("epsilon, delta", [(1.0, 1e-5), (0.1, 1e-6), (2.0, 1e-9), (0.5, 0.05)])
def test_distance_zero_passes_with_probability_at_most_delta(epsilon: float, delta: float) -> None:
    m = ProposeTestRelease(epsilon, delta=delta, bound=1.0, statistic="median", lower=0.0, upper=1.0)
    assert pass_probability_at_distance_zero(epsilon, m.threshold) <= delta
    # The course notes' threshold ln(2/δ)/(2ε) (with the test's noise Lap(1/ε)) does not:
    notes = 0.5 * math.exp(-epsilon * math.log(2 / delta) / (2 * epsilon))
    assert notes == pytest.approx(0.5 * math.sqrt(delta / 2)) and notes > delta


def _pass_rate(m: ProposeTestRelease, data: list[float], n: int, seed: int) -> int:
    sampler = Sampler(seed)
    prepared = m.prepare(data)
    return sum(not isinstance(m.draw(prepared, sampler), PTRRefused) for _ in range(n))


class _NotesThreshold(ProposeTestRelease):
    """The broken variant: the course notes' threshold ln(2/δ)/(2ε₁), rounded the same way."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        object.__setattr__(self, "threshold",
                           math.ceil(math.log(2 / self.delta) / (2 * (self.epsilon / 2))))


def test_empirical_pass_rate_at_distance_zero() -> None:
    """Data whose median has local sensitivity above b already (γ = 0): the test passes at the
    exact rate (binomial, α = 1e-6); the notes' threshold passes far more often and is caught."""
    epsilon, delta, n = 1.0, 0.02, 40_000
    data = [0.0] * 10 + [100.0] * 11  # the median sits at a jump of 100
    m = ProposeTestRelease(epsilon, delta=delta, bound=1.0, statistic="median", lower=0.0, upper=100.0)
    assert m.statistic.distance(m.prepare(data), 1.0, 10) == 0
    k = _pass_rate(m, data, n, seed=21)
    exact = pass_probability_at_distance_zero(epsilon, m.threshold)
    assert stats.binomtest(k, n, exact).pvalue > ALPHA
    assert stats.binomtest(k, n, 3 * exact).pvalue < ALPHA  # power: a 3× leak would show
    broken = _NotesThreshold(epsilon, delta=delta, bound=1.0, statistic="median",
                             lower=0.0, upper=100.0)
    k_broken = _pass_rate(broken, data, n, seed=22)
    assert stats.binomtest(k_broken, n, delta, alternative="greater").pvalue < ALPHA


def _median_ls(x: list[float]) -> float:
    """The local sensitivity of the lower median under replace-one, by brute force on a grid of
    replacement values (the extremes suffice: the median moves furthest to a bound)."""
    n = len(x)

    def med(v: list[float]) -> float:
        return sorted(v)[(n + 1) // 2 - 1]

    base = med(x)
    return max(abs(med(x[:i] + [r] + x[i + 1:]) - base) for i in range(n) for r in (0.0, 10.0))


def test_median_distance_matches_brute_force() -> None:
    """min{k : some dataset within k replacements has local sensitivity > b}, by brute force over
    replacements with the bounds, on small datasets."""
    rng = np.random.default_rng(3)
    stat = PTRMedian(lower=0.0, upper=10.0)
    for _ in range(20):
        x = sorted(float(v) for v in rng.integers(0, 11, size=5))
        for b in (0.5, 2.0, 4.0):
            frontier, k = {tuple(x)}, 0
            while k < 5 and all(_median_ls(list(v)) <= b for v in frontier):
                frontier = {tuple(sorted(v[:i] + (r,) + v[i + 1:])) for v in frontier
                            for i in range(5) for r in (0.0, 10.0) + tuple(v)}
                k += 1
            assert stat.distance(np.array(x), b, 5) == k, (x, b)


def test_mean_distance_is_rows_to_remove() -> None:
    stat = PTRMean(lower=0.0, upper=10.0)
    # B(m) = 10/m <= b needs m >= 10/b: for b = 2, m >= 5.
    for n, expected in [(0, 0), (4, 0), (5, 1), (6, 2), (100, 50)]:
        assert stat.distance(np.zeros(n), 2.0, 50) == expected
    assert stat.distance(np.zeros(7), 3.0, 50) == 4  # m >= 10/3, so m >= 4


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_mean_local_sensitivity_is_range_over_n(n: int) -> None:
    """By brute force over datasets of n values in {L, U} (the extremes are the worst case) and
    every neighbour: LS = (U − L)/n exactly — the bound PTRMean's distance rests on."""
    worst = 0.0
    for x in itertools.product((0.0, 10.0), repeat=n):
        base = np.mean(x)
        removals = [abs(np.mean(x[:i] + x[i + 1:]) - base) for i in range(n)]
        additions = [abs(np.mean(x + (v,)) - base) for v in (0.0, 10.0)]
        worst = max(worst, *removals, *additions)
    assert worst == pytest.approx(10.0 / n, rel=1e-12)


def test_median_distance_ties_are_decided_exactly() -> None:
    """A gap that is just above the bound but rounds to it: the distance is 0, not the cap."""
    stat = PTRMedian(lower=-2.0 ** -60, upper=1.0)
    assert stat.distance(np.array([-2.0 ** -60, 1.0]), 1.0, 10) == 0


def test_a_statistic_that_raises_never_escapes_after_the_debit() -> None:
    class Fragile(PTRMedian):
        def distance(self, ordered: np.ndarray, bound: float, cap: int) -> int:
            raise ValueError(f"secret {ordered[0]}")

    acc = Accountant(Budget(1.0, 1e-5), rng=2)
    result = acc.release(ProposeTestRelease(1.0, delta=1e-6, bound=1.0, statistic=Fragile(lower=0.0, upper=10.0)), [5.0] * 9)
    assert isinstance(result, (PTRRefused, float))  # the test ran on a distance of 0
    assert acc.spent() == Budget(1.0, 1e-6)


def test_the_whole_cost_is_debited_also_when_refused() -> None:
    acc = Accountant(Budget(2.0, 1e-5), rng=0)
    m = ProposeTestRelease(1.0, delta=1e-6, bound=0.1, statistic="mean", lower=0.0, upper=100.0)
    result = acc.release(m, [50.0] * 3)  # three rows: far too few for b = 0.1
    assert isinstance(result, PTRRefused) and not result
    assert "50" not in repr(result)
    assert acc.spent() == Budget(1.0, 1e-6)
    answer = acc.release(m, list(np.linspace(0, 100, 5001)))
    assert isinstance(answer, float) and 45 <= answer <= 55
    assert acc.spent() == Budget(2.0, 2e-6)
    costs = [e.record["cost"] for e in acc.ledger.entries() if e.record["kind"] == "release"]
    assert costs == [{"epsilon": 1.0, "delta": 1e-6, "rho": None, "mu": None}] * 2


@pytest.mark.parametrize("kwargs, error, argument", [
    ({"statistic": "mode"}, InvalidArgumentError, "statistic"),
    ({"statistic": 3}, InvalidTypeError, "statistic"),
    ({"lower": None}, InvalidArgumentError, "lower"),
    ({"delta": 0.0}, InvalidArgumentError, "delta"),
    ({"delta": 1.0}, InvalidArgumentError, "delta"),
    ({"bound": -1.0}, InvalidArgumentError, "bound"),
    ({"epsilon": math.nan}, InvalidArgumentError, "epsilon"),
    ({"upper": 1e300}, InvalidArgumentError, "upper"),
])
def test_bad_constructions_are_typed(kwargs: dict[str, object], error: type,
                                     argument: str) -> None:
    params: dict[str, object] = {"epsilon": 1.0, "delta": 1e-6, "bound": 1.0,
                                 "statistic": "median", "lower": 0.0, "upper": 10.0, **kwargs}
    with pytest.raises(error) as caught:
        ProposeTestRelease(**params)  # type: ignore[arg-type]
    assert caught.value.argument == argument



def test_brute_force_helper_sanity() -> None:
    assert _median_ls([0.0, 0.0, 10.0]) == 10.0  # replacing a 0 by 10 moves the median by 10
    assert _median_ls([0.0, 5.0, 10.0]) == 5.0
