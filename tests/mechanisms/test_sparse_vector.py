"""Sparse vector: docs/theory.md §3 vectors, the broken variants being impossible, the session
contract (one debit, no further debit, cutoff, close record, bad input changes nothing), every
noise draw against its claimed law, and the empirical privacy loss on neighbouring streams."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import integrate, stats

from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
    MechanismExhaustedError,
)
from dpbudget.mechanisms import Laplace, StreamMechanism
from dpbudget.accountant.values.errors import InvalidDataError
from dpbudget.mechanisms.sampling import Sampler
from dpbudget.mechanisms.sparse_vector import (
    AboveThreshold, NumericSparse, Sparse, above_threshold_accuracy,
)
from tests.mechanisms.stat_checks import (
    ALPHA, binom_with_power, epsilon_lower_bound, ks_with_power, laplace_cdf,
)
from tests.support import records

REL = 1e-9


def snapshot(acc: Accountant, rng: np.random.Generator) -> tuple:
    return ([e.hash for e in acc.ledger.entries()], json.dumps(rng.bit_generator.state))


# -- docs/theory.md vectors ----------------------------------------------------------------------------

def test_accuracy_vector_dwork_roth_3_24():
    assert above_threshold_accuracy(1000, 0.05, 1.0) == pytest.approx(84.77307786, rel=REL)
    assert above_threshold_accuracy(1000, 0.05, 0.5, 2.0) == pytest.approx(4 * 84.77307786, rel=REL)


@pytest.mark.parametrize("eps, delta", [(1.0, 1.0), (0.5, 1.0), (0.1, 3.0)])
def test_above_threshold_scales(eps, delta):
    m = AboveThreshold(epsilon=eps, threshold=0.0, sensitivity=delta)
    assert m.threshold_scale == pytest.approx(2 * delta / eps, rel=REL)
    assert m.query_scale == pytest.approx(4 * delta / eps, rel=REL)
    assert m.threshold_scale >= 2 * delta / eps and m.query_scale >= 4 * delta / eps  # round up
    assert m.cost == Budget(eps) and m.max_positives == 1


@pytest.mark.parametrize("c", [1, 2, 3, 10, 100])
@pytest.mark.parametrize("monotonic", [False, True])
def test_default_split_lyu_su_li(c, monotonic):
    m = Sparse(epsilon=1.0, threshold=5.0, max_positives=c, monotonic=monotonic, sensitivity=1.0)
    ratio = (c if monotonic else 2 * c) ** (2 / 3)
    assert m.epsilon_queries / m.epsilon_threshold == pytest.approx(ratio, rel=REL)
    assert m.epsilon_threshold + m.epsilon_queries <= 1.0
    assert m.epsilon_threshold + m.epsilon_queries == pytest.approx(1.0, rel=REL)
    assert m.threshold_scale == pytest.approx(1 / m.epsilon_threshold, rel=REL)
    per_query = c if monotonic else 2 * c
    assert m.query_scale == pytest.approx(per_query / m.epsilon_queries, rel=REL)
    assert m.cost == Budget(1.0)


def test_explicit_split_and_numeric_shares():
    m = Sparse(epsilon=0.9, threshold=0.0, max_positives=4, sensitivity=2.0, split=(1, 2))
    assert m.epsilon_threshold == pytest.approx(0.3, rel=REL)
    assert m.epsilon_queries == pytest.approx(0.6, rel=REL)
    assert m.query_scale == pytest.approx(2 * 4 * 2.0 / 0.6, rel=REL)
    n = NumericSparse(epsilon=1.0, threshold=0.0, max_positives=3, sensitivity=1.0)
    assert n.epsilon_answers == pytest.approx(0.5, rel=REL)
    assert n.epsilon_queries / n.epsilon_threshold == pytest.approx(6 ** (2 / 3), rel=REL)
    assert n.epsilon_threshold + n.epsilon_queries + n.epsilon_answers <= 1.0
    assert n.answer_scale == pytest.approx(3 / n.epsilon_answers, rel=REL)


def test_shares_never_sum_above_epsilon():
    for eps in (0.1, 0.3, 1 / 3, 0.7, 1.1, 2.9):
        for split in ((1, 1), (1, 3), (0.1, 0.7), (1, 2 ** (2 / 3))):
            m = Sparse(eps, threshold=0.0, max_positives=1, split=split, sensitivity=1.0)
            from fractions import Fraction
            assert Fraction(m.epsilon_threshold) + Fraction(m.epsilon_queries) <= Fraction(eps)


def test_sparse_accuracy_bound():
    at = AboveThreshold(epsilon=1.0, threshold=0.0, sensitivity=1.0)
    alpha = at.accuracy(1000, 0.05)
    assert alpha == pytest.approx((6 * math.log(40) + 4 * math.log(1000)), rel=REL)
    assert alpha <= above_threshold_accuracy(1000, 0.05, 1.0)
    sp = Sparse(epsilon=1.0, threshold=0.0, max_positives=5, sensitivity=1.0)
    assert sp.accuracy(100, 0.1) == pytest.approx(
        sp.threshold_scale * math.log(20) + sp.query_scale * math.log(2000), rel=REL)


# -- the broken variants cannot be built ----------------------------------------------------------

@pytest.mark.parametrize("bad", [None, 0, -1, 1.5, math.inf, math.nan, True, "3"])
def test_no_cutoff_is_impossible(bad):
    with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
        Sparse(epsilon=1.0, threshold=0.0, max_positives=bad, sensitivity=1.0)
    assert info.value.argument == "max_positives"


def test_query_noise_always_carries_c_and_cannot_be_changed():
    m = Sparse(epsilon=1.0, threshold=0.0, max_positives=7, split=(1, 1), sensitivity=1.0)
    assert m.query_scale == pytest.approx(2 * 7 / 0.5, rel=REL)
    with pytest.raises(TypeError):
        Sparse(epsilon=1.0, threshold=0.0, max_positives=7, query_scale=4.0, sensitivity=1.0)  # no such knob
    for attr in ("query_scale", "max_positives", "threshold_scale", "epsilon"):
        with pytest.raises(AttributeError):
            setattr(m, attr, 1.0)


@pytest.mark.parametrize("kwargs, argument", [
    (dict(epsilon=math.nan, threshold=0.0, max_positives=1), "epsilon"),
    (dict(epsilon=0.0, threshold=0.0, max_positives=1), "epsilon"),
    (dict(epsilon=1.0, threshold=math.nan, max_positives=1), "threshold"),
    (dict(epsilon=1.0, threshold=math.inf, max_positives=1), "threshold"),
    (dict(epsilon=1.0, threshold="10", max_positives=1), "threshold"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, sensitivity=-1.0), "sensitivity"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, monotonic=1), "monotonic"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, split=(1.0,)), "split"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, split=(1.0, 0.0)), "split[1]"),
    (dict(epsilon=1.0, threshold=0.0, max_positives=1, split=(1.0, math.nan)), "split[1]"),
])
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
        Sparse(**{"sensitivity": 1.0, **kwargs})
    assert info.value.argument == argument
    assert repr(kwargs.get(argument.split("[")[0])) in str(info.value) or "[" in argument


# -- sessions -------------------------------------------------------------------------------------


def test_cutoff_after_c_positives_and_after_close():
    acc = Accountant(Budget(1.0), rng=3)
    svt = acc.session(Sparse(epsilon=0.5, threshold=0.0, max_positives=2, sensitivity=1.0))
    assert svt.test(1e6) and svt.test(-1e6) is False and svt.test(1e6)
    with pytest.raises(MechanismExhaustedError, match="cutoff of 2") as info:
        svt.test(1e6)
    assert (info.value.answered, info.value.positives) == (3, 2)
    assert not svt.closed
    svt.close()
    svt.close()  # idempotent: one close record
    assert [r["kind"] for r in records(acc)] == ["session", "session-close"]
    with pytest.raises(MechanismExhaustedError, match="closed"):
        svt.test(0.0)
    assert acc.spent() == Budget(0.5)


def test_error_in_block_still_closes_and_records():
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(ZeroDivisionError):
        with acc.session(AboveThreshold(epsilon=0.5, threshold=1e9, sensitivity=1.0)) as svt:
            svt.test(1.0)
            1 / 0
    assert svt.closed and records(acc)[-1]["answered"] == 1


def test_accepts_real_numbers_of_any_type():
    acc = Accountant(Budget(1.0), rng=0)
    with acc.session(Sparse(epsilon=1.0, threshold=-1e9, max_positives=10, sensitivity=1.0)) as s:
        assert all(s.test(v) for v in (1, 2.5, np.float32(3), np.int64(4)))


def test_refusals_change_nothing():
    rng = np.random.default_rng(5)
    acc = Accountant(Budget(1.0), rng=rng)
    acc.session(AboveThreshold(epsilon=0.5, threshold=0.0, sensitivity=1.0)).close()
    before = snapshot(acc, rng)
    with pytest.raises(InvalidTypeError):
        acc.release(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), 3.0)  # not a one-shot mechanism
    with pytest.raises(InvalidTypeError):
        acc.session(Laplace(epsilon=0.1, sensitivity=1.0))
    with pytest.raises(InvalidTypeError):
        acc.session("AboveThreshold")
    with pytest.raises(BudgetExceededError):
        acc.session(AboveThreshold(epsilon=0.6, threshold=0.0, sensitivity=1.0))
    with pytest.raises(InvalidTypeError):
        acc.session(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), dataset=3)
    with pytest.raises(InvalidArgumentError):
        acc.session(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), label="")
    assert snapshot(acc, rng) == before
    assert acc.spent() == Budget(0.5)


def test_unknown_dataset_is_refused_before_anything():
    acc = Accountant(limits={"adult": Budget(1.0)}, rng=0)
    with pytest.raises(InvalidArgumentError):
        acc.session(AboveThreshold(epsilon=0.1, threshold=0.0, sensitivity=1.0), dataset="census")
    assert records(acc) == []


def test_no_true_value_in_the_ledger():
    acc = Accountant(Budget(1.0), rng=0)
    secret = 123456.789
    with acc.session(NumericSparse(epsilon=1.0, threshold=-1e9, max_positives=1, sensitivity=1.0)) as s:
        s.query(secret)
    assert "123456" not in "".join(e.text for e in acc.ledger.entries())


def test_stream_mechanisms_are_exported_and_documented():
    from dpbudget import accountant
    from dpbudget import mechanisms
    for name in ("AboveThreshold", "Sparse", "NumericSparse", "StreamMechanism",
                 "above_threshold_accuracy", "Exponential", "ReportNoisyMax", "PermuteAndFlip",
                 "RandomizedResponse"):
        assert name in mechanisms.__all__ and getattr(mechanisms, name).__doc__
    for name in ("MechanismExhaustedError", "Session", "NumericSession"):
        assert name in accountant.__all__ and getattr(accountant, name).__doc__
    assert issubclass(Sparse, StreamMechanism)


def test_sparse_vector_refuses_a_query_that_is_not_a_double() -> None:
    acc = Accountant(Budget(10.0), rng=0)
    with acc.session(Sparse(1.0, threshold=0.0, max_positives=3, sensitivity=1.0)) as s:
        with pytest.raises(InvalidDataError):
            s.test(2 ** 60 + 1)
        assert s.answered == 0


# -- every noise draw of the family against its claimed law (α = 1e-6, 0.7×/1.3× power checks);
# streams opened as ``Accountant.session`` opens them after the debit -----------------------------

N = 20_000


def sampler(seed: int) -> Sampler:
    return Sampler(np.random.default_rng(seed))


def grid_step(mechanism) -> float:
    """Exact streams hold their noise in grid steps (integers); float streams in real units."""
    return mechanism._g if mechanism.noise == "exact" else 1.0


def threshold_noise(stream, mechanism) -> float:
    """ρ in real units: the noisy threshold less the (rounded) public threshold."""
    if mechanism.noise == "exact":
        g = mechanism._g
        return (stream._noisy_threshold - round(mechanism.threshold / g)) * g
    return stream._noisy_threshold - mechanism.threshold


# The three threshold mechanisms whose noise laws are checked below.
EACH_THRESHOLD_MECHANISM = pytest.mark.parametrize("mechanism", [
    AboveThreshold(epsilon=0.5, threshold=10.0, sensitivity=2.0),
    Sparse(epsilon=1.0, threshold=0.0, max_positives=5, sensitivity=1.0),
    Sparse(epsilon=1.0, threshold=0.0, max_positives=5, monotonic=True, sensitivity=1.0),
], ids=["above-threshold", "sparse", "sparse-monotonic"])


@pytest.mark.statistical
@EACH_THRESHOLD_MECHANISM
def test_threshold_noise_is_laplace_drawn_once_per_session(mechanism):
    s = sampler(101)
    rho = np.array([threshold_noise(mechanism._open(s), mechanism) for _ in range(N)])
    ks_with_power(rho, laplace_cdf, mechanism.threshold_scale)


@pytest.mark.statistical
@EACH_THRESHOLD_MECHANISM
def test_query_noise_is_laplace_with_c(mechanism):
    stream = mechanism._open(sampler(202))
    nu = np.array([next(stream._noise) for _ in range(N)]) * grid_step(mechanism)
    c, eps2, delta = mechanism.max_positives, mechanism.epsilon_queries, mechanism.sensitivity
    expected = (c if mechanism.monotonic else 2 * c) * delta / eps2
    assert mechanism.query_scale == pytest.approx(expected, rel=1e-9)
    ks_with_power(nu, laplace_cdf, expected)
    # successive draws are independent (lag-1 correlation ~ N(0, 1/N))
    assert abs(np.corrcoef(nu[:-1], nu[1:])[0, 1]) < 5.0 / math.sqrt(N)


@pytest.mark.statistical
def test_numeric_answers_carry_fresh_laplace_noise():
    m = NumericSparse(epsilon=1.0, threshold=-1e12, max_positives=N, sensitivity=1.0)
    stream = m._open(sampler(303))
    noise = np.array([stream.query(0.0) for _ in range(N)])
    ks_with_power(noise, laplace_cdf, m.answer_scale)
    assert m.answer_scale == pytest.approx(N / m.epsilon_answers, rel=1e-9)


def _tail_of_laplace_difference(t: float, a: float, b: float) -> float:
    """P(ν − ρ ≥ t) for ν ~ Lap(a), ρ ~ Lap(b), a ≠ b, t ≥ 0:
    (a²e^{−t/a} − b²e^{−t/b}) / (2(a² − b²))."""
    return (a * a * math.exp(-t / a) - b * b * math.exp(-t / b)) / (2 * (a * a - b * b))


@pytest.mark.statistical
def test_first_answer_probability_end_to_end():
    """Through the public ``test``: P(⊤ on the first query) for AboveThreshold, exact binomial."""
    m = AboveThreshold(epsilon=1.0, threshold=0.0, sensitivity=1.0)
    s, n, q = sampler(404), 100_000, -3.0
    hits = sum(m._open(s).test(q) for _ in range(n))
    binom_with_power(hits, n, lambda f: _tail_of_laplace_difference(-q, 4.0 * f, 2.0 * f), 1.0)


@pytest.mark.statistical
def test_accuracy_bound_holds_empirically():
    """Sparse.accuracy(k, β): the noises exceed it with probability ≤ β (one-sided binomial)."""
    m, k, beta, n = Sparse(epsilon=1.0, threshold=0.0, max_positives=3, sensitivity=1.0), 50, 0.2, 4_000
    alpha, s = m.accuracy(k, beta), sampler(505)
    failures = 0
    for _ in range(n):
        stream = m._open(s)
        worst = max(abs(next(stream._noise)) for _ in range(k)) * grid_step(m)
        failures += abs(threshold_noise(stream, m)) + worst > alpha
    assert stats.binomtest(failures, n, beta, alternative="greater").pvalue > 1e-6


# -- empirical privacy (docs/theory.md §5): a Clopper–Pearson lower bound on the privacy loss on
# neighbouring query streams stays under ε; the broken variant built here exceeds it -------------

EPS, C, M, T = 1.0, 3, 3, 0.0
X = np.zeros(M + C)
X_PRIME = np.concatenate([np.full(M, 1.0), np.full(C, -1.0)])
PATTERN = np.array([False] * M + [True] * C)


def pattern_probability(queries: np.ndarray, b_t: float, b_q: float) -> float:
    """P(⊥^m ⊤^c) under Lyu–Su–Li Alg. 1 with threshold scale b_t and query scale b_q, exactly
    (one-dimensional quadrature over the threshold noise)."""
    def integrand(r):
        cdf = stats.laplace.cdf(T + r - queries, scale=b_q)
        return stats.laplace.pdf(r, scale=b_t) * np.prod(cdf[:M]) * np.prod(1 - cdf[M:])
    return integrate.quad(integrand, -80 * b_t, 80 * b_t, limit=500, points=[0.0])[0]


def hits_real_sessions(mechanism: Sparse, queries: np.ndarray, n: int, seed: int) -> int:
    sampler = Sampler(np.random.default_rng(seed))
    qs, target = [float(q) for q in queries], [False] * M + [True] * C
    hits = 0
    for _ in range(n):
        stream, answers = mechanism._open(sampler), []
        for q in qs:  # ask until the stream halts at its cutoff
            answers.append(stream.test(q))
            if stream.positives == mechanism.max_positives:
                break
        hits += answers == target
    return hits


def hits_simulated(queries: np.ndarray, b_t: float, b_q: float, n: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    rho = rng.laplace(0.0, b_t, size=(n, 1))
    nu = rng.laplace(0.0, b_q, size=(n, queries.size))
    # the pattern has exactly c ⊤, all at the end, so the cutoff does not change whether it occurs
    return int(((queries + nu >= T + rho) == PATTERN).all(axis=1).sum())


@pytest.fixture(scope="module")
def ours():
    return Sparse(epsilon=EPS, threshold=T, max_positives=C, sensitivity=1.0)


@pytest.mark.statistical
def test_our_sparse_stays_under_its_epsilon(ours):
    n = 100_000
    k_x = hits_real_sessions(ours, X, n, seed=1)
    k_y = hits_real_sessions(ours, X_PRIME, n, seed=2)
    bound = epsilon_lower_bound(k_x, k_y, n)
    assert bound < EPS, (k_x, k_y, bound)
    assert bound > 0.0  # the event does separate the neighbours: the test is not vacuous
    # and the real stream has Alg. 1's law (exact binomial against quadrature)
    for k, queries in ((k_x, X), (k_y, X_PRIME)):
        p = pattern_probability(queries, ours.threshold_scale, ours.query_scale)
        assert stats.binomtest(k, n, p).pvalue > ALPHA


@pytest.mark.statistical
def test_broken_variant_without_c_exceeds_epsilon(ours):
    n = 1_000_000
    b_t, b_q = ours.threshold_scale, 2.0 * 1.0 / ours.epsilon_queries  # no c: the bug
    k_x = hits_simulated(X, b_t, b_q, n, seed=3)
    k_y = hits_simulated(X_PRIME, b_t, b_q, n, seed=4)
    bound = epsilon_lower_bound(k_x, k_y, n)
    assert bound > EPS, (k_x, k_y, bound)
    for k, queries in ((k_x, X), (k_y, X_PRIME)):
        assert stats.binomtest(k, n, pattern_probability(queries, b_t, b_q)).pvalue > ALPHA


@pytest.mark.statistical
def test_simulation_with_our_scales_also_stays_under(ours):
    """The same vectorized simulator, given the scales our Sparse declares, agrees (so the only
    difference in the broken run is the missing c)."""
    n = 1_000_000
    k_x = hits_simulated(X, ours.threshold_scale, ours.query_scale, n, seed=5)
    k_y = hits_simulated(X_PRIME, ours.threshold_scale, ours.query_scale, n, seed=6)
    assert 0.0 < epsilon_lower_bound(k_x, k_y, n) < EPS
