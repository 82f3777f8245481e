"""Edges of the "renyi" rule found by the independent review of issue 14: a state over the limit
must read as over it (a limit lowered since, a forged state), and a tiny but valid ε must not
crash the pure-DP curve."""

from __future__ import annotations

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.values import rdp
from dpbudget.accountant.values._numeric import within_budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import RenyiComposition
from dpbudget.mechanisms import Median


def test_state_over_the_limit_reads_as_over() -> None:
    rule = RenyiComposition(Budget(1.0, 1e-5), order=20.0)
    state = rule._step(rule.initial_state(), Charge(0.5, 1e-6, rho=0.05), 100)  # r0 = 100 >> B
    assert not rule.admits(state)
    assert not within_budget(rule.spent(state), rule.limit), rule.spent(state)


def test_pure_curve_of_tiny_epsilon() -> None:
    assert 0.0 < rdp.pure(5e-324, 1.1) <= 5e-324
    assert rdp.pure(1e-160, 3.0) >= 3.0 * 1e-160 ** 2 / 2


def test_release_of_tiny_epsilon_median_under_renyi() -> None:
    acc = Accountant(Budget(1.0, 1e-6), composition="renyi")
    assert acc.max_releases(Median(5e-324, lower=0.0, upper=1.0)) > 0
