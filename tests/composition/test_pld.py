"""The "pld" rule (issue 29, item 5): a fixed DP-SGD step declared with the budget, composed by
its pessimistic privacy-loss distribution. The issue's figure, refusals that debit nothing, a
dominated step charged as a full one, and the audit replaying the rule (a forged over-count
flagged; the honest ledger clean). The distributions themselves: tests/composition/test_privacy_loss.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, MechanismNotAllowedError
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.composition import Refused, make_rule, privacy_loss
from dpbudget.accountant.composition.pld import PLDComposition
from dpbudget.accountant.ledger import Account, MemoryLedger
from dpbudget.mechanisms import Laplace, SubsampledGaussian
from tests.support import forge_release, snapshot

ROWS = np.ones((20, 2))


# -- the issue's figure ----------------------------------------------------------------------------

def test_the_issues_figure_more_steps_than_renyi() -> None:
    """q = 0.01, z = 1 at (3, 1e-5): the issue measured 2,666 by dp-accounting's PLD and 2,195 by
    the renyi rule. Ours (connect-the-dots on a 1e-4 grid, with float margins) is 2,666 too, and
    never above dp-accounting's answer (the oracle test in test_privacy_loss.py)."""
    step = SubsampledGaussian(1.0, sampling_rate=0.01, noise="float", sensitivity=1.0)
    pld = Accountant(Budget(3.0, 1e-5), composition="pld", step=(0.01, 1.0)).max_releases(step)
    renyi = Accountant(Budget(3.0, 1e-5), composition="renyi").max_releases(step)
    assert 2655 <= pld <= 2666
    assert renyi <= 2195 < pld  # the control: the Rényi filter admits ≥ 17 % fewer
    assert pld >= 1.17 * renyi


# -- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", [
    pytest.param(SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0), id="exact-noise"),  # no PLD proven here
    pytest.param(SubsampledGaussian(1.0, sampling_rate=0.02, noise="float", sensitivity=1.0), id="higher-rate"),
    pytest.param(SubsampledGaussian(0.9, sampling_rate=0.01, noise="float", sensitivity=1.0), id="less-noise"),
    pytest.param(Laplace(0.01, sensitivity=1.0), id="laplace"),
])
def test_any_other_step_is_refused_and_nothing_is_debited(mechanism: Any) -> None:
    acc = Accountant(Budget(3.0, 1e-5), composition="pld", step=(0.01, 1.0), rng=0)
    declared = SubsampledGaussian(1.0, sampling_rate=0.01, noise="float", sensitivity=1.0)
    acc.release(declared, ROWS)
    before = snapshot(acc.ledger)
    value = 1.0 if isinstance(mechanism, Laplace) else ROWS
    for attempt in (lambda: acc.release(mechanism, value), lambda: acc.can_afford(mechanism),
                    lambda: acc.max_releases(mechanism)):
        with pytest.raises(MechanismNotAllowedError):
            attempt()
    assert snapshot(acc.ledger) == before
    assert acc.max_releases(declared) == acc.max_releases(
        SubsampledGaussian(1.5, sampling_rate=0.005, noise="float", sensitivity=1.0)) == make_rule(
        "pld", Budget(3.0, 1e-5), step=(0.01, 1.0)).k_max - 1


def test_a_dominated_step_is_charged_as_one_declared_step() -> None:
    """The rule alone: a step it dominates (lower rate, more noise) counts as a full declared
    step, so k_max steps of either kind, mixed, fill the account; the next is refused. Negative
    control: composed by its own PLD the lighter step would admit far more than k_max."""
    rule = PLDComposition(Budget(1.0, 1e-6), step=(0.05, 2.0))
    declared = SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0).charge
    lighter = SubsampledGaussian(3.0, sampling_rate=0.01, noise="float", sensitivity=1.0).charge
    state = rule.initial_state()
    for i in range(rule.k_max):
        state = rule.debit(state, lighter if i % 2 else declared)
    assert state["count"] == rule.k_max and rule.max_steps(state, lighter) == 0
    with pytest.raises(Refused):
        rule.debit(state, lighter)
    assert privacy_loss.max_steps(0.01, 3.0, 1.0, 1e-6) > 2 * rule.k_max


