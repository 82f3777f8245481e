"""How a mechanism's sensitivity is stated (``mechanisms.sensitivity``): true values are named as
such, and a mechanism's sensitivity comes from the query (issue 30).

The issue's figures, as attacks:

- ``acc.release(dp.Laplace(.1), dp.clamped_sum(x, 0, 250_000).value)`` drew noise of scale 10
  where the sum's sensitivity asks for 2.5 million (Δ silently 1), and passing the ``Query`` itself
  was refused. Now the plain number is refused (no default Δ), and the ``Query`` is released at its
  own sensitivity (L1 for the Laplace family, L2 for the Gaussian family).
- ``dp.count``, ``dp.clamped_sum``, ``dp.histogram`` returned true values beside the private
  releases. Now they are ``dp.queries.true_count``... and the old names point there.

Each attack that could pass vacuously has a negative control: the old behaviour re-created with
monkeypatch lets the attack through.
"""

from __future__ import annotations

import json
import math
import sys
import types
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpbudget as dp
from dpbudget.accountant import (
    Accountant, Budget, InvalidArgumentError, InvalidTypeError, MechanismNotAllowedError,
    PrivacyError,
)
from dpbudget.accountant.audit.run import audit
from dpbudget.mechanisms import (AnalyticGaussian, DiscreteGaussian, DiscreteLaplace, Exponential,
                        Gaussian, Laplace, NumericMechanism, Quantile, ReportNoisyMax,
                        SubsampledGaussian)
from dpbudget.mechanisms.base import mechanism_name
from dpbudget.mechanisms.queries import (
    Neighbouring, Query, bind, true_clamped_sum, true_count, true_histogram,
)
from dpbudget.mechanisms.sensitivity import rounded_up
from tests.support import release_entries, snapshot

INCOMES = [12_000.0, 250_000.0, 48_500.0, 99_999.0]
CANARY = 987654.321


def _acc(rng: Any = 0) -> Accountant:
    return Accountant(Budget(10.0, 1e-3), rng=rng)


def _mechanism(acc: Accountant, seq: int = -1) -> dict[str, Any]:
    """The ``mechanism`` member of a release record (the last one by default)."""
    record: dict[str, Any] = json.loads(release_entries(acc.ledger)[seq].text)["mechanism"]
    return record


# -- the figure: Δ silently 1 ------------------------------------------------------------

def test_a_sum_released_as_a_plain_number_is_refused_not_noised_at_scale_10() -> None:
    rng = np.random.default_rng(1)
    acc = _acc(rng)
    before = snapshot(acc.ledger, rng)
    with pytest.raises(InvalidArgumentError) as info:
        acc.release(dp.Laplace(.1), true_clamped_sum(INCOMES, 0, 250_000).value, dataset="s")
    assert info.value.argument == "sensitivity"
    assert "sensitivity=" in str(info.value) and "dp.queries" in str(info.value)
    assert snapshot(acc.ledger, rng) == before  # nothing drawn, nothing debited


