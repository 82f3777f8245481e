"""The composition rules through the Accountant: docs/theory.md §2 counts, refusals, planning, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpbudget.accountant import (
    RULES, Accountant, Budget, BudgetExceededError, InvalidArgumentError, MechanismNotAllowedError,
)
from dpbudget.accountant.composition import (
    AdvancedComposition, BasicComposition, Charge, GaussianComposition, OptimalComposition, Refused,
    make_rule,
)
from dpbudget.accountant.composition import bounds
from dpbudget.mechanisms import AnalyticGaussian, Gaussian, Laplace

LIMIT = Budget(1.0, 1e-6)
KW = {"basic": {}, "advanced": {}, "optimal": {"per_query": Budget(0.01)}, "gaussian": {}}


def fill(acc, mechanism, dataset="default", cap=100_000):
    """Release ``mechanism`` until refused; the number admitted."""
    n = 0
    while n < cap:
        try:
            acc.release(mechanism, 1.0, dataset=dataset)
        except BudgetExceededError:
            return n
        n += 1
    return n


def snapshot(acc, rng):
    return list(acc.ledger.entries()), rng.bit_generator.state


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
    assert fill(acc, Laplace(0.01, sensitivity=1.0)) == count
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


def test_advanced_closes_basic_branch_after_an_approximate_step():
    rule = AdvancedComposition(LIMIT)
    s = rule.debit(rule.initial_state(), Charge(0.5, 0.0))   # basic branch (ρ = 0.125 > ρ_B)
    s = rule.debit(s, Charge(0.5, 0.0))
    with pytest.raises(Refused):
        rule.debit(s, Charge(0.001, 0.0))
    pure = rule.debit(rule.initial_state(), Charge(0.2, 0.0))  # ρ = 0.02 ≤ ρ_B
    rule.debit(pure, Charge(0.3, 0.0))  # ρ over ρ_B, but pure and Σε = 0.5: basic branch
    with pytest.raises(Refused):  # same Σε, but a Gaussian step: no basic branch for δ > 0
        rule.debit(pure, Charge(0.3, 1e-7, rho=0.01))
    gauss = rule.debit(rule.initial_state(), Charge(0.1, 1e-7, rho=0.001))
    with pytest.raises(Refused):  # once a δ > 0 step is in, pure steps get only the zCDP branch
        rule.debit(gauss, Charge(0.3, 0.0))


def test_advanced_delta_allowance():
    rule = AdvancedComposition(LIMIT, conversion_share=0.5)
    assert rule.delta_conv + rule.delta_allow <= 1e-6
    approx = Charge(0.01, 2e-7, mechanism="approx")
    s = rule.debit(rule.initial_state(), approx)
    s = rule.debit(s, approx)
    with pytest.raises(Refused):
        rule.debit(s, Charge(0.01, 2e-7))
    # No allowance by default: refused, saying so and what to change (issue 14's trap).
    with pytest.raises(MechanismNotAllowedError, match="keeps none .*conversion_share below 1"):
        AdvancedComposition(LIMIT).debit(AdvancedComposition(LIMIT).initial_state(), approx)


def test_advanced_without_delta_is_basic_for_pure_steps():
    acc = Accountant(Budget(1.0), composition="advanced", rng=0)
    assert acc.max_releases(Laplace(0.01, sensitivity=1.0)) == 100
    with pytest.raises(BudgetExceededError):
        acc.release(AnalyticGaussian(0.1, delta=1e-9, sensitivity=1.0), 1.0)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    assert acc.spent() == Budget(0.5) and acc.remaining() == Budget(0.5)


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
    n = fill(acc, g)
    mu_b = GaussianComposition(LIMIT).mu_budget
    assert n == math.floor(mu_b ** 2 / g.mu ** 2)
    assert acc.spent() <= Budget(1.0 + 1e-9, 1e-6)


def test_optimal_refuses_costlier_and_charges_cheaper_at_fixed_cost():
    rng = np.random.default_rng(2)
    acc = Accountant(LIMIT, composition="optimal", per_query=Budget(0.01), rng=rng)
    acc.release(Laplace(0.001, sensitivity=1.0), 1.0)  # cheaper: charged one full slot
    assert acc.max_releases(Laplace(0.01, sensitivity=1.0)) == 561
    before = snapshot(acc, rng)
    with pytest.raises(MechanismNotAllowedError, match="per-query cost"):
        acc.release(Laplace(0.02, sensitivity=1.0), 1.0)
    with pytest.raises(MechanismNotAllowedError):
        acc.release(AnalyticGaussian(0.005, delta=1e-9, sensitivity=1.0), 1.0)  # δ above δ₀ = 0
    assert snapshot(acc, rng) == before


# "pld" admits only its declared DP-SGD step (matrix values, not these scalar releases): the same
# properties are in its contract battery (test_rule_contract.py) and test_pld_rule.py.
SCALAR_RULES = sorted(set(RULES) - {"pld"})


def test_refusal_leaves_ledger_and_rng_unchanged():
    for rule in SCALAR_RULES:
        rng = np.random.default_rng(3)
        m = AnalyticGaussian(0.5, delta=1e-8, noise="float", sensitivity=1.0) if rule == "gaussian" else Laplace(0.01, sensitivity=1.0)
        acc = Accountant(LIMIT, composition=rule, rng=rng, simulation=True,
                         **({"per_query": Budget(0.5, 1e-8)} if rule == "optimal" else {}))
        fill(acc, m)
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
            assert fill(acc, then) == predicted, (rule, first, then)


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
        assert fill(acc, m) == total - total // 2


# -- properties ------------------------------------------------------------------------------

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


def _admitted_prefix(rule, epsilons):
    state, n = rule.initial_state(), 0
    for e in epsilons:
        try:
            state = rule.debit(state, Charge(e, 0.0))
        except Refused:
            break
        n += 1
    return n


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(1e-4, 0.5), min_size=1, max_size=2000))
def test_advanced_admits_at_least_basic(epsilons):
    assert (_admitted_prefix(AdvancedComposition(LIMIT), epsilons)
            >= _admitted_prefix(BasicComposition(LIMIT), epsilons))


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-3, 0.5))
def test_advanced_beats_wrrw_filter(e):
    # WRRW: continue while ½Σε² + sqrt(2 ln(1/δ) Σε²) ≤ ε_B
    lid, n = math.log(1e6), 0
    while 0.5 * (n + 1) * e * e + math.sqrt(2 * lid * (n + 1) * e * e) <= 1.0:
        n += 1
    rule = AdvancedComposition(LIMIT)
    assert rule.max_steps(rule.initial_state(), Charge(e, 0.0)) >= n


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


def test_optimal_account_cannot_resume_at_another_per_query(tmp_path):
    """The optimal rule's count means k releases at one fixed cost: reopening the ledger with a
    smaller per_query must not reuse it (found in review: 10 x 0.1 then 552 x 0.01 admitted)."""
    from dpbudget.accountant.audit.run import EXIT_BITS, audit
    from dpbudget.accountant.values.errors import LedgerConflictError

    url = f"sqlite:///{tmp_path / 'o.db'}"
    with Accountant(Budget(1.0, 1e-6), composition="optimal", per_query=Budget(0.1),
                    ledger=url, rng=0, simulation=True) as acc:
        for _ in range(acc.max_releases(Laplace(0.1, sensitivity=1.0))):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with pytest.raises(LedgerConflictError, match="per_query"):
        Accountant(limits={"default": Budget(1.0, 1e-6)}, composition="optimal",
                   per_query=Budget(0.01), ledger=url)
    with pytest.raises(LedgerConflictError, match="default.per_query.epsilon: stored 0.1"):
        Accountant(Budget(1.0, 1e-6), composition="optimal", per_query=Budget(0.01),
                   ledger=url)  # the stored policy is checked when the ledger is opened
    # A ledger forged by rewriting the configuration mid-stream is flagged by the audit.
    from dpbudget.accountant.composition import OptimalComposition
    from dpbudget.accountant.ledger import Account, MemoryLedger
    from tests.support import release_fields

    ledger = MemoryLedger()
    for eps0 in (0.1, 0.01):
        rule = OptimalComposition(Budget(1.0, 1e-6), Budget(eps0))
        mech = Laplace(eps0, sensitivity=1.0)
        with ledger.transaction() as tx:
            prev = tx.account("dataset:d")
            state = rule.debit(rule.initial_state() if prev is None else prev.state, mech.charge)
            account = Account("dataset:d", "optimal", rule.describe(), state, 0)
            tx.append(release_fields(mech, "d", [(rule, account)]), [account])
    report = audit(ledger)
    assert report.exit_status & EXIT_BITS["limit"]
    assert any("per_query" in p.message for p in report.problems)


def test_advanced_conversion_share_cannot_change_mid_stream(tmp_path) -> None:
    """An 'advanced' ledger recorded with conversion_share = 1.0 used to reopen under 0.5 without
    complaint, re-pricing what was spent (ρ_B and the δ allowance change)."""
    from dpbudget.accountant import LedgerConflictError
    from dpbudget.policies import DatasetLimit

    url = tmp_path / "a.db"
    with Accountant(limits={"d": DatasetLimit(limit=Budget(1.0, 1e-6), composition="advanced")},
                    ledger=url, rng=0, simulation=True) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="d")
    with pytest.raises(LedgerConflictError, match="conversion_share"):
        Accountant(limits={"d": DatasetLimit(limit=Budget(1.0, 1e-6), composition="advanced",
                                             conversion_share=0.5)}, ledger=url, rng=0,
                   simulation=True)