def test_why_a_costlier_step_must_be_refused() -> None:
    """The negative control for the refusal: k_max steps at twice the declared rate are far over
    δ_B, so admitting them as 'one step each' would break the limit."""
    k = privacy_loss.max_steps(0.05, 2.0, 1.0, 1e-6)
    assert privacy_loss.delta(0.05, 2.0, k, 1.0) <= 1e-6
    assert privacy_loss.delta(0.1, 2.0, k, 1.0) > 10 * 1e-6


# -- the audit replays the rule ----------------------------------------------------------------

def _forge(ledger: MemoryLedger, n: int, describe: dict[str, Any] | None = None) -> None:
    """``n`` debits of the declared step written below the gate (the gate would refuse some)."""
    rule = make_rule("pld", Budget(1.0, 1e-6), step=(0.05, 2.0))
    mech = SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0)
    for _ in range(n):
        with ledger.transaction() as tx:
            prev = tx.account("dataset:d")
            state = rule._step(rule.initial_state() if prev is None else prev.state,
                               mech.charge, 1)
            account = Account("dataset:d", "pld", describe or rule.describe(), state, 0)
            forge_release(ledger, mech, rule, account)


def test_the_audit_flags_a_step_beyond_k_max() -> None:
    k_max = make_rule("pld", Budget(1.0, 1e-6), step=(0.05, 2.0)).k_max
    honest, forged = MemoryLedger(), MemoryLedger()
    _forge(honest, k_max)
    _forge(forged, k_max + 1)
    assert not audit(honest).exit_status & EXIT_BITS["limit"]  # the control: k_max is fine
    assert audit(forged).exit_status & EXIT_BITS["limit"]


def test_the_audit_recomputes_k_max_rather_than_reading_it() -> None:
    """A forged configuration claiming a larger k_max changes nothing: the rule is rebuilt from
    its limit and step."""
    rule = make_rule("pld", Budget(1.0, 1e-6), step=(0.05, 2.0))
    forged = MemoryLedger()
    _forge(forged, rule.k_max + 1, {**rule.describe(), "k_max": 10 ** 6})
    assert audit(forged).exit_status & EXIT_BITS["limit"]


def test_an_honest_accountant_audits_clean_and_records_the_step() -> None:
    acc = Accountant(Budget(1.0, 1e-6), composition="pld", step=(0.05, 2.0), rng=0)
    mech = SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0)
    n = acc.max_releases(mech)
    for _ in range(n):
        acc.release(mech, ROWS)
    assert not acc.can_afford(mech)
    report = audit(acc.ledger)
    assert report.exit_status == 0, [p.message for p in report.problems]
    assert acc.spent().epsilon <= 1.0 and acc.spent().delta == 1e-6


# -- declared in a policy file ---------------------------------------------------------------------

def test_a_policy_file_declares_the_step(tmp_path: Any) -> None:
    """``step = [q, z]`` in a dataset's table: the same k_max as the constructor's; the rule
    refuses a step other than the declared one there too."""
    path = tmp_path / "policy.toml"
    path.write_text('[datasets.train]\ncomposition = "pld"\nstep = [0.05, 2.0]\n'
                    'limit = { epsilon = 1.0, delta = 1e-6 }\n')
    acc = Accountant.from_policy(path, rng=0)
    mech = SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0)
    expected = make_rule("pld", Budget(1.0, 1e-6), step=(0.05, 2.0)).k_max
    assert acc.max_releases(mech, dataset="train") == expected
    acc.release(mech, ROWS, dataset="train")
    with pytest.raises(MechanismNotAllowedError):
        acc.release(SubsampledGaussian(1.0, sampling_rate=0.05, noise="float", sensitivity=1.0), ROWS, dataset="train")
    assert acc.max_releases(mech, dataset="train") == expected - 1
