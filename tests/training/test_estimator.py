"""Training findings of the independent review of issue 14: errors name X but never show it, and
the model is a post-processing of the charged releases only (no dependence on the row count)."""

from __future__ import annotations

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.training.estimator import LogisticRegression
from dpbudget.accountant.training.descent import dp_sgd

SECRET = np.array([123.456, 789.012, 345.678])


def test_dp_sgd_1d_X_error_does_not_show_data() -> None:
    acc = Accountant(Budget(3.0, 1e-5), composition="renyi")
    with pytest.raises(Exception) as info:
        dp_sgd(acc, SECRET, np.array([0.0, 1.0, 0.0]), steps=1, sampling_rate=0.5,
               noise_multiplier=1.0, batch_size=2)
    assert "123.456" not in str(info.value), str(info.value)


def test_predict_wrong_shape_error_does_not_show_data() -> None:
    acc = Accountant(Budget(3.0, 1e-5), composition="renyi", rng=0)
    X = np.array([[0.1, 0.2], [0.9, 0.8]] * 10)
    y = np.array([0, 1] * 10)
    model = LogisticRegression(acc, batch_size=20, steps=2, noise_multiplier=1.0).fit(X, y)
    with pytest.raises(Exception) as info:
        model.predict(SECRET)
    assert "123.456" not in str(info.value), str(info.value)


def _fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    acc = Accountant(Budget(10.0, 1e-5), composition="renyi", rng=0)
    return dp_sgd(acc, X, y, steps=1, sampling_rate=1.0, noise_multiplier=1.0,
                  batch_size=20, fit_intercept=False).weights


def test_model_is_post_processing_of_the_releases() -> None:
    """A row whose clipped gradient is exactly zero leaves every release unchanged (same seed);
    the model must not change either (it did when the update divided by q·len(X))."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 3))
    y = (rng.uniform(size=20) < 0.5).astype(float)
    X2, y2 = np.vstack([X, np.zeros((1, 3))]), np.append(y, 0.0)
    assert np.array_equal(_fit(X, y), _fit(X2, y2))