def test_negative_control_a_default_sensitivity_of_1_noises_the_sum_at_scale_10(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old constructor (Δ defaulting to 1), re-created: the same call goes through, with
    noise of scale 10 on a sum one person can move by 250,000."""
    monkeypatch.setattr(Laplace.__init__, "__kwdefaults__", {"sensitivity": 1.0,
                                                             "noise": "exact"})
    acc = _acc()
    acc.release(dp.Laplace(.1), true_clamped_sum(INCOMES, 0, 250_000).value, dataset="s")
    assert _mechanism(acc)["params"]["scale"] == pytest.approx(10.0)  # (Δ/ε, rounded up)


def test_the_query_itself_is_released_at_its_own_sensitivity() -> None:
    acc = _acc()
    acc.release(dp.Laplace(.1), true_clamped_sum(INCOMES, 0, 250_000), dataset="s")
    params = _mechanism(acc)["params"]
    assert params["sensitivity"] == 250_000.0 and params["scale"] == pytest.approx(2.5e6)
    assert acc.spent("s") == Budget(0.1)  # binding changes Δ, never the cost charged


def test_negative_control_without_binding_the_query_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old gate (no binding), re-created: the Query is taken as the value and refused."""
    import dpbudget.accountant.gate.gate as gate_module

    monkeypatch.setattr(gate_module, "bind", lambda m, v: (m, v))
    acc = _acc()
    with pytest.raises(PrivacyError):
        acc.release(dp.Laplace(.1), true_clamped_sum(INCOMES, 0, 250_000), dataset="s")
    assert release_entries(acc.ledger) == []


# -- the stated sensitivity, the norm ------------------------------------------------------------

def test_a_stated_sensitivity_below_the_query_is_refused_and_debits_nothing() -> None:
    rng = np.random.default_rng(2)
    acc = _acc(rng)
    before = snapshot(acc.ledger, rng)
    query = true_clamped_sum(INCOMES, 0, 250_000)
    for mechanism in (Laplace(.1, sensitivity=1.0), Gaussian(.5, delta=1e-6, sensitivity=1.0)):
        with pytest.raises(InvalidArgumentError) as info:
            acc.release(mechanism, query, dataset="s")
        assert info.value.argument == "sensitivity"
    with pytest.raises(InvalidArgumentError):  # in a batch: the whole batch, nothing debited
        acc.release_many([(Laplace(.1), true_count(INCOMES)),
                          (Laplace(.1, sensitivity=249_999.0), query)], dataset="s")
    assert snapshot(acc.ledger, rng) == before


def test_a_stated_sensitivity_at_or_above_the_query_is_kept() -> None:
    acc = _acc()
    query = true_clamped_sum(INCOMES, 0, 250_000)
    acc.release(Laplace(.1, sensitivity=250_000.0), query, dataset="s")
    acc.release(Laplace(.1, sensitivity=300_000.0), query, dataset="s")
    assert [_mechanism(acc, i)["params"]["sensitivity"] for i in (0, 1)] == [250_000.0,
                                                                             300_000.0]


def test_the_gaussian_family_takes_l2_and_the_laplace_family_l1() -> None:
    query = true_histogram(["a", "b", "a"], ["a", "b", "c"], neighbouring="replace")
    assert (query.l1_sensitivity, query.l2_sensitivity) == (2.0, math.sqrt(2.0))
    acc = _acc()
    acc.release(Laplace(.1), query, dataset="s")
    acc.release(DiscreteLaplace(.1), query, dataset="s")
    acc.release(AnalyticGaussian(.5, delta=1e-6), query, dataset="s")
    acc.release(Gaussian(.5, delta=1e-6), query, dataset="s")
    got = [_mechanism(acc, i)["params"]["sensitivity"] for i in range(4)]
    assert got == [2.0, 2, math.sqrt(2.0), math.sqrt(2.0)]
    acc.release(DiscreteGaussian(.5, delta=1e-6), true_count(INCOMES), dataset="s")
    assert _mechanism(acc)["params"]["sensitivity"] == 1


def test_negative_control_a_gaussian_declared_l1_takes_the_wider_l1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The norm is the class's declaration, and the test above tells the two apart."""
    monkeypatch.setattr(AnalyticGaussian, "query_norm", "l1")
    acc = _acc()
    acc.release(AnalyticGaussian(.5, delta=1e-6),
                true_histogram(["a"], ["a", "b"], neighbouring="replace"), dataset="s")
    assert _mechanism(acc)["params"]["sensitivity"] == 2


def test_an_integer_mechanism_refuses_a_non_integer_sensitivity_typed() -> None:
    acc = _acc()
    query = true_histogram(["a"], ["a", "b"], neighbouring="replace")  # Δ₂ = √2
    with pytest.raises(InvalidTypeError) as info:
        acc.release(DiscreteGaussian(.5, delta=1e-6), query, dataset="s")
    assert info.value.argument == "sensitivity" and release_entries(acc.ledger) == []


def test_binding_keeps_every_other_parameter() -> None:
    acc = _acc()
    acc.release(Laplace(.25, noise="float"), true_count(INCOMES), dataset="s")
    record = json.loads(release_entries(acc.ledger)[-1].text)
    params = record["mechanism"]["params"]
    assert params == {"epsilon": .25, "sensitivity": 1.0, "scale": params["scale"],
                      "noise": "float"} and params["scale"] == pytest.approx(4.0)
    assert record["noise"].startswith("float-")


@pytest.mark.parametrize("forged", [math.nan, math.inf, 0.0, -1.0, "1"])
def test_a_forged_query_sensitivity_is_refused(forged: Any) -> None:
    acc = _acc()
    query = Query(3, forged, forged, Neighbouring.ADD_REMOVE)
    with pytest.raises((InvalidArgumentError, InvalidTypeError)):
        acc.release(Laplace(.1), query, dataset="s")
    with pytest.raises((InvalidArgumentError, InvalidTypeError)):  # even under a stated Δ
        acc.release(Laplace(.1, sensitivity=1e9), query, dataset="s")
    assert release_entries(acc.ledger) == []


# -- no default sensitivity ------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism, value", [
    (lambda: Laplace(.1), 3.0), (lambda: Laplace(.1, noise="float"), [1.0, 2.0]),
    (lambda: DiscreteLaplace(.1), 3), (lambda: Gaussian(.5, delta=1e-6), 3.0),
    (lambda: AnalyticGaussian(.5, delta=1e-6), 3.0),
    (lambda: DiscreteGaussian(.5, delta=1e-6), 3)], ids=lambda x: getattr(x, "__name__", ""))
