"""The "advanced" rule: the zCDP filter united with basic composition for pure steps, its δ allowance, and its configuration pinned in the ledger."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, MechanismNotAllowedError
from dpbudget.accountant.composition import BasicComposition, Charge, Refused
from dpbudget.accountant.composition.advanced import AdvancedComposition
from dpbudget.mechanisms import AnalyticGaussian, Laplace
from tests.composition.support import LIMIT, batch


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


def test_advanced_batch_equals_sequential_zcdp():
    a = Accountant(LIMIT, composition="advanced", rng=0)
    b = Accountant(LIMIT, composition="advanced", rng=0)
    a.release_many(batch(Laplace(0.01, sensitivity=1.0), 300))
    for _ in range(300):
        b.release(Laplace(0.01, sensitivity=1.0), 1.0)
    assert a.spent() == b.spent()
    assert a.max_releases(Laplace(0.01, sensitivity=1.0)) == 187
    with pytest.raises(BudgetExceededError):
        a.release_many(batch(Laplace(0.01, sensitivity=1.0), 188))
