"""The interface every composition rule implements (``accountant.composition.base``), on every rule
in ``RULES``: ``CompositionRuleContract`` (public API only), the rule behaviour found, while writing
it, to break the contract (``xfail(strict=True)``: library bugs, described in each reason), and the
rules through the Accountant: docs/theory.md §2 counts, refusals, planning, resume, and the
properties every rule's spend keeps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpbudget.accountant import (
    RULES, Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError,
    MechanismNotAllowedError,
)
from dpbudget.accountant.composition import (
    AdvancedComposition, GaussianComposition, bounds, make_rule,
)
from dpbudget.accountant.composition.base import Charge, Refused
from dpbudget.mechanisms import (
    AnalyticGaussian,
    Exponential,
    Gaussian,
    Laplace,
    Mechanism,
    RandomizedResponse,
    SubsampledGaussian,
)
from tests.composition.support import LIMIT, snapshot
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


KW = {"basic": {}, "advanced": {}, "optimal": {"per_query": Budget(0.01)}, "gaussian": {}}


def test_registry_and_errors():
    assert set(RULES) == {"basic", "advanced", "optimal", "gaussian", "renyi", "pld"}
    with pytest.raises(InvalidArgumentError, match="'per_query'"):
        Accountant(LIMIT, composition="optimal")
    with pytest.raises(InvalidArgumentError, match="'limit'"):
        make_rule("gaussian", Budget(1.0))
    with pytest.raises(InvalidArgumentError, match="'conversion_share'"):
        AdvancedComposition(LIMIT, conversion_share=0.0)


@pytest.mark.parametrize(("rule", "count"), [("basic", 100), ("advanced", 487), ("optimal", 562)])
def test_theory_counts(rule, count):
    acc = Accountant(LIMIT, composition=rule, rng=0, simulation=True, **KW[rule])
    assert acc.max_releases(Laplace(0.01, sensitivity=1.0)) == count
    assert fill(acc, Laplace(0.01, sensitivity=1.0), 1.0) == count
    assert acc.max_releases(Laplace(0.01, sensitivity=1.0)) == 0
    spent = acc.spent()
    assert spent <= Budget(1.0 + 1e-9, 1e-6)
    if rule != "basic":
        assert spent.epsilon < 1.0


def test_derived_constants_are_in_every_entry():
    acc = Accountant(LIMIT, composition="advanced", rng=0)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    config = next(acc.ledger.entries()).record["accounts"]["dataset:default"]
    assert config["rho_budget"] == pytest.approx(0.024355970359538525, rel=1e-9)
    assert config["rule"] == "advanced"
    acc = Accountant(LIMIT, composition="optimal", per_query=Budget(0.01), rng=0)
    acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    assert next(acc.ledger.entries()).record["accounts"]["dataset:default"]["k_max"] == 562
    acc = Accountant(LIMIT, composition="gaussian", rng=0)
    acc.release(AnalyticGaussian(0.5, delta=1e-7, noise="float", sensitivity=1.0), 1.0)
    entry = next(acc.ledger.entries()).record["accounts"]["dataset:default"]
    assert entry["mu_budget"] == pytest.approx(GaussianComposition(LIMIT).mu_budget)


# "pld" admits only its declared DP-SGD step (matrix values, not these scalar releases): the same
# properties are in its contract battery (above) and test_pld.py.
SCALAR_RULES = sorted(set(RULES) - {"pld"})


def test_refusal_leaves_ledger_and_rng_unchanged():
    for rule in SCALAR_RULES:
        rng = np.random.default_rng(3)
        m = AnalyticGaussian(0.5, delta=1e-8, noise="float", sensitivity=1.0) if rule == "gaussian" else Laplace(0.01, sensitivity=1.0)
        acc = Accountant(LIMIT, composition=rule, rng=rng, simulation=True,
                         **({"per_query": Budget(0.5, 1e-8)} if rule == "optimal" else {}))
        fill(acc, m, 1.0)
        before = snapshot(acc, rng)
        with pytest.raises(BudgetExceededError):
            acc.release(m, 1.0)
        assert snapshot(acc, rng) == before, rule


@pytest.mark.parametrize("rule", SCALAR_RULES)
def test_max_releases_agrees_with_counting(rule):
    mechs = ([AnalyticGaussian(0.3, delta=1e-8, noise="float", sensitivity=1.0), Gaussian(0.05, delta=1e-9, noise="float", sensitivity=1.0)]
             if rule == "gaussian" else
             [Laplace(0.05, sensitivity=1.0), Laplace(0.003, sensitivity=1.0), AnalyticGaussian(0.2, delta=1e-9, sensitivity=1.0)])
    for first in mechs:
        for then in mechs:
            kw = {"per_query": Budget(0.3, 1e-8)} if rule == "optimal" else {}
            acc = Accountant(LIMIT, composition=rule, rng=0, simulation=True, **kw)
            acc.release(first, 1.0)
            predicted = acc.max_releases(then)
            assert fill(acc, then, 1.0) == predicted, (rule, first, then)


def test_unlimited_spend_is_tracked():
    for rule in SCALAR_RULES:  # ("pld" needs a limit: its k_max is computed from it)
        kw = {"per_query": Budget(0.5)} if rule == "optimal" else {}
        acc = Accountant(None, composition=rule, rng=0, simulation=True, **kw)
        m = AnalyticGaussian(0.5, delta=1e-6, noise="float", sensitivity=1.0) if rule == "gaussian" else Laplace(0.5, sensitivity=1.0)
        for _ in range(4):
            acc.release(m, 1.0)
        assert acc.remaining() == Budget.unlimited()
        assert acc.max_releases(m) > 10 ** 15
        assert 0.0 < acc.spent().epsilon <= 2.0 + 1e-12, rule


@pytest.mark.parametrize("rule", SCALAR_RULES)
def test_state_resumes_from_sqlite(tmp_path, rule):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    m = AnalyticGaussian(0.3, delta=1e-8, noise="float", sensitivity=1.0) if rule == "gaussian" else Laplace(0.01, sensitivity=1.0)
    kw = {"per_query": Budget(0.3, 1e-8)} if rule == "optimal" else {}
    with Accountant(LIMIT, composition=rule, ledger=url, rng=0, simulation=True, **kw) as acc:
        total = acc.max_releases(m)
        for _ in range(total // 2):
            acc.release(m, 1.0)
        spent = acc.spent()
    with Accountant(LIMIT, composition=rule, ledger=url, rng=1, simulation=True, **kw) as acc:
        assert acc.spent() == spent
        assert fill(acc, m, 1.0) == total - total // 2


steps = st.lists(st.floats(0.001, 0.3), min_size=1, max_size=120)


def _rule(name):
    return make_rule(name, LIMIT, Budget(0.3) if name == "optimal" else None)


@settings(max_examples=60, deadline=None)
@given(steps, st.sampled_from(["basic", "advanced", "optimal"]))
def test_spend_is_monotone_and_within_limit(epsilons, name):
    rule = _rule(name)
    state, last = rule.initial_state(), Budget(0.0)
    for e in epsilons:
        try:
            state = rule.debit(state, Charge(e, 0.0))
        except Refused:
            continue
        spent = rule.spent(state)
        assert spent.epsilon >= last.epsilon and spent.delta >= last.delta  # monotone
        assert spent <= Budget(LIMIT.epsilon * (1 + 1e-9), LIMIT.delta * (1 + 1e-9))
        rem = rule.remaining(state)
        assert rem.epsilon >= 0 and rem.delta >= 0
        last = spent


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 0.9), st.sampled_from([0.0, 1e-9, 1e-7])),
                min_size=1, max_size=80),
       st.sampled_from(["advanced", "gaussian"]))
def test_mixed_spend_is_monotone_and_within_limit(steps, name):
    """Pure (δ = 0 → Laplace) and Gaussian steps mixed, under the rules that take both kinds."""
    rule = _rule(name)
    state, last = rule.initial_state(), Budget(0.0)
    for e, d in steps:
        m = Laplace(e, sensitivity=1.0) if d == 0.0 else Gaussian(e, delta=d, noise="float", sensitivity=1.0)
        try:
            state = rule.debit(state, m.charge)
        except (Refused, MechanismNotAllowedError):
            continue
        spent = rule.spent(state)
        assert spent.epsilon >= last.epsilon and spent.delta >= last.delta
        assert spent <= Budget(LIMIT.epsilon * (1 + 1e-9), LIMIT.delta)
        last = spent


def test_public_names_are_exported():
    import dpbudget.accountant.composition as composition

    for name in ("AdvancedComposition", "BasicComposition", "GaussianComposition",
                 "OptimalComposition", "Charge", "CompositionRule", "Refused", "make_rule", "RULES"):
        assert name in composition.__all__ and hasattr(composition, name)
    for name in bounds.__all__:
        assert callable(getattr(bounds, name)) and getattr(bounds, name).__doc__


def test_spent_semantics_documented_examples():
    acc = Accountant(LIMIT, composition="advanced", rng=0)
    for _ in range(3):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert acc.spent() == Budget(0.30000000000000004, 1e-6)
    acc = Accountant(LIMIT, per_query=Budget(0.1), rng=0)
    assert acc.max_releases(Laplace(0.2, sensitivity=1.0)) == 0


# -- what the PostgreSQL triggers assume of every rule's state ----------------------------------

def _steps_of_each_rule() -> dict[str, tuple[Any, Any]]:
    from dpbudget.mechanisms import SubsampledGaussian
    gauss = Gaussian(0.1, delta=1e-7, sensitivity=1.0, noise="float")
    limit = Budget(1.0, 1e-6)
    return {
        "basic": (make_rule("basic", limit), gauss),
        "advanced": (make_rule("advanced", limit), gauss),
        "gaussian": (make_rule("gaussian", limit), gauss),
        "renyi": (make_rule("renyi", limit), gauss),
        "optimal": (make_rule("optimal", limit, per_query=Budget(0.1, 1e-7)), gauss),
        "pld": (make_rule("pld", limit, step=(0.05, 2.0)),
                SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0)),
    }


def test_every_state_member_is_a_cost_that_never_falls_but_renyis_order() -> None:
    """accountant/ledger/postgres/schema.sql refuses a writer's record whose state has a member
    below the stored one, or another ``order`` once anything was charged: that is a refund only
    if honest debits do neither. Every rule in ``RULES`` is here, so a new one must be added."""
    steps = _steps_of_each_rule()
    assert set(steps) == set(RULES)
    for name, (rule, mechanism) in steps.items():
        states = [rule.initial_state()]
        for _ in range(4):
            states.append(rule.debit(states[-1], mechanism.charge))
        for before, after in zip(states, states[1:]):
            assert set(before) <= set(after), name
            assert all(after[k] >= v for k, v in before.items() if k != "order"), name
            if after.get("order", 0) != before.get("order", 0):
                assert not any(before.values()), name  # set only by the first step
        assert any(states[-1].values()), name  # (the steps were charged)
    assert steps["renyi"][0].initial_state()["order"] == 0.0  # the one order the check names
