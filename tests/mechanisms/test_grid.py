"""Floating-point-safe Laplace noise on a grid (``mechanisms.grid``), and the floating-point attack
(Mironov, CCS 2012) it closes, tried on our releases as an attacker would.

For two neighbouring inputs x = 0 and x = 1 (Δ = 1, ε = 1), draw many releases of each and look at
events on the bits of the output double. For each event E the Clopper–Pearson bounds (α = 1e-6 per
bound) give a lower bound on ln(P_0(E)/P_1(E)) (and the reverse). An ε-DP release keeps every such
bound at or below ε; the textbook float sampler (the ``noise="float"`` opt-out, our negative
control) must be caught far above it. The event "output below 0" has a true loss of exactly ε = 1:
the bound reaching ~0.9 on it shows the test has the power to see a loss near ε.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms import DiscreteLaplace, Laplace, ReportNoisyMax, Sparse
from dpbudget.mechanisms.grid import ceil_log2, grid_index, on_grid, to_float

ALPHA = 1e-6
N = 60_000
EPSILON = 1.0


def _multiple_of(x: float, k: int) -> bool:
    return math.ldexp(x, k) == math.floor(math.ldexp(x, k))


EVENTS: dict[str, Callable[[float], bool]] = {
    "in (0, 0.5), not a multiple of 2^-53": lambda o: 0.0 < o < 0.5 and not _multiple_of(o, 53),
    "in (-1, 1), not a multiple of 2^-52": lambda o: -1.0 < o < 1.0 and not _multiple_of(o, 52),
    "in (0, 1), not a multiple of 2^-45": lambda o: 0.0 < o < 1.0 and not _multiple_of(o, 45),
    "lowest mantissa bit set": lambda o: o != 0.0 and math.frexp(o)[0] * 2 ** 53 % 2 == 1,
    "below 0": lambda o: o < 0.0,
}


def _lower_bound_loss(hits_a: int, hits_b: int, n: int) -> float:
    """A lower bound (confidence 1 − 2α) on ln(P_a(E)/P_b(E)) from hit counts out of n each."""
    if hits_a == 0:
        return 0.0
    low_a = stats.beta.ppf(ALPHA, hits_a, n - hits_a + 1)
    high_b = 1.0 if hits_b == n else stats.beta.ppf(1 - ALPHA, hits_b + 1, n - hits_b)
    return max(0.0, math.log(low_a / high_b))


def measured_losses(release: Callable[[float], float]) -> dict[str, float]:
    outs = {x: [release(x) for _ in range(N)] for x in (0.0, 1.0)}
    losses = {}
    for name, event in EVENTS.items():
        hits = {x: sum(map(event, outs[x])) for x in outs}
        losses[name] = max(_lower_bound_loss(hits[0.0], hits[1.0], N),
                           _lower_bound_loss(hits[1.0], hits[0.0], N))
    return losses


def test_exact_laplace_leaks_no_more_than_its_epsilon() -> None:
    acc = Accountant(None, rng=20261122)
    m = Laplace(EPSILON, sensitivity=1.0)
    losses = measured_losses(lambda x: acc.release(m, x))
    assert max(losses.values()) <= EPSILON, losses
    assert losses["below 0"] > 0.8, losses  # power: a true loss of exactly ε is seen


def test_the_float_opt_out_is_caught() -> None:
    """Negative control: the textbook float sampler, released through the same API."""
    acc = Accountant(None, rng=20261122)
    m = Laplace(EPSILON, noise="float", sensitivity=1.0)
    losses = measured_losses(lambda x: acc.release(m, x))
    assert losses["in (0, 0.5), not a multiple of 2^-53"] > 4 * EPSILON, losses


def test_every_exact_output_is_on_the_grid() -> None:
    """Whatever the input, every output is a multiple of the grid step: the set of reachable
    doubles does not depend on the data."""
    acc = Accountant(None, rng=7)
    m = Laplace(EPSILON, sensitivity=1.0)
    g, g_vector = m.grid.granularity, m.grid.granularity_for(2000)
    assert g_vector == g / 64
    for x in (0.0, 1.0, 0.1, -3.3, 1e6 + 0.123456789):
        outs = acc.release(m, np.full(2000, x))
        assert np.all(outs / g_vector == np.floor(outs / g_vector)), x
        out = acc.release(m, x)
        assert out / g == math.floor(out / g), x


@pytest.mark.statistical
def test_a_long_vector_at_small_epsilon_gets_the_declared_scale() -> None:
    """n = 100,000 entries at ε = 10^-6: on the scalar grid the rounding widening alone would add
    n·2^-40/ε = 9% to the noise; on the vector grid it adds 0.14%. The sample sd is √2·scale
    within 2% (1 s.e. of a Laplace sd at this n is 0.35%: α < 1e-8), and the test would catch
    the scalar grid's 9% (power)."""
    m = Laplace(1e-6, sensitivity=1.0)
    t = m.grid.noise_parameter(100_000, round(math.log2(m.grid.granularity_for(100_000))))
    widened = t * m.grid.granularity_for(100_000)
    assert widened / m.scale < 1.002
    assert m.grid.noise_parameter(100_000) * m.grid.granularity / m.scale > 1.08  # scalar grid
    out = Accountant(None, rng=41).release(m, np.zeros(100_000))
    assert float(np.std(out)) / (math.sqrt(2) * m.scale) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("value", [0, 1])
