"""``LogisticRegression``: a scikit-learn-style estimator trained under an accountant's budget.

Invariant: ``fit`` touches the training data only through :func:`dpbudget.accountant.training.descent.dp_sgd`
(every step charged before its noise is drawn); the fitted weights are then public, so
``predict``/``score`` on any data cost nothing. Errors and reprs name arguments, never data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataTypeError, InvalidTypeError
from dpbudget.accountant.training.descent import dp_sgd, noise_for_steps
from dpbudget.accountant.gate.unnamed import NOT_GIVEN
from dpbudget.mechanisms.base import real_values

__all__ = ["LogisticRegression"]


class LogisticRegression:
    """Binary logistic regression trained by DP-SGD (or, with ``sampling_rate=1``, full-batch
    noisy gradient descent), charged to ``dataset`` on ``accountant`` step by step.

    Like diffprivlib's models it takes the accountant that pays; unlike them, a refusal does not
    fail the fit: training stops at the first step the budget refuses and keeps the model so far
    (``steps_`` says how many ran, ``refused_`` whether the budget ended it).

    Args:
        accountant: the ``Accountant`` to charge.
        batch_size: the expected batch size q·n as a public number (a public row count times
            q): the noisy gradient sum is divided by it (``dp_sgd`` says why not by len(X)).
        dataset, analyst: whose limit pays.
        steps: the number of gradient steps asked for.
        noise_multiplier: z = σ/C; ``None`` plans the smallest z at which ``steps`` steps fit
            what is left of the budget now (``noise_for_steps`` on the accountant).
        sampling_rate: the Poisson rate q (1.0: full batch).
        clip_norm: the per-example gradient norm C.
        learning_rate: the step size η (the update is η × noisy gradient sum / (q·n)).
        fit_intercept: append a constant feature.
        noise: ``"exact"`` (default) or ``"float"``.

    Attributes (after ``fit``): ``coef_`` (d,), ``intercept_``, ``steps_``, ``refused_``,
    ``noise_multiplier_``, ``classes_`` (``[0, 1]``).

    >>> from dpbudget.accountant import Budget
    >>> X = np.array([[0.1, 0.2], [0.9, 0.8]] * 50); y = np.array([0, 1] * 50)
    >>> acc = Accountant(Budget(3.0, 1e-5), composition="renyi", rng=0)
    >>> model = LogisticRegression(acc, batch_size=20, steps=50, sampling_rate=0.2,
    ...                            learning_rate=4.0).fit(X, y)
    >>> model.steps_, model.score(X, y)
    (50, 1.0)
    """

    def __init__(self, accountant: Accountant, *, batch_size: float, dataset: Any = NOT_GIVEN,
                 analyst: str | None = None, steps: int = 100,
                 noise_multiplier: float | None = None, sampling_rate: float = 1.0,
                 clip_norm: float = 1.0, learning_rate: float = 1.0, fit_intercept: bool = True,
                 noise: str = "exact") -> None:
        if not isinstance(accountant, Accountant):
            raise InvalidTypeError("accountant", accountant, "an Accountant")
        self.accountant, self.dataset, self.analyst = accountant, dataset, analyst
        self.steps, self.noise_multiplier, self.sampling_rate = steps, noise_multiplier, sampling_rate
        self.clip_norm, self.learning_rate = clip_norm, learning_rate
        self.fit_intercept, self.noise, self.batch_size = fit_intercept, noise, batch_size
        self.classes_ = np.array([0, 1])

    def fit(self, X: Any, y: Any) -> "LogisticRegression":
        z = self.noise_multiplier
        if z is None:
            z = noise_for_steps(self.accountant, self.steps, sampling_rate=self.sampling_rate,
                                clip_norm=self.clip_norm, noise=self.noise,
                                dataset=self.dataset, analyst=self.analyst)
        result = dp_sgd(self.accountant, X, y, steps=self.steps, sampling_rate=self.sampling_rate,
                        noise_multiplier=z, batch_size=self.batch_size, clip_norm=self.clip_norm,
                        learning_rate=self.learning_rate, dataset=self.dataset,
                        analyst=self.analyst, fit_intercept=self.fit_intercept, noise=self.noise,
                        label="LogisticRegression.fit")
        w = result.weights
        self.coef_ = w[:-1] if self.fit_intercept else w
        self.intercept_ = float(w[-1]) if self.fit_intercept else 0.0
        self.steps_, self.refused_, self.noise_multiplier_ = result.steps, result.refused, z
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        if not hasattr(self, "coef_"):
            raise InvalidArgumentError("model", "not fitted", "fitted first (call fit)")
        x = real_values("X", X)
        if isinstance(x, float) or x.ndim != 2 or x.shape[1] != self.coef_.shape[0]:
            raise InvalidDataTypeError("X", X, f"a 2-D array with {self.coef_.shape[0]} columns")
        return np.asarray(x @ self.coef_ + self.intercept_)

    def predict_proba(self, X: Any) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        return (self.decision_function(X) > 0).astype(int)

    def score(self, X: Any, y: Any) -> float:
        """Accuracy on (X, y); free: the model is already public."""
        return float(np.mean(self.predict(X) == np.asarray(y)))

    def __repr__(self) -> str:
        return (f"LogisticRegression(dataset={self.dataset!r}, steps={self.steps!r}, "
                f"noise_multiplier={self.noise_multiplier!r}, "
                f"sampling_rate={self.sampling_rate!r}, clip_norm={self.clip_norm!r})")