def test_a_plain_number_without_sensitivity_draws_and_debits_nothing(mechanism: Any,
                                                                    value: Any) -> None:
    rng = np.random.default_rng(3)
    acc = _acc(rng)
    before = snapshot(acc.ledger, rng)
    for release in (lambda: acc.release(mechanism(), value, dataset="s"),
                    lambda: acc.release_many([(mechanism(), value)], dataset="s")):
        with pytest.raises(InvalidArgumentError) as info:
            release()
        assert info.value.argument == "sensitivity"
    assert snapshot(acc.ledger, rng) == before


def test_mechanisms_that_take_no_query_require_sensitivity_and_refuse_a_query() -> None:
    with pytest.raises(TypeError):
        Exponential(1.0, candidates=["a", "b"])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ReportNoisyMax(1.0, candidates=["a", "b"])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        SubsampledGaussian(1.0, sampling_rate=0.1)  # type: ignore[call-arg]
    with pytest.raises(InvalidArgumentError) as info:  # ε from σ/Δ: Δ cannot come later
        AnalyticGaussian(sigma=2.0, delta=1e-6)
    assert info.value.argument == "sensitivity"
    acc = _acc()
    query = true_count(INCOMES)
    for mechanism in (Exponential(1.0, candidates=["a", "b"], sensitivity=1.0),
                      Quantile(1.0, q=0.5, lower=0, upper=10),
                      SubsampledGaussian(1.0, sampling_rate=0.1, sensitivity=1.0)):
        with pytest.raises(InvalidTypeError) as info:
            acc.release(mechanism, query, dataset="s")
        assert info.value.argument == "value"
    assert release_entries(acc.ledger) == []


# -- every path that reaches the gate ----------------------------------------------------------

def test_release_many_binds_each_item() -> None:
    acc = _acc()
    acc.release_many([(Laplace(.1), true_count(INCOMES)),
                      (AnalyticGaussian(.5, delta=1e-6), true_clamped_sum(INCOMES, 0, 1_000)),
                      (Laplace(.1, sensitivity=1.0), 2.0)], dataset="s")
    items = _mechanism(acc)["params"]["items"]
    assert [i["params"]["sensitivity"] for i in items] == [1.0, 1_000.0, 1.0]


def test_a_pipeline_and_a_budgeted_function_take_queries() -> None:
    acc = _acc()
    with acc.pipeline("r", dataset="s", budget=Budget(1.0, 1e-5)) as p:
        p.release(Laplace(.1), true_clamped_sum(INCOMES, 0, 500))
        p.release_many([(Laplace(.1), true_count(INCOMES)),
                        (Gaussian(.5, delta=1e-6), true_clamped_sum(INCOMES, 0, 700))])
        with pytest.raises(InvalidArgumentError):
            p.release(Laplace(.1), 3.0)
        assert math.isclose(p.spent().epsilon, 0.7)

    @acc.budgeted("f", dataset="s", budget=Budget(0.5))
    def released_count(handle: Any) -> float:
        return float(handle.release(Laplace(.2), true_count(INCOMES)))

    released_count()
    records = [json.loads(e.text) for e in release_entries(acc.ledger)]
    sensitivities = [r["mechanism"]["params"].get("sensitivity") for r in records
                     if r["kind"] == "release"]
    assert 500.0 in sensitivities and 1.0 in sensitivities