def test_discrete_laplace_outputs_integers(value: int) -> None:
    acc = Accountant(None, rng=3)
    out = acc.release(DiscreteLaplace(EPSILON, sensitivity=1), np.full(1000, value))
    assert out.dtype == np.int64
    assert type(acc.release(DiscreteLaplace(EPSILON, sensitivity=1), value)) is int


SELECTION = [
    lambda noise: __import__("dpbudget.mechanisms").mechanisms.Exponential(1.0, candidates=["a", "b", "c"], noise=noise, sensitivity=1.0),
    lambda noise: __import__("dpbudget.mechanisms").mechanisms.ReportNoisyMax(1.0, candidates=["a", "b", "c"], noise=noise, sensitivity=1.0),
    lambda noise: __import__("dpbudget.mechanisms").mechanisms.PermuteAndFlip(1.0, candidates=["a", "b", "c"], noise=noise, sensitivity=1.0),
]


@pytest.mark.parametrize("make", SELECTION)
def test_selection_exact_by_default_and_float_only_on_request(make: Callable[[str], object]) -> None:
    from dpbudget.mechanisms.sampling import Sampler
    exact_m, float_m = make("exact"), make("float")
    assert exact_m.noise == "exact" and float_m.noise == "float"  # type: ignore[attr-defined]
    scores = exact_m.prepare([0.0, 3.0, 1.0])  # type: ignore[attr-defined]
    s = Sampler(5)
    for m in (exact_m, float_m):
        picks = [m.draw(scores, s) for _ in range(3000)]  # type: ignore[attr-defined]
        assert picks.count("b") > picks.count("c") > picks.count("a") > 0


def test_exponential_terminates_when_one_score_dominates() -> None:
    from dpbudget.mechanisms import Exponential
    acc = Accountant(None, rng=1)
    m = Exponential(1.0, candidates=list(range(200)), sensitivity=1.0)
    assert acc.release(m, [0.0] * 199 + [1e6]) == 199


def test_report_noisy_max_refuses_scores_off_its_grid() -> None:
    from dpbudget.accountant.values.errors import InvalidDataError
    from dpbudget.mechanisms import ReportNoisyMax
    acc = Accountant(Budget(1.0), rng=1)
    m = ReportNoisyMax(1.0, candidates=["a", "b"], sensitivity=1e-300)
    with pytest.raises(InvalidDataError) as e:
        acc.release(m, [1e300, 0.0])
    assert "1e+300" not in str(e.value)
    assert acc.spent().epsilon == 0.0


def test_randomized_response_exact_is_exactly_p() -> None:
    """With k = 2 and ε = ln 3 the truth has probability 3/4 exactly; 40,000 draws."""
    from dpbudget.mechanisms import RandomizedResponse
    from dpbudget.mechanisms.sampling import Sampler
    m = RandomizedResponse(math.log(3.0), categories=["y", "n"])
    s = Sampler(8)
    truthful = sum(m.draw(0, s) == "y" for _ in range(40_000))
    p = stats.binomtest(truthful, 40_000, 0.75).pvalue
    assert p > ALPHA
    assert stats.binomtest(truthful, 40_000, 0.7).pvalue < ALPHA  # power


def test_grid_parameters_are_pinned() -> None:
    """The integer noise parameters the review derived by hand (so an off-by-one in the widening
    D = ⌊Δ/g⌋ + 1 or in t cannot pass unnoticed)."""
    rnm = ReportNoisyMax(1.0, candidates=["a", "b"], sensitivity=1.0)
    assert rnm._g == 2.0 ** -39 and rnm._t == 2 ** 40 + 2
    svt = Sparse(1.0, threshold=0.0, max_positives=3, sensitivity=1.0)
    assert (svt._t_threshold, svt._t_query) == (591252379006, 1074376873452)


def test_the_released_double_is_a_function_of_the_noisy_integer_alone() -> None:
    """``on_grid``: two inputs whose grid index plus noise agree give the same double, bit for bit,
    whatever their own low bits (what closes the attack above). Negative control: the textbook
    float addition of the same noise keeps the inputs' low bits apart."""
    from fractions import Fraction

    g = 2.0 ** -10
    x = np.array([0.1, 0.30000000000000004])
    q = np.rint(x / g).astype(np.int64)
    z = np.array([int(q[1] - q[0]), 0], dtype=np.int64)  # both land on the integer q[1]
    out = on_grid(x, z, g)
    assert out[0] == out[1] == to_float(int(q[1]), g)
    assert x[0] + float(z[0]) * g != x[1] + float(z[1]) * g  # the leak on_grid removes
    # An exact rational is rounded on itself: x/g = 1/2 + 2^-70 rounds up, although its nearest
    # double is exactly half a step (which round() sends to 0, the control).
    exact = Fraction(1, 2 ** 11) + Fraction(1, 2 ** 80)
    assert grid_index(exact, g) == 1 and grid_index(float(exact), g) == 0
    # ceil_log2 is exact where the float logarithm rounds (2^60 + 1 needs 61 bits).
    assert ceil_log2(Fraction(2 ** 60 + 1)) == 61 and math.ceil(math.log2(2 ** 60 + 1)) == 60
    assert ceil_log2(Fraction(1, 3)) == -1 and ceil_log2(Fraction(2 ** 60)) == 60
