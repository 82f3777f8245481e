"""Training under a budget (issue 14): every step charged, the first refusal ends training, the
planners, the estimator, and the example's accuracy target."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant,
    Budget,
    InvalidArgumentError,
    InvalidTypeError,
    LogisticRegression,
    dp_sgd,
    noise_for_steps,
    noisy_gradient_descent,
)
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.training.descent import logistic_gradients
from dpbudget.mechanisms import SubsampledGaussian

LIMIT = Budget(3.0, 1e-5)
rng = np.random.default_rng(0)
X = rng.normal(size=(200, 3))
Y = (X @ np.array([1.5, -2.0, 0.5]) > 0).astype(float)


def test_every_step_is_charged_and_the_first_refusal_ends_training(tmp_path: Path) -> None:
    location = f"sqlite:///{tmp_path / 'l.db'}"
    acc = Accountant(Budget(1.0, 1e-5), composition="renyi", ledger=location, rng=1,
                     simulation=True)
    room = acc.max_releases(SubsampledGaussian(1.0, sampling_rate=0.1, sensitivity=1.0))
    result = dp_sgd(acc, X, Y, steps=room + 50, sampling_rate=0.1, noise_multiplier=1.0,
                        batch_size=20)
    assert result.refused and result.steps == room
    releases = [r for r in acc.ledger.entries() if '"kind":"release"' in r.text]
    assert len(releases) == room
    assert acc.max_releases(SubsampledGaussian(1.0, sampling_rate=0.1, sensitivity=1.0)) == 0
    acc.close()
    assert audit(location).ok


def test_full_batch_noisy_gradient_descent_learns() -> None:
    acc = Accountant(LIMIT, composition="renyi", rng=2)
    z = noise_for_steps(acc, 50)
    result = noisy_gradient_descent(acc, X, Y, steps=50, noise_multiplier=z, learning_rate=2.0,
                                    batch_size=200)
    assert not result.refused and result.steps == 50
    x = np.hstack([X, np.ones((len(Y), 1))])
    assert np.mean((x @ result.weights > 0) == Y) > 0.9


def test_noise_for_steps_is_the_smallest_to_three_digits() -> None:
    for steps, q in [(100, 1.0), (1000, 0.01), (300, 0.2)]:
        z = noise_for_steps(LIMIT, steps, sampling_rate=q)
        rule = Accountant(LIMIT, composition="renyi")
        assert rule.max_releases(SubsampledGaussian(z, sampling_rate=q, sensitivity=1.0)) >= steps
        unit = 10.0 ** (np.floor(np.log10(z)) - 2)  # one in the third significant digit
        assert rule.max_releases(SubsampledGaussian(z - unit, sampling_rate=q, sensitivity=1.0)) < steps
    live = Accountant(LIMIT, composition="renyi", rng=0)
    before = noise_for_steps(live, 100)
    live.release(SubsampledGaussian(5.0, sampling_rate=1.0, sensitivity=1.0), np.ones((5, 1)))
    assert noise_for_steps(live, 100) > before  # planned on what is left now


def test_estimator_api_and_refusal() -> None:
    acc = Accountant(LIMIT, composition="renyi", rng=3)
    model = LogisticRegression(acc, batch_size=40, steps=40, sampling_rate=0.2,
                               learning_rate=2.0).fit(X, Y)
    assert model.steps_ == 40 and not model.refused_ and model.score(X, Y) > 0.85
    assert model.predict_proba(X[:5]).shape == (5, 2) and set(model.predict(X)) <= {0, 1}
    spent = acc.spent()
    model.score(X, Y)  # free: the model is public
    assert acc.spent() == spent
    tired = LogisticRegression(acc, batch_size=200, steps=10_000, noise_multiplier=0.5).fit(X, Y)
    assert tired.refused_ and tired.steps_ < 10_000


def test_bad_training_input_is_named_without_data() -> None:
    acc = Accountant(LIMIT, composition="renyi", rng=0)
    secret = X.copy()
    secret[7, 1] = np.nan
    with pytest.raises(InvalidArgumentError) as info:
        dp_sgd(acc, secret, Y, steps=5, sampling_rate=0.1, noise_multiplier=1.0,
                        batch_size=20)
    assert "X[7, 1]" in str(info.value) or "X[7," in str(info.value)
    with pytest.raises(InvalidArgumentError, match="'y'"):
        dp_sgd(acc, X, Y * 2, steps=5, sampling_rate=0.1, noise_multiplier=1.0,
                        batch_size=20)
    with pytest.raises(InvalidArgumentError, match="'y'"):
        dp_sgd(acc, X, Y[:-1], steps=5, sampling_rate=0.1, noise_multiplier=1.0,
                        batch_size=20)
    with pytest.raises(InvalidTypeError, match="'X'"):
        dp_sgd(acc, X[:, 0], Y, steps=5, sampling_rate=0.1, noise_multiplier=1.0,
                        batch_size=20)
    with pytest.raises(InvalidTypeError, match="'accountant'"):
        LogisticRegression("ledger.db", batch_size=1)  # type: ignore[arg-type]
    assert acc.spent() == Budget(0.0)


def test_the_model_does_not_depend_on_the_private_row_count() -> None:
    """A row whose gradient is always zero changes no release (same seed, same noisy sums): the
    model must not change either — it would if the update divided by len(X) (review of 14)."""
    def train(x, y):
        acc = Accountant(LIMIT, composition="renyi", rng=4)
        return dp_sgd(acc, x, y, steps=5, sampling_rate=1.0, noise_multiplier=5.0,
                      batch_size=200, fit_intercept=False).weights

    zero_row = np.zeros((1, 3))  # x = 0: its gradient (σ(0) − y)·0 is 0 whatever y
    assert np.array_equal(train(X, Y), train(np.vstack([X, zero_row]), np.append(Y, 1.0)))


def test_data_never_appears_in_training_errors() -> None:
    acc = Accountant(LIMIT, composition="renyi", rng=0)
    secret = np.full((5,), 987654.321)
    with pytest.raises(Exception) as info:
        dp_sgd(acc, secret, Y[:5], steps=1, sampling_rate=0.5, noise_multiplier=1.0,
               batch_size=2)
    assert "987654" not in str(info.value)
    model = LogisticRegression(acc, batch_size=40, steps=2, sampling_rate=0.2).fit(X, Y)
    with pytest.raises(Exception) as info:
        model.predict(np.full((2, 5), 987654.321))
    assert "987654" not in str(info.value)


def test_logistic_gradients_match_finite_differences() -> None:
    w = np.array([0.3, -0.2, 0.1])

    def loss(v: np.ndarray) -> float:
        z = X @ v
        return float(np.sum(np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0) - Y * z))

    grad = logistic_gradients(w, X, Y).sum(axis=0)
    eps = 1e-6
    numeric = [(loss(w + eps * e) - loss(w - eps * e)) / (2 * eps) for e in np.eye(3)]
    assert np.allclose(grad, numeric, rtol=1e-5)


@pytest.mark.slow
def test_example_is_within_two_points_of_non_private() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "train_under_budget.py"
    summary = runpy.run_path(str(path))["main"](["--runs", "4"])
    assert summary["non-private"] - summary["DP-SGD (renyi, planned order)"] <= 0.02