def test_the_audit_is_clean_on_a_ledger_written_with_query_releases(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with Accountant(Budget(10.0, 1e-3), ledger=url) as acc:
        acc.release(Laplace(.1), true_clamped_sum(INCOMES, 0, 250_000), dataset="s")
        acc.release(AnalyticGaussian(.5, delta=1e-6), true_histogram(["a"], ["a", "b"]),
                    dataset="s")
        acc.release(DiscreteLaplace(.1), true_count(INCOMES), dataset="s")
        acc.release_many([(Gaussian(.5, delta=1e-6), true_count(INCOMES)),
                          (Laplace(.1), true_clamped_sum(INCOMES, -5, 5))], dataset="s")
    report = audit(url)
    assert report.problems == [] and report.by_dataset["s"].releases == 4


# -- true values are named as such -------------------------------------------------------------

@pytest.mark.parametrize("old, new", [("count", "true_count"), ("clamped_sum", "true_clamped_sum"),
                                      ("histogram", "true_histogram")])
def test_the_flat_true_value_helpers_are_gone_with_a_pointer(old: str, new: str) -> None:
    with pytest.raises(AttributeError) as info:
        getattr(dp, old)
    assert f"dp.queries.{new}" in str(info.value) and "NOT PRIVATE" in str(info.value)
    assert old not in dp.__all__ and callable(getattr(dp.queries, new))
    from dpbudget import mechanisms

    assert not hasattr(mechanisms, old)


def test_a_query_says_it_is_the_true_answer_and_never_shows_it() -> None:
    query = dp.queries.true_clamped_sum([CANARY], 0, 1e7)
    assert "TRUE, NOT PRIVATE" in repr(query) and "987654" not in repr(query)
    assert "987654" not in str(query)
    assert "NOT PRIVATE" in (dp.queries.true_count.__doc__ or "")
    assert dp.queries.Query is dp.Query and dp.queries.Neighbouring is dp.Neighbouring


def test_the_audit_flags_a_record_of_a_mechanism_with_no_sensitivity(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sensitivity may now be None on a constructor, so a forged record with ``sensitivity:
    null`` rebuilds a mechanism; no release can be recorded so (the gate refuses it)."""
    from dpbudget.accountant.audit.release import LibraryRecords
    from dpbudget.accountant.ledger.record import charge_record

    def record(mechanism: Any) -> dict[str, Any]:
        return {"kind": "release", "noise": "exact-csprng", "cost": charge_record(
            mechanism.charge), "mechanism": {"name": mechanism.name,
                                             "params": mechanism.params()}}

    for unstated in (Laplace(.1), AnalyticGaussian(.5, delta=1e-6), DiscreteLaplace(.1)):
        assert "sensitivity unstated" in (LibraryRecords().check(record(unstated), False) or "")
    # Negative control: the same records with Δ stated are what the library writes.
    for stated in (Laplace(.1, sensitivity=1.0), AnalyticGaussian(.5, delta=1e-6,
                                                                 sensitivity=1.0)):
        assert LibraryRecords().check(record(stated), False) is None
    # Negative control: without the check (re-created: Laplace taking no Query, so it is not
    # asked), the forged record would pass as a genuine release.
    monkeypatch.setattr(Laplace, "query_norm", None)
    assert LibraryRecords().check(record(Laplace(.1)), False) is None


# -- where a bound sensitivity could fall below the query's, or a plan disagree with the debit
# (attacks on the first version of query binding) --------------------------------------------------


def test_planning_an_unbound_gaussian_is_refused_not_priced_at_delta_one() -> None:
    acc = Accountant(Budget(8.0, 1e-5), composition="advanced")
    unbound = DiscreteGaussian(0.7, delta=1e-9)
    bound, _ = bind(unbound, Query(5, 2.0, 2.0, Neighbouring.ADD_REMOVE))
    # The attack's figures: the unbound charge plans one release more than the bound one admits.
    assert unbound.charge.rho is not None and bound.charge.rho is not None
    assert bound.charge.rho > unbound.charge.rho
    assert acc.max_releases(bound) == 146
    for plan in (acc.max_releases, acc.can_afford):
        with pytest.raises(InvalidArgumentError) as refused:
            plan(unbound)
        assert refused.value.argument == "sensitivity"
    with pytest.raises(InvalidArgumentError):
        acc.can_afford(AnalyticGaussian(0.5, delta=1e-6))
    assert acc.can_afford(Laplace(0.5))  # ε alone: the same charge at every Δ
    assert acc.spent().epsilon == 0.0


def test_a_query_subclass_is_refused() -> None:
    class Cheap(Query):
        @property
        def l1_sensitivity(self) -> float:  # type: ignore[override]
            return 1e-12

    forged = Cheap(10**6, 1.0, 1.0, Neighbouring.ADD_REMOVE)
    with pytest.raises(InvalidTypeError):
        bind(Laplace(1.0, noise="float"), forged)
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(InvalidTypeError):
        acc.release(Laplace(1.0, noise="float"), forged)
    assert acc.spent().epsilon == 0.0


@pytest.mark.parametrize("delta", [Fraction(1, 3), Fraction(2, 7), 2**53 + 1, 10**17 + 3])
def test_a_rational_sensitivity_is_never_rounded_below_itself(delta: Any) -> None:
    query = Query(Fraction(1), delta, delta, Neighbouring.ADD_REMOVE)
    for mechanism in (Laplace(1.0), AnalyticGaussian(1.0, delta=1e-6)):
        bound, _ = bind(mechanism, query)
        assert Fraction(bound.sensitivity) >= delta
    assert Fraction(Laplace(1.0, sensitivity=delta).sensitivity) >= delta
    if isinstance(delta, int):
        bound, _ = bind(DiscreteLaplace(1.0), Query(7, delta, delta, Neighbouring.ADD_REMOVE))
        assert bound.sensitivity >= delta


def test_negative_control_the_nearest_double_is_below_these() -> None:
    assert Fraction(float(Fraction(1, 3))) < Fraction(1, 3)
    assert float(2**53 + 1) < 2**53 + 1


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "p.toml"
    path.write_text('[datasets.d]\nlimit = { epsilon = 1.0 }\nallowed_mechanisms = ["Laplace"]\n')
    return path


def test_a_class_posing_under_the_library_package_is_not_a_library_mechanism(
        tmp_path: Path) -> None:
    fake = types.ModuleType("dpbudget.mechanisms.fake")
    code = ("from dpbudget.mechanisms import NumericMechanism\n"
            "from dpbudget.accountant.values.budget import Budget\n"
            "class Laplace(NumericMechanism):\n"
            "    def __init__(self, epsilon):\n"
            "        self.declare(Budget(epsilon))\n"
            "    def params(self):\n"
            "        return {}\n"
            "    def draw(self, value, sampler):\n"
            "        return value  # no noise at all\n")
    sys.modules[fake.__name__] = fake
    try:
        exec(compile(code, "<fake>", "exec"), fake.__dict__)
        fake.Laplace.__module__ = fake.__name__
        assert mechanism_name(fake.Laplace) == "dpbudget.mechanisms.fake.Laplace"
        acc = Accountant.from_policy(_policy(tmp_path), rng=0)
        with pytest.raises(MechanismNotAllowedError):
            acc.release(fake.Laplace(0.1), 42.0, dataset="d")
        assert acc.release(Laplace(0.1, sensitivity=1.0), 42.0, dataset="d") != 42.0
    finally:
        del sys.modules[fake.__name__]
    assert mechanism_name(Laplace) == "Laplace"
    assert issubclass(fake.Laplace, NumericMechanism)


def test_discrete_laplace_takes_an_exact_whole_sum() -> None:
    query = true_clamped_sum([3, 70, 82], lower=0, upper=100)
    assert isinstance(query.value, Fraction) and query.value.denominator == 1
    acc = Accountant(Budget(1.0), rng=0)
    noisy = acc.release(DiscreteLaplace(0.5), query)
    assert isinstance(noisy, int) and math.isfinite(noisy)
    with pytest.raises(Exception):
        acc.release(DiscreteLaplace(0.5, sensitivity=1), Fraction(1, 2))


def test_rounded_up_never_leaves_a_sensitivity_below_what_was_stated() -> None:
    """``rounded_up`` moves a conversion that rounded an exact rational below itself up one
    double, and leaves every other conversion as it was. The negative control: the plain
    conversions of these values are below them."""
    for exact in (Fraction(1, 3), Fraction(2, 3), 2 ** 53 + 1):
        converted = float(exact)
        assert Fraction(converted) < exact  # the control: float() alone rounds down here
        up = rounded_up(exact, converted)
        assert Fraction(up) >= exact and up == math.nextafter(converted, math.inf)
    assert rounded_up(Fraction(1, 10), 0.1) == 0.1  # 0.1 is above 1/10: kept
    assert rounded_up(0.1, 0.1) == 0.1 and rounded_up(True, 1.0) == 1.0 and rounded_up(7, 7) == 7
