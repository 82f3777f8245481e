"""The "pld" rule (issue 29, item 5): a fixed DP-SGD step declared with the budget, composed by
its pessimistic privacy-loss distribution. The issue's figure, exact Gaussian references (mpmath),
dp-accounting as an oracle, the float-error bound of the FFT, refusals that debit nothing, and the
audit replaying the rule (a forged over-count flagged; the honest ledger clean)."""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, MechanismNotAllowedError
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.composition import make_rule, privacy_loss
from dpbudget.accountant.composition.privacy_loss import _PLD, _single
from dpbudget.accountant.ledger import Account, MemoryLedger
from dpbudget.accountant.ledger.base import Entry
from dpbudget.accountant.ledger.record import assemble, record_hash, utc_now
from dpbudget.mechanisms import Laplace, SubsampledGaussian
from tests.support import release_fields, snapshot

ROWS = np.ones((20, 2))


def _gaussian_delta(mu: float, eps: float) -> float:
    """Exact δ(ε) of μ-GDP (the k-fold Gaussian, μ = √k/z): Dong–Roth–Su 2019, Cor. 2.13."""
    mu_, e = mpmath.mpf(mu), mpmath.mpf(eps)
    return float(mpmath.ncdf(-e / mu_ + mu_ / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu_ - mu_ / 2))


# -- the issue's figure ----------------------------------------------------------------------------

def test_the_issues_figure_more_steps_than_renyi() -> None:
    """q = 0.01, z = 1 at (3, 1e-5): the issue measured 2,666 by dp-accounting's PLD and 2,195 by
    the renyi rule. Ours (connect-the-dots on a 1e-4 grid, with float margins) is 2,666 too, and
    never above dp-accounting's answer (the oracle test below)."""
    step = SubsampledGaussian(1.0, sampling_rate=0.01, noise="float", sensitivity=1.0)
    pld = Accountant(Budget(3.0, 1e-5), composition="pld", step=(0.01, 1.0)).max_releases(step)
    renyi = Accountant(Budget(3.0, 1e-5), composition="renyi").max_releases(step)
    assert 2655 <= pld <= 2666
    assert renyi <= 2195 < pld  # the control: the Rényi filter admits ≥ 17 % fewer
    assert pld >= 1.17 * renyi


# -- exact references --------------------------------------------------------------------------------

@pytest.mark.parametrize(("z", "k", "eps"), [(1.0, 1, 1.0), (2.0, 16, 1.0), (4.0, 100, 2.0),
                                              (1.0, 7, 3.0)])
def test_delta_dominates_the_exact_gaussian_and_is_close(z: float, k: int, eps: float) -> None:
    """q = 1 is the Gaussian: k steps are exactly (√k/z)-GDP. The pessimistic δ is never below
    the exact one (to 1e-12, the float error of the reference), and within kΔ of ε of it."""
    exact = _gaussian_delta(k ** 0.5 / z, eps)
    ours = privacy_loss.delta(1.0, z, k, eps)
    assert ours >= exact * (1 - 1e-9) - 1e-15
    looser = _gaussian_delta(k ** 0.5 / z, eps - k * privacy_loss.GRID - 1e-9)
    assert ours <= looser * (1 + 1e-6) + 1e-12


def _exact_single_delta(q: float, z: float, eps: float, remove: bool) -> float:
    """δ(ε) of one Poisson-subsampled Gaussian step, one direction, in mpmath (50 digits):
    P[L > ε] − e^ε Q[L > ε] with the loss's threshold x(ε)."""
    with mpmath.workdps(50):
        q_, z_, e = mpmath.mpf(q), mpmath.mpf(z), mpmath.mpf(eps)

        def tail(a: Any, mean: Any) -> Any:
            return mpmath.ncdf(-(a - mean) / z_)

        if remove:  # L = s(x) > ε ⟺ x > x(ε); P the mixture
            if e <= mpmath.log(1 - q_):
                return float(1 - mpmath.exp(e))
            a = z_ ** 2 * mpmath.log((mpmath.exp(e) - 1 + q_) / q_) + mpmath.mpf(0.5)
            p_tail = (1 - q_) * tail(a, 0) + q_ * tail(a, 1)
            return float(p_tail - mpmath.exp(e) * tail(a, 0))
        if -e <= mpmath.log(1 - q_):  # L = −s(x) > ε ⟺ s(x) < −ε: never
            return 0.0
        a = z_ ** 2 * mpmath.log((mpmath.exp(-e) - 1 + q_) / q_) + mpmath.mpf(0.5)
        below = 1 - tail(a, 0)  # N(0, z²) below a; the mixture below a
        mix_below = (1 - q_) * (1 - tail(a, 0)) + q_ * (1 - tail(a, 1))
        return float(below - mpmath.exp(e) * mix_below)


