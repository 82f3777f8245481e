"""The "renyi" rule (issue 14): the targets, the union's invariant, the refusals, the ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    LedgerConflictError,
    MechanismNotAllowedError,
    plan_order,
)
from dpbudget.accountant.values import rdp
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import RenyiComposition, make_rule
from dpbudget.mechanisms import AnalyticGaussian, Laplace, ProposeTestRelease, SubsampledGaussian
from tests.support import snapshot

LIMIT = Budget(3.0, 1e-5)
SGM = SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0)  # q = 0.01, σ = 1: the workload


def steps(rule_name: str, mechanism: object, **kw: object) -> int:
    return Accountant(LIMIT, composition=rule_name, **kw).max_releases(mechanism)  # type: ignore


def test_dp_sgd_targets() -> None:
    """Issue 14's targets at (3, 1e-5), q = 0.01, σ = 1: the offline RDP accountant's 2,195 with
    the order planned (continuous Gaussian: MTZ's fractional series with our tail bound; the
    exact discrete noise has the integer orders and the chord between them, 2,185), and as many
    with no plan (the order chosen from the first step; issue 29)."""
    float_sgm = SubsampledGaussian(1.0, sampling_rate=0.01, noise="float", sensitivity=1.0)
    order = plan_order(LIMIT, float_sgm)
    assert abs(order - 6.73) < 0.05 and steps("renyi", float_sgm, order=order) >= 2195
    exact_order = plan_order(LIMIT, SGM)
    assert steps("renyi", SGM, order=exact_order) == 2185
    assert steps("renyi", SGM) == 2185  # no plan: the order chosen from the first step
    assert steps("advanced", SGM) == 0 and steps("basic", SGM) < 10  # no amplification


def test_full_batch_gaussian_is_within_one_percent_of_advanced() -> None:
    for z in (2.0, 5.0, 20.0):
        mech = AnalyticGaussian(noise_multiplier=z, delta=1e-6, sensitivity=1.0)
        advanced = steps("advanced", mech)
        planned = steps("renyi", mech, order=plan_order(LIMIT, mech))
        assert planned >= 0.99 * advanced, (z, planned, advanced)


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5])
def test_never_fewer_pure_steps_than_basic(eps: float) -> None:
    for mech in (Laplace(eps, sensitivity=1.0), Laplace(eps, noise="float", sensitivity=1.0)):
        assert steps("renyi", mech) >= steps("basic", mech)
        assert steps("renyi", mech, order=8.0) >= steps("basic", mech)


def test_refused_step_draws_and_debits_nothing() -> None:
    rng = np.random.default_rng(1)
    acc = Accountant(Budget(0.5, 1e-6), composition="renyi", rng=rng)
    n = acc.max_releases(SubsampledGaussian(0.8, sampling_rate=0.05, sensitivity=1.0))
    rows = np.ones((100, 2))
    for _ in range(n):
        acc.release(SubsampledGaussian(0.8, sampling_rate=0.05, sensitivity=1.0), rows)
    before = snapshot(acc.ledger, rng)
    with pytest.raises(BudgetExceededError, match="order its first step fixed"):
        acc.release(SubsampledGaussian(0.8, sampling_rate=0.05, sensitivity=1.0), rows)
    assert snapshot(acc.ledger, rng) == before


def test_approximate_steps_without_a_renyi_bound_are_refused_with_advice() -> None:
    acc = Accountant(LIMIT, composition="renyi", rng=0)
    ptr = ProposeTestRelease(1.0, delta=1e-6, bound=1.0, lower=0.0, upper=10.0)
    with pytest.raises(MechanismNotAllowedError, match="no Renyi bound.*'advanced'"):
        acc.release(ptr, [1.0, 2.0, 3.0])
    assert acc.spent() == Budget(0.0)


def test_limits_and_orders_are_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="'limit'"):
        Accountant(Budget(1.0), composition="renyi")
    with pytest.raises(InvalidArgumentError, match="'order'"):
        Accountant(LIMIT, composition="renyi", order=1.5)  # no positive budget there
    with pytest.raises(InvalidArgumentError, match="'order'"):
        Accountant(LIMIT, composition="advanced", order=8.0)
    with pytest.raises(InvalidArgumentError, match="'orders'"):
        RenyiComposition(LIMIT, orders=[8.0, 8.0])


def test_changing_the_order_of_a_ledger_is_refused(tmp_path) -> None:
    path = tmp_path / "l.db"
    with Accountant(LIMIT, composition="renyi", order=7.0, ledger=path, rng=0,
                    simulation=True) as acc:
        acc.release(SGM, np.ones((10, 1)))
    with pytest.raises(LedgerConflictError, match="order"):
        with Accountant(LIMIT, composition="renyi", order=8.0, ledger=path) as acc:
            acc.spent()
    with pytest.raises(LedgerConflictError, match="order"):
        with Accountant(LIMIT, composition="renyi", ledger=path) as acc:
            acc.spent()


def test_audit_replays_renyi_records(tmp_path) -> None:
    location = f"sqlite:///{tmp_path / 'l.db'}"
    with Accountant(LIMIT, composition="renyi", ledger=location, rng=0, simulation=True) as acc:
        acc.release(SGM, np.ones((30, 2)))
        acc.release(Laplace(0.1, noise="float", sensitivity=1.0), 1.0)
        acc.release(AnalyticGaussian(noise_multiplier=3.0, delta=1e-6, sensitivity=1.0), 1.0)
        acc.release_many([(SGM, np.ones((5, 1))), (Laplace(0.2, sensitivity=1.0), 2.0)])
    report = audit(location)
    assert report.ok, report.problems


def test_a_forged_curve_is_refused_before_anything_is_drawn() -> None:
    rule = make_rule("renyi", LIMIT)
    for bad in [("poisson-zcdp", -0.5, 1.0), ("poisson-zcdp", 0.01, math.nan), ("made-up", 1.0),
                ("laplace", math.inf)]:
        with pytest.raises(InvalidArgumentError, match="'rdp'"):
            rule.debit(rule.initial_state(), Charge(0.1, 0.0, rdp=bad))


charges = st.one_of(
    st.builds(lambda e: Charge(e, 0.0), st.floats(1e-3, 1.0)),
    st.builds(lambda r: Charge(1.0, 1e-7, rho=r), st.floats(1e-4, 0.5)),
    st.builds(lambda q, z: Charge(1.0, 1e-7, rho=1 / (2 * z * z), rdp=("poisson-zcdp", q, z)),
              st.floats(1e-3, 1.0), st.floats(0.5, 5.0)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(charges, min_size=1, max_size=60),
       st.sampled_from([None, 7.0, 12.0, (4.0, 8.0, 16.0)]))
def test_every_admitted_transcript_is_covered_by_one_branch(sequence, order) -> None:
    """The union's invariant, adversarially: whatever the analyst asks, after every admitted
    step either every step is pure with Σε <= ε_B, or some order's sum is within its budget —
    and each branch's (ε, δ) statement is within the limit, the δ's adding up to δ_B. Without
    an order, the one the first admitted step fixed never changes."""
    several = isinstance(order, tuple)
    rule = (RenyiComposition(LIMIT, orders=order) if several
            else RenyiComposition(LIMIT, order=order))
    assert math.fsum(rule.deltas) <= LIMIT.delta
    for a, b, d in zip(rule.orders, rule.budgets, rule.deltas):
        assert b <= 0 or rdp.epsilon(b, a, d) <= LIMIT.epsilon * (1 + 1e-9)
    state = rule.initial_state()
    fixed = None
    for charge in sequence:
        try:
            state = rule.debit(state, charge)
        except Exception:
            continue
        pure = state["delta"] == 0.0 and state["epsilon"] <= LIMIT.epsilon * (1 + 1e-9)
        if order is None:
            alpha = state["order"]
            assert fixed is None or alpha == fixed
            fixed = alpha
            b = rdp.budget(LIMIT.epsilon, LIMIT.delta, alpha)
            assert rdp.epsilon(b, alpha, LIMIT.delta) <= LIMIT.epsilon * (1 + 1e-9)
            some = b > 0 and state["r0"] <= b * (1 + 1e-9)
        else:
            some = any(state[f"r{j}"] <= b * (1 + 1e-9) for j, b in enumerate(rule.budgets))
        assert pure or some


def test_policy_files_set_the_rule_and_its_order(tmp_path) -> None:
    from dpbudget.accountant import PolicyError

    policy = tmp_path / "p.toml"
    policy.write_text('[datasets.patients]\nlimit = { epsilon = 3.0, delta = 1e-5 }\n'
                      'composition = "renyi"\norder = 7.0\n\n'
                      '[datasets.other]\nlimit = { epsilon = 3.0, delta = 1e-5 }\n'
                      'composition = "renyi"\n')
    acc = Accountant.from_policy(policy)
    assert acc.max_releases(SGM, dataset="patients") == 2185
    assert acc.max_releases(SGM, dataset="other") == steps("renyi", SGM)
    policy.write_text('[datasets.bad]\nlimit = { epsilon = 3.0, delta = 1e-5 }\norder = 7.0\n')
    with pytest.raises(PolicyError, match="datasets.bad.*'order'"):
        Accountant.from_policy(policy)
