"""The "gaussian" rule: a Gaussian-DP filter that admits exactly floor(μ_B²/μ²) steps and refuses a step without a GDP parameter, changing nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, MechanismNotAllowedError
from dpbudget.accountant.composition.gaussian import GaussianComposition
from dpbudget.mechanisms import AnalyticGaussian, Laplace
from tests.composition.support import LIMIT, batch, snapshot
from tests.contracts import fill


def test_gaussian_rule_refuses_laplace_and_changes_nothing():
    rng = np.random.default_rng(1)
    acc = Accountant(LIMIT, composition="gaussian", rng=rng)
    acc.release(AnalyticGaussian(0.1, delta=1e-7, noise="float", sensitivity=1.0), 1.0)
    before = snapshot(acc, rng)
    with pytest.raises(MechanismNotAllowedError, match="Laplace"):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    with pytest.raises(MechanismNotAllowedError):
        acc.max_releases(Laplace(0.01, sensitivity=1.0))
    assert snapshot(acc, rng) == before


def test_gaussian_rule_is_exact_gdp():
    g = AnalyticGaussian(0.1, delta=1e-7, noise="float", sensitivity=1.0)
    acc = Accountant(LIMIT, composition="gaussian", rng=0)
    n = fill(acc, g, 1.0)
    mu_b = GaussianComposition(LIMIT).mu_budget
    assert n == math.floor(mu_b ** 2 / g.mu ** 2)
    assert acc.spent() <= Budget(1.0 + 1e-9, 1e-6)


def test_gaussian_batch_composes_mu_squared_and_refuses_laplace():
    g = AnalyticGaussian(0.1, delta=1e-7, noise="float", sensitivity=1.0)
    rng = np.random.default_rng(0)
    acc = Accountant(LIMIT, composition="gaussian", rng=rng)
    n = acc.max_releases(g)
    acc.release_many(batch(g, n - 1))
    assert acc.max_releases(g) == 1
    before = snapshot(acc, rng)
    with pytest.raises(BudgetExceededError):
        acc.release_many(batch(g, 2))
    with pytest.raises(MechanismNotAllowedError):
        acc.release_many([(g, 1.0), (Laplace(0.001, sensitivity=1.0), 1.0)])
    assert snapshot(acc, rng) == before
    acc.release_many(batch(g, 1))
    assert math.isclose(acc.ledger.accounts()[0].state["mu2"], n * g.mu ** 2, rel_tol=1e-12)
