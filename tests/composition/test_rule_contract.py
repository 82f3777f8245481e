"""Every composition rule in ``RULES`` on ``CompositionRuleContract`` (public API only), and the
rule behaviour found, while writing it, to break the contract (``xfail(strict=True)``: library bugs,
described in each reason)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import RULES, Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.mechanisms import (
    AnalyticGaussian,
    Exponential,
    Gaussian,
    Laplace,
    Mechanism,
    RandomizedResponse,
    SubsampledGaussian,
)
from dpbudget.accountant.composition import make_rule
from tests.contracts import SEED, CompositionRuleContract, fill


def test_every_rule_has_a_contract() -> None:
    assert {cls.rule for cls in CompositionRuleContract.__subclasses__()} == set(RULES)


class TestBasicRuleContract(CompositionRuleContract):
    rule = "basic"
    steps = [
        (Laplace(0.07, sensitivity=1.0), 1.0),
        (AnalyticGaussian(0.1, delta=1e-7, sensitivity=1.0), 1.0),
        (Exponential(0.03, candidates=["a", "b", "c"], sensitivity=1.0), [1.0, 2.0, 3.0]),
        (RandomizedResponse(0.011, categories=["yes", "no"]), "no"),
    ]


class TestAdvancedRuleContract(CompositionRuleContract):
    rule = "advanced"
    steps = [
        (Laplace(0.05, sensitivity=1.0), 1.0),
        (AnalyticGaussian(0.2, delta=1e-9, sensitivity=1.0), 1.0),
        (Exponential(0.02, candidates=["a", "b"], sensitivity=1.0), [0.0, 1.0]),
    ]
    bad_arguments = [
        (Budget(1.0, 1e-6), None, {"conversion_share": 0.0}, InvalidArgumentError,
         "conversion_share"),
        (Budget(1.0, 1e-6), None, {"conversion_share": 1.5}, InvalidArgumentError,
         "conversion_share"),
        (Budget(1.0, 1e-6), None, {"conversion_share": float("nan")}, InvalidArgumentError,
         "conversion_share"),
        (Budget(1.0, 1e-6), None, {"conversion_share": "0.5"}, InvalidTypeError,
         "conversion_share"),
        (Budget(1.0, 1e-6), None, {"conversion_share": True}, InvalidTypeError,
         "conversion_share"),
    ]


class TestOptimalRuleContract(CompositionRuleContract):
    rule = "optimal"
    per_query = Budget(0.05, 1e-9)
    steps = [
        (Laplace(0.05, sensitivity=1.0), 1.0),
        (Laplace(0.01, sensitivity=1.0), 1.0),  # cheaper: still one full slot
        (AnalyticGaussian(0.04, delta=1e-10, sensitivity=1.0), 1.0),
    ]
    bad_arguments = [
        (Budget(1.0, 1e-6), None, {}, InvalidArgumentError, "per_query"),
        (Budget(1.0, 1e-6), Budget(0.0), {}, InvalidArgumentError, "per_query"),
        (Budget(1.0, 1e-6), Budget.unlimited(), {}, InvalidArgumentError, "per_query"),
    ]

    def admits(self, m: Mechanism) -> bool:
        return m.cost <= self.per_query

    def test_every_step_is_charged_the_fixed_cost(self) -> None:
        acc = self.accountant()
        k_max = acc.max_releases(Laplace(0.05, sensitivity=1.0))
        assert k_max > 20  # more than basic composition's 20
        acc.release(Laplace(0.001, sensitivity=1.0), 1.0)
        assert acc.max_releases(Laplace(0.05, sensitivity=1.0)) == acc.max_releases(Laplace(0.001, sensitivity=1.0)) == k_max - 1


class TestGaussianRuleContract(CompositionRuleContract):
    rule = "gaussian"
    steps = [
        (AnalyticGaussian(0.3, delta=1e-8, noise="float", sensitivity=1.0), 1.0),
        (AnalyticGaussian(0.05, delta=1e-9, sensitivity=0.5, noise="float"), 1.0),
        (Gaussian(0.5, delta=1e-7, noise="float", sensitivity=1.0), 1.0),
    ]
    bad_arguments = [
        (Budget(1.0), None, {}, InvalidArgumentError, "limit"),
    ]

    def admits(self, m: Mechanism) -> bool:
        return m.mu is not None


class TestRenyiRuleContract(CompositionRuleContract):
    rule = "renyi"
    steps = [
        (Laplace(0.05, sensitivity=1.0), 1.0),
        (AnalyticGaussian(0.2, delta=1e-9, sensitivity=1.0), 1.0),
        (SubsampledGaussian(2.0, sampling_rate=0.05, sensitivity=1.0), np.ones((40, 3))),
        (Exponential(0.02, candidates=["a", "b"], sensitivity=1.0), [0.0, 1.0]),
    ]
    bad_arguments = [
        (Budget(1.0), None, {}, InvalidArgumentError, "limit"),
        (Budget(1.0, 1e-6), None, {"order": 1.0}, InvalidArgumentError, "order"),
        (Budget(1.0, 1e-6), None, {"order": 2.0}, InvalidArgumentError, "order"),  # no budget
        (Budget(1.0, 1e-6), None, {"order": float("nan")}, InvalidArgumentError, "order"),
        (Budget(1.0, 1e-6), None, {"order": "8"}, InvalidTypeError, "order"),
    ]


class TestPLDRuleContract(CompositionRuleContract):
    rule = "pld"
    step = (0.05, 2.0)
    steps = [
        (SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0), np.ones((40, 3))),
        (SubsampledGaussian(3.0, sampling_rate=0.02, noise="float", sensitivity=1.0), np.ones((40, 3))),  # dominated: one slot
    ]
    bad_arguments = [
        (Budget(1.0, 1e-6), None, {}, InvalidArgumentError, "step"),
        (Budget(1.0), None, {"step": (0.05, 2.0)}, InvalidArgumentError, "limit"),
        (Budget(1.0, 1e-6), None, {"step": (0.0, 2.0)}, InvalidArgumentError, "step[0]"),
        (Budget(1.0, 1e-6), None, {"step": (1.5, 2.0)}, InvalidArgumentError, "step[0]"),
        (Budget(1.0, 1e-6), None, {"step": (0.05, 0.1)}, InvalidArgumentError, "step[1]"),
        (Budget(1.0, 1e-6), None, {"step": (0.05, float("nan"))}, InvalidArgumentError,
         "step[1]"),
        (Budget(1.0, 1e-6), None, {"step": "0.05, 2"}, InvalidTypeError, "step"),
        (Budget(1.0, 1e-6), None, {"step": (0.05, 2.0), "order": 8.0}, InvalidArgumentError,
         "order"),
    ]

    def accountant(self, rng: Any = SEED, ledger: Any = None) -> Accountant:
        return Accountant(self.limit, composition=self.rule, step=self.step, rng=rng,
                          simulation=True, ledger=ledger)

    def make_rule(self) -> Any:
        return make_rule(self.rule, self.limit, step=self.step)

    def admits(self, m: Mechanism) -> bool:
        return False  # no other family is the declared step


# -- max_releases at the edge of the tolerance (a fixed library bug) -----------------------------------
# The closed form (n·ε rounded up once) and the debits (ε added n times, each sum rounded up) can
# disagree by a step where n·ε lands within a few ulps of the 1e-9 tolerance edge; max_releases
# settles small answers by replaying the debits.

@pytest.mark.parametrize("epsilon", [
    pytest.param(0.142857143, id="over-promises"),
    pytest.param(0.5000000005, id="under-promises"),
])
def test_max_releases_is_exact_at_the_tolerance_edge(epsilon: float) -> None:
    acc = Accountant(Budget(1.0), rng=0)
    predicted = acc.max_releases(Laplace(epsilon, sensitivity=1.0))
    assert fill(acc, Laplace(epsilon, sensitivity=1.0), 1.0) == predicted


@pytest.mark.parametrize("rule", ["basic", "advanced", "gaussian"])
def test_max_releases_matches_release_on_a_grid_of_costs(rule: str) -> None:
    """Every ε on a grid around the edges (1/k ± a few ulps-worth): the promise is what is kept."""
    import numpy as np

    for k in (3, 7, 10, 33):
        for eps in np.nextafter(1.0 / k, [0.0, 1.0]).tolist() + [1.0 / k * (1 + 1e-9)]:
            mech = Gaussian(eps, delta=1e-7, noise="float", sensitivity=1.0) if rule == "gaussian" else Laplace(eps, sensitivity=1.0)
            acc = Accountant(Budget(1.0, 1e-6), composition=rule, rng=0)
            assert fill(acc, mech, 1.0) == Accountant(
                Budget(1.0, 1e-6), composition=rule).max_releases(mech), (rule, k, eps)


# -- the optimal rule under a pure limit (a fixed library bug) ---------------------------------------------

def test_optimal_rule_under_a_pure_limit_admits_the_exact_count() -> None:
    acc = Accountant(Budget(1.0), composition="optimal", per_query=Budget(0.125), rng=0)
    assert acc.max_releases(Laplace(0.125, sensitivity=1.0)) == 8
    assert fill(acc, Laplace(0.125, sensitivity=1.0), 1.0) == 8


def test_basic_rule_under_the_same_pure_limit_admits_the_exact_count() -> None:
    """The control for the test above: the same limit and steps under 'basic'."""
    acc = Accountant(Budget(1.0), composition="basic", rng=0)
    assert acc.max_releases(Laplace(0.125, sensitivity=1.0)) == 8
    assert fill(acc, Laplace(0.125, sensitivity=1.0), 1.0) == 8
