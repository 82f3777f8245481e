"""``Quantile`` / ``Median``: the declared cost is what the ledger debits, bad input is typed and
changes nothing, no data reaches an error or the ledger, and the output law is the exponential
mechanism's (χ², α = 1e-6, with the 0.7×/1.3× power check and a broken variant as negative
control), plus the privacy ratio on neighbouring datasets."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.values.errors import InvalidDataError, InvalidDataTypeError
from dpbudget.mechanisms import noisy_quantiles
from dpbudget.mechanisms.quantile import Median, Quantile
from dpbudget.mechanisms.sampling import Sampler
from tests.mechanisms.stat_checks import ALPHA, chi2_with_power, epsilon_lower_bound

CANDIDATES = tuple(float(c) for c in range(11))  # 0, 1, ..., 10
DATA = [1.0, 2.0, 2.0, 3.0, 5.0, 7.0, 7.5, 9.0]


def law(data: list[float], q: float, epsilon: float) -> np.ndarray:
    """The exponential mechanism's probabilities over CANDIDATES, computed independently."""
    n = len(data)
    u = np.array([-abs(sum(x <= c for x in data) - q * n) for c in CANDIDATES])
    w = np.exp(epsilon * (u - u.max()) / 2)
    return w / w.sum()


def draws(m: Quantile, data: list[float], n: int, seed: int) -> np.ndarray:
    sampler = Sampler(seed)
    prepared = m.prepare(data)
    counts = np.zeros(len(CANDIDATES))
    for _ in range(n):
        counts[CANDIDATES.index(m.draw(prepared, sampler))] += 1
    return counts


@pytest.mark.parametrize("q", [0.5, 0.25, 0.9])
def test_output_law_is_the_exponential_mechanism(q: float) -> None:
    m = Quantile(0.8, q=q, lower=0.0, upper=10.0, candidates=CANDIDATES)
    counts = draws(m, DATA, 30_000, seed=11)
    chi2_with_power(counts, lambda eps: law(DATA, q, eps), 0.8)


def test_negative_control_a_law_with_epsilon_not_halved_is_rejected() -> None:
    """The same test refuses the exponential mechanism written without the 2 (ε·u, not ε·u/2)."""
    from scipy import stats

    counts = draws(Quantile(0.8, q=0.5, lower=0.0, upper=10.0, candidates=CANDIDATES), DATA, 30_000, seed=12)
    assert stats.chisquare(counts, counts.sum() * law(DATA, 0.5, 1.6)).pvalue < ALPHA


def _ratio_bound(m: Quantile, x: list[float], x2: list[float], n: int, seeds: tuple[int, int],
                 candidate: int) -> float:
    cx, cx2 = draws(m, x, n, seed=seeds[0]), draws(m, x2, n, seed=seeds[1])
    return max(epsilon_lower_bound(int(cx[candidate]), int(cx2[candidate]), n),
               epsilon_lower_bound(int(cx2[candidate]), int(cx[candidate]), n))


def test_privacy_ratio_on_neighbours_is_the_laws_and_a_broken_variant_exceeds_it() -> None:
    """Removing one row changes P[output = c] by the exact law's ratio (at most e^ε): the
    Clopper–Pearson lower bound (α = 1e-6) on the most-moved candidate's log ratio stays under
    that ratio, and the exponential mechanism without its /2 — a real bug — exceeds it."""
    epsilon, n = 1.0, 40_000
    x, x2 = DATA, DATA[:-1]
    ratios = np.abs(np.log(law(x, 0.5, epsilon) / law(x2, 0.5, epsilon)))
    worst = int(np.argmax(ratios))
    assert ratios[worst] <= epsilon
    right = Quantile(epsilon, q=0.5, lower=0.0, upper=10.0, candidates=CANDIDATES)
    assert _ratio_bound(right, x, x2, n, (13, 14), worst) <= ratios[worst]
    broken = Quantile(epsilon, q=0.5, lower=0.0, upper=10.0, candidates=CANDIDATES)
    object.__setattr__(broken, "_rate", broken._rate * 2)  # ε·u instead of ε·u/2
    assert _ratio_bound(broken, x, x2, n, (15, 16), worst) > ratios[worst]


def test_declared_cost_is_what_the_ledger_debits() -> None:
    acc = Accountant(Budget(1.0), rng=0)
    m = Median(0.4, lower=0.0, upper=100.0)
    answer = acc.release(m, np.arange(100.0), dataset="d")
    assert 0.0 <= answer <= 100.0 and answer in m.candidates
    record = [e.record for e in acc.ledger.entries() if e.record["kind"] == "release"][0]
    assert record["cost"]["epsilon"] == 0.4 and record["cost"]["delta"] == 0.0
    assert record["mechanism"] == {"name": "Median", "params": {
        "epsilon": 0.4, "lower": 0.0, "upper": 100.0, "candidates": 1001, "noise": "exact"}}
    assert acc.spent("d") == Budget(0.4)