@pytest.mark.parametrize("remove", [True, False], ids=["remove", "add"])
@pytest.mark.parametrize("eps", [-0.2, 0.0, 0.003, 0.01, 0.05, 0.123456, 0.5, 1.0, 2.0])
def test_one_step_dominates_the_exact_profile_and_touches_it(eps: float, remove: bool) -> None:
    """Connect-the-dots: the one-step δ(ε) is never below the exact one (mpmath), on the grid
    and between its points, and on the grid it is the exact one up to the float margins."""
    q, z = 0.01, 1.0
    exact = _exact_single_delta(q, z, eps, remove)
    ours = _single(q, z, remove).delta(eps)
    assert ours >= exact - 1e-15
    on_grid = abs(eps / privacy_loss.GRID - round(eps / privacy_loss.GRID)) < 1e-6
    if on_grid:
        assert ours <= exact * (1 + 1e-4) + 1e-12


def test_the_profile_check_catches_a_discretisation_on_the_wrong_side() -> None:
    """Negative control for the test above: the same PLD with every loss one grid step *lower*
    (what rounding down would give) falls below the exact profile."""
    one = _single(0.01, 1.0, True)
    low = _PLD(one.p, one.offset - 1, one.inf, one.err)
    eps = 0.5
    assert low.delta(eps) < _exact_single_delta(0.01, 1.0, eps, True) <= one.delta(eps)


def test_k_max_stops_at_its_documented_cap() -> None:
    """A step so weak that more than 2²² fit: the cap, not a larger count (and the control: a
    step that fits fewer is not capped)."""
    assert privacy_loss.max_steps(0.001, 50.0, 3.0, 1e-5) == privacy_loss.MAX_STEPS
    assert 0 < privacy_loss.max_steps(0.002, 10.0, 1.0, 1e-6) < privacy_loss.MAX_STEPS


def test_k_max_of_the_gaussian_is_the_exact_count() -> None:
    """q = 1, z = 20 at (3, 1e-5): exact GDP admits k while δ(√k/20) ≤ 1e-5 (206); ours is that
    k or one step below (the grid's rounding), never above."""
    lo, hi = 1, 4000  # δ grows with k: bisect on the exact δ
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _gaussian_delta(mid ** 0.5 / 20.0, 3.0) <= 1e-5 else (lo, mid)
    ours = privacy_loss.max_steps(1.0, 20.0, 3.0, 1e-5)
    assert lo - 1 <= ours <= lo


def test_the_fft_error_bound_covers_the_float_error() -> None:
    """The bound carried by ``compose`` against a direct (exactly summed, ``math.fsum``)
    convolution, on two single-step PLDs cut short (2,000 points each)."""
    one = _single(0.05, 1.0, True)
    a = one.p[:2000] / one.p[:2000].sum()
    b = one.p[1000:3000] / one.p[1000:3000].sum()
    x, y = _PLD(a, 0, 0.0, 0.0), _PLD(b, 0, 0.0, 0.0)
    fast = np.convolve(a, b)
    c = x.compose(y)
    exact = np.array([np.float64(sum(mpmath.mpf(float(a[i])) * mpmath.mpf(float(b[n - i]))
                                     for i in range(max(0, n - b.size + 1), min(n, a.size - 1) + 1)))
                      for n in range(0, fast.size, 97)])
    got = np.zeros(fast.size)
    got[c.offset:c.offset + c.p.size] = c.p
    assert np.abs(got[::97] - exact).sum() <= c.err
    assert c.err < 1e-10  # and the bound is not vacuous


# -- dp-accounting as the oracle ------------------------------------------------------------------

def _dpa_delta(q: float, z: float, k: int, eps: float) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), k)
    return float(acc.get_delta(eps))


@pytest.mark.slow
@pytest.mark.parametrize(("q", "z", "eps", "delta"), [
    (0.01, 1.0, 3.0, 1e-5), (0.01, 4.0, 3.0, 1e-5), (0.05, 2.0, 1.0, 1e-6), (0.1, 4.0, 3.0, 1e-5), (0.02, 0.8, 2.0, 1e-6),
    (1.0, 10.0, 1.0, 1e-5),
])
def test_k_max_against_dp_accounting(q: float, z: float, eps: float, delta: float) -> None:
    """dp-accounting's pessimistic PLD (1e-4 grid, its connect-the-dots) at our k is within δ_B
    (we are never above its answer), and one more than 1.001 k is over δ_B (we are within
    0.1 %)."""
    k = privacy_loss.max_steps(q, z, eps, delta)
    assert k > 0
    assert _dpa_delta(q, z, k, eps) <= delta
    assert _dpa_delta(q, z, int(1.001 * k) + 1, eps) > delta
    assert privacy_loss.delta(q, z, k, eps) <= delta < privacy_loss.delta(q, z, k + 1, eps)


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
            text = release_fields(mech, "d", [(rule, account)])
            seq, head = ledger._head()
            body = assemble({**text, "v": "1", "seq": str(seq + 1), "prev": f'"{head}"',
                             "time": utc_now(), "auth": '"sha256"'})
            ledger._write_entry(Entry(seq + 1, body, record_hash(body)))
            ledger._write_accounts([account._replace(seq=seq + 1)])


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