def test_refusal_and_bad_data_draw_and_debit_nothing() -> None:
    rng = np.random.default_rng(5)
    acc = Accountant(Budget(0.3), rng=rng)
    state = rng.bit_generator.state
    with pytest.raises(BudgetExceededError):
        acc.release(Quantile(0.5, q=0.5, lower=0.0, upper=1.0), [0.5])
    for bad, error in [([1.0, math.nan], InvalidDataError), ("abc", InvalidDataTypeError),
                       ([[1.0], [2.0]], InvalidDataTypeError), ([True, False], InvalidDataTypeError),
                       (None, InvalidDataTypeError), ([1 + 2j], InvalidDataTypeError)]:
        with pytest.raises(error) as caught:
            acc.release(Quantile(0.1, q=0.5, lower=0.0, upper=1.0), bad)
        assert caught.value.argument == "value"
    assert rng.bit_generator.state == state
    assert list(acc.ledger.entries())[1:] == []  # only the policy record


def test_errors_never_show_the_data() -> None:
    secret = 123456.789
    with pytest.raises(InvalidDataError) as caught:
        Median(1.0, lower=0.0, upper=1.0).prepare([secret, math.nan])
    assert "123456" not in str(caught.value) and "value[1] is nan" in str(caught.value)
    acc = Accountant(Budget(1.0), rng=0)
    acc.release(Median(1.0, lower=0.0, upper=1e6), [secret] * 5)
    assert all("123456" not in e.text for e in acc.ledger.entries())


@pytest.mark.parametrize("kwargs, error, argument", [
    ({"epsilon": 0.0}, InvalidArgumentError, "epsilon"),
    ({"epsilon": math.inf}, InvalidArgumentError, "epsilon"),
    ({"q": 1.5}, InvalidArgumentError, "q"),
    ({"q": -0.1}, InvalidArgumentError, "q"),
    ({"q": "half"}, InvalidTypeError, "q"),
    ({"lower": 5.0, "upper": 1.0}, InvalidArgumentError, "upper"),
    ({"upper": math.nan}, InvalidArgumentError, "upper"),
    ({"bins": 0}, InvalidArgumentError, "bins"),
    ({"bins": 2.5}, InvalidTypeError, "bins"),
    ({"candidates": [3.0, 2.0]}, InvalidArgumentError, "candidates[1]"),
    ({"candidates": [1.0, 1.0]}, InvalidArgumentError, "candidates[1]"),
    ({"candidates": [11.0]}, InvalidArgumentError, "candidates[0]"),
    ({"candidates": ["a"]}, InvalidTypeError, "candidates[0]"),
    ({"candidates": {1.0, 2.0}}, InvalidTypeError, "candidates"),
    ({"candidates": []}, InvalidArgumentError, "candidates"),
])
def test_bad_constructions_are_typed(kwargs: dict[str, Any], error: type, argument: str) -> None:
    params: dict[str, Any] = {"epsilon": 1.0, "q": 0.5, "lower": 0.0, "upper": 10.0, **kwargs}
    with pytest.raises(error) as caught:
        Quantile(params.pop("epsilon"), q=params.pop("q"), lower=params.pop("lower"),
                 upper=params.pop("upper"), **params)
    assert caught.value.argument == argument


def test_values_outside_the_bounds_are_clamped_and_pandas_is_accepted() -> None:
    pd = pytest.importorskip("pandas")
    m = Quantile(50.0, q=1.0, lower=0.0, upper=10.0, candidates=CANDIDATES)
    acc = Accountant(None, rng=1)
    assert acc.release(m, pd.Series([-5.0, 3.0, 1e9])) == 10.0  # the max, clamped to upper


def test_empty_data_picks_uniformly_and_extremes_are_exact() -> None:
    m = Quantile(1.0, q=0.0, lower=0.0, upper=10.0, candidates=CANDIDATES)
    assert m.scores(m.prepare([])) == [0] * len(CANDIDATES)
    big = Quantile(200.0, q=0.0, lower=0.0, upper=10.0, candidates=CANDIDATES)
    assert Accountant(None, rng=2).release(big, [4.0] * 50) in (0.0, 1.0, 2.0, 3.0)


def test_noisy_quantiles_are_one_batch_all_or_nothing() -> None:
    acc = Accountant(Budget(1.0), rng=3)
    acc.release(Median(0.5, lower=0.0, upper=1.0), [0.5], dataset="d")
    with pytest.raises(BudgetExceededError):
        noisy_quantiles(acc, DATA, [0.25, 0.5, 0.75], 0.0, 10.0, epsilon=0.9, dataset="d")
    assert acc.spent("d") == Budget(0.5)
    out = noisy_quantiles(acc, DATA, [0.25, 0.75], 0.0, 10.0, epsilon=0.5, dataset="d")
    assert len(out) == 2 and all(0.0 <= v <= 10.0 for v in out)
    assert acc.spent("d").epsilon == pytest.approx(1.0)
