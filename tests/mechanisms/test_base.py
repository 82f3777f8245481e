"""The ``Mechanism`` base class (issue 28): a mechanism is its class, not its name; what it is
charged is frozen; the sampler is one-shot. Each hole is tested as the attack measured on the old
code (the same figure), with a negative control that re-creates the old behaviour and shows the
attack getting through. Also: integers that are not doubles are refused before the debit.
"""

from __future__ import annotations

import copy
import pickle
import tomllib
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from dpbudget import mechanisms
from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    MechanismNotAllowedError,
    SamplerSpentError,
)
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.findings import EXIT_BITS
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.values.errors import InvalidDataError
from dpbudget.accountant.ledger.record import canonical, step_fragments
from dpbudget.accountant.gate.step import Step
from dpbudget.mechanisms import AboveThreshold, NumericMechanism, Sampler
from dpbudget.mechanisms import base as mechanisms_base
from dpbudget.mechanisms.sampling import OneShotSampler
from dpbudget.policies import Policy
from tests.support import snapshot

TRUE_VALUE = 42.0


def _policy(text: str) -> Policy:
    return Policy.model_validate(tomllib.loads(text))


def _accountant(allowed: str = "", cap: str = "", rng: Any = None) -> Accountant:
    text = "[datasets.people]\nlimit = { epsilon = 10.0 }\n" + allowed + cap
    return Accountant.from_policy(_policy(text), rng=rng)


class Laplace(NumericMechanism):
    """The look-alike the issue measured: the library's name, its parameters and its noise kind,
    and the true value out."""

    def __init__(self, epsilon: float, sensitivity: float = 1.0) -> None:
        self.real = mechanisms.Laplace(epsilon, sensitivity=sensitivity)
        self.declare(Budget(epsilon), noise="exact")

    def params(self) -> dict[str, Any]:
        return self.real.params()

    def draw(self, value: Any, sampler: Sampler) -> Any:
        return value


class Sneaky(mechanisms.Laplace):
    """A subclass of the library's Laplace that releases the true value."""

    def draw(self, value: Any, sampler: Sampler) -> Any:
        return value


class Clipped(NumericMechanism):
    """An honest custom mechanism, admitted by its module-qualified name."""

    def __init__(self, epsilon: float) -> None:
        self.inner = mechanisms.Laplace(epsilon, sensitivity=1.0)
        self.declare(Budget(epsilon), noise="exact")

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.inner.epsilon}

    def draw(self, value: Any, sampler: Sampler) -> Any:
        return self.inner.draw(min(max(value, 0.0), 1.0), sampler)


ALLOW_LAPLACE = 'allowed_mechanisms = ["Laplace"]\n'

# -- 1. allowed_mechanisms by class identity ---------------------------------------------------


def test_a_look_alike_named_laplace_is_refused_by_a_policy_admitting_laplace() -> None:
    """The attack: ``Laplace(0.1)`` of the caller's own making releases the true value as
    "ε = 0.1 Laplace". Now its name is its module and class, which the policy does not list:
    refused, nothing drawn, nothing written."""
    rng = np.random.default_rng(5)
    acc = _accountant(ALLOW_LAPLACE, rng=rng)
    look_alike = Laplace(0.1, sensitivity=1.0)
    assert look_alike.name == f"{__name__}.Laplace"
    before = snapshot(acc.ledger, rng)
    with pytest.raises(MechanismNotAllowedError, match=f"{__name__}.Laplace"):
        acc.release(look_alike, TRUE_VALUE, dataset="people")
    assert snapshot(acc.ledger, rng) == before
    with pytest.raises(MechanismNotAllowedError):
        acc.release(Sneaky(0.1), TRUE_VALUE, dataset="people")
    with pytest.raises(MechanismNotAllowedError):
        acc.release_many([(mechanisms.Laplace(0.1, sensitivity=1.0), 1.0), (look_alike, TRUE_VALUE)],
                         dataset="people")
    assert snapshot(acc.ledger, rng) == before
    # The library's own Laplace is admitted, and adds noise.
    assert acc.release(mechanisms.Laplace(0.1, sensitivity=1.0), TRUE_VALUE, dataset="people") != TRUE_VALUE


def test_negative_control_the_old_name_match_lets_the_look_alike_through(monkeypatch) -> None:
    """With the old naming (the bare class name) the look-alike passes the policy, releases the
    exact true value, is recorded as the library's Laplace with its parameters and exact noise,
    and — identical to a genuine record — the audit cannot tell (docs/auditing.md)."""
    monkeypatch.setattr(mechanisms_base, "mechanism_name", lambda cls: cls.__name__)
    acc = _accountant(ALLOW_LAPLACE)
    assert acc.release(Laplace(0.1, sensitivity=1.0), TRUE_VALUE, dataset="people") == TRUE_VALUE
    record = next(e.record for e in acc.ledger.entries() if e.record.get("kind") == "release")
    assert record["mechanism"] == {"name": "Laplace",
                                   "params": mechanisms.Laplace(0.1, sensitivity=1.0).params()}
    assert record["noise"] == "exact-csprng"
    monkeypatch.undo()
    assert audit(acc.ledger).exit_status == 0


def test_a_custom_class_is_admitted_by_its_qualified_name_only() -> None:
    acc = _accountant(f'allowed_mechanisms = ["{__name__}.Clipped"]\n')
    acc.release(Clipped(0.5), 0.3, dataset="people")
    assert acc.ledger.entries()  # (admitted)
    named = [e.record["mechanism"]["name"] for e in acc.ledger.entries()
             if e.record.get("kind") == "release"]
    assert named == [f"{__name__}.Clipped"]
    with pytest.raises(MechanismNotAllowedError):
        _accountant('allowed_mechanisms = ["Laplace"]\n').release(Clipped(0.5), 0.3,
                                                                   dataset="people")
    # A custom class's bare name admits nothing, so a policy naming it is refused when it is
    # built (issue 30: one validator), with the qualified name suggested.
    with pytest.raises(ValidationError, match=rf"did you mean '{__name__}\.Clipped'\?"):
        _accountant('allowed_mechanisms = ["Clipped"]\n')

    class Local(Clipped):  # defined in a function: its name has <locals>, which no entry names
        pass

    assert "<locals>" in Local(0.5).name
    with pytest.raises(MechanismNotAllowedError):
        acc.release(Local(0.5), 0.3, dataset="people")


@pytest.mark.parametrize("module, qualname", [("dpbudget.mechanisms.laplace", "Laplace"),
                                              (__name__, "Clipped"), ("dpbudget.mechanisms", "Laplace")])
def test_a_class_posing_under_another_class_name_cannot_be_built(module: str,
                                                                  qualname: str) -> None:
    """A rewritten ``__module__``/``__qualname__`` does not make a class another one: the name
    must lead to the class itself, or it is refused before its constructor runs."""
    poser = type("Poser", (Clipped,), {"__module__": module, "__qualname__": qualname})
    with pytest.raises(TypeError, match="is not the class its module holds"):
        poser(0.5)


def test_policy_validation_takes_qualified_names_and_refuses_malformed_ones() -> None:
    ok = _policy('[datasets.a]\nlimit = { epsilon = 1.0 }\n'
                 'allowed_mechanisms = ["Laplace", "mypkg.mech.Clipped"]\n')
    assert ok.datasets["a"].allowed_mechanisms == ("Laplace", "mypkg.mech.Clipped")
    for bad in ("mypkg..Clipped", ".Clipped", "mypkg.", "a.<locals>.B", "has space", "x" * 300):
        with pytest.raises(Exception, match="allowed_mechanisms"):
            _policy(f'[datasets.a]\nlimit = {{ epsilon = 1.0 }}\nallowed_mechanisms = ["{bad}"]\n')


# -- 2. what is charged is frozen; caps on the charge the debit uses ---------------------------


@pytest.mark.parametrize("member", ["name", "cost", "noise", "charge"])
def test_a_subclass_defining_what_it_is_charged_or_recorded_as_is_refused(member: str) -> None:
    """The attack: declare ε = 0.9 and let ``cost`` say 0.1 (so a 0.5 cap admits it). Now the
    class cannot be created."""
    with pytest.raises(TypeError, match=f"may not define {member}"):
        class Cheap(NumericMechanism):
            def __init__(self) -> None:
                self.declare(Budget(0.9))

            def params(self) -> dict[str, Any]:
                return {}

            def draw(self, value: Any, sampler: Sampler) -> Any:
                return value + sampler.laplace(1.0)

            locals()[member] = property(lambda self: Budget(0.1))


class _Poser(NumericMechanism):
    """A custom class that takes a genuine Laplace's name and charge after its class statement,
    and releases the true value (found by review)."""

    def __init__(self) -> None:
        self.declare(Budget(0.1), noise="exact")

    def params(self) -> dict[str, Any]:
        return mechanisms.Laplace(0.1, sensitivity=1.0).params()

    def draw(self, value: Any, sampler: Sampler) -> Any:
        return value


@pytest.mark.parametrize("member", ["name", "charge", "cost", "noise"])
def test_members_assigned_after_the_class_statement_are_refused(member: str) -> None:
    genuine = mechanisms.Laplace(0.1, sensitivity=1.0)
    with pytest.raises(TypeError, match=f"{member} is fixed"):
        setattr(_Poser, member, getattr(genuine, member))
    with pytest.raises(TypeError, match=f"{member} is fixed"):
        delattr(mechanisms.Mechanism, member)


def test_negative_control_members_assigned_past_the_guard_pose_as_laplace() -> None:
    """``type.__setattr__`` is what a metaclass without the guard does: the poser passes the
    policy as "Laplace" and releases the true value."""
    poser = type("_Poser", (_Poser,), {"__module__": __name__,
                                       "__qualname__": "f.<locals>._Poser"})
    genuine = mechanisms.Laplace(0.1, sensitivity=1.0)
    type.__setattr__(poser, "name", genuine.name)
    type.__setattr__(poser, "charge", genuine.charge)
    acc = _accountant(ALLOW_LAPLACE)
    assert acc.release(poser(), TRUE_VALUE, dataset="people") == TRUE_VALUE


class _Declares09(NumericMechanism):
    def __init__(self) -> None:
        self.declare(Budget(0.9))

    def params(self) -> dict[str, Any]:
        return {}

    def draw(self, value: Any, sampler: Sampler) -> Any:
        return value + sampler.laplace(1.0 / 0.9)


CAP = "max_per_query = { epsilon = 0.5 }\n"


def test_a_cap_is_checked_on_the_charge_even_if_cost_could_lie(monkeypatch) -> None:
    """Negative control and defence in depth: with the class-creation check switched off, a
    subclass's ``cost`` says 0.1 while its charge is 0.9. The old check (the cap on ``cost``)
    admits it; the gate checks the charge it debits and refuses it everywhere, drawing and
    writing nothing."""
    monkeypatch.setattr(mechanisms_base, "_FINAL", frozenset())

    class Lying(_Declares09):
        @property
        def cost(self) -> Budget:  # type: ignore[override]
            return Budget(0.1)

    m = Lying()
    assert m.cost == Budget(0.1) and m.charge.epsilon == 0.9
    rng = np.random.default_rng(3)
    acc = _accountant(cap=CAP, rng=rng)
    cap = acc.limit("people").max_per_query
    assert cap is not None and cap.admits(m.cost)  # what the old gate checked: admitted
    before = snapshot(acc.ledger, rng)
    with pytest.raises(BudgetExceededError) as info:
        acc.release(m, 1.0, dataset="people")
    assert info.value.requested == Budget(0.9)
    with pytest.raises(BudgetExceededError):
        acc.release_many([(m, 1.0)], dataset="people")
    assert not acc.can_afford(m, dataset="people")
    assert snapshot(acc.ledger, rng) == before
    with acc.pipeline("p", dataset="people", budget=Budget(2.0)) as pipe:  # (its allocation)
        with pytest.raises(BudgetExceededError):
            pipe.release(m, 1.0)
    assert [e for e in acc.ledger.entries() if e.record.get("kind") == "release"] == []


def test_a_declared_09_is_refused_under_a_05_cap() -> None:
    rng = np.random.default_rng(3)
    acc = _accountant(cap=CAP, rng=rng)
    before = snapshot(acc.ledger, rng)
    with pytest.raises(BudgetExceededError, match="max_per_query"):
        acc.release(_Declares09(), 1.0, dataset="people")
    assert snapshot(acc.ledger, rng) == before


def test_rho_mu_and_rdp_are_read_once_at_construction() -> None:
    """A tighter cost is declared through ``rho``/``mu``/``rdp``, read into the charge when the
    constructor returns: a property that changes its answer later changes nothing charged."""
    answers = iter([0.01, 0.0, 0.0, 0.0])

    class Drifting(_Declares09):
        @property
        def rho(self) -> float | None:
            return next(answers)

    m = Drifting()
    assert m.charge.rho == 0.01
    assert m.rho == 0.0 and m.charge.rho == 0.01  # the live property moved; the charge did not
    acc = Accountant(Budget(10.0), composition="advanced")
    acc.release(m, 1.0)
    record = [e.record for e in acc.ledger.entries()][-1]
    assert record["cost"]["rho"] == 0.01


# -- 3. the one-shot sampler -------------------------------------------------------------------


class Hoarder(NumericMechanism):
    """The attack: keep the sampler an admitted ``draw`` received, and draw with it in
    ``prepare`` of later requests — which the accountant runs before it refuses them."""

    kept: list[Any] = []
    stolen: list[float] = []

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon
        self.declare(Budget(epsilon))

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon}

    def prepare(self, value: Any) -> Any:
        x = super().prepare(value)
        for sampler in Hoarder.kept:
            try:
                Hoarder.stolen.append(x + sampler.laplace(1.0 / self.epsilon))
            except SamplerSpentError:
                pass
            try:
                Hoarder.stolen.append(x + sampler.bits.word() * 0.0)
            except SamplerSpentError:
                pass
        return x

    def draw(self, value: Any, sampler: Sampler) -> Any:
        Hoarder.kept.append(sampler)
        return value + sampler.laplace(1.0 / self.epsilon)


def _hoard(n: int = 100) -> int:
    Hoarder.kept, Hoarder.stolen = [], []
    acc = Accountant(Budget(1.0))
    acc.release(Hoarder(1.0), TRUE_VALUE)
    for _ in range(n):
        with pytest.raises(BudgetExceededError):
            acc.release(Hoarder(1.0), TRUE_VALUE)
    return len(Hoarder.stolen)


def test_100_refused_requests_draw_0_noisy_answers() -> None:
    assert _hoard(100) == 0


def test_negative_control_the_old_shared_sampler_gives_100_answers(monkeypatch) -> None:
    """The old gate handed every ``draw`` its own sampler: kept, it draws for refused requests."""
    monkeypatch.setattr(Sampler, "once", lambda self, draw, value: draw(value, self))
    assert _hoard(100) == 200  # (two draws per refused request: the sampler and its bits)


def test_a_spent_sampler_cannot_be_copied_back_to_life() -> None:
    Hoarder.kept = []
    Accountant(Budget(1.0)).release(Hoarder(1.0), 1.0)
    (sampler,) = Hoarder.kept
    for clone in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            clone(sampler.bits)
    for clone in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            clone(sampler)
    with pytest.raises(SamplerSpentError):
        sampler.bits.word()


def test_a_session_sampler_ends_with_the_session() -> None:
    kept: list[Any] = []

    class Keeper(AboveThreshold):
        def _open(self, sampler: Any) -> Any:
            kept.append(sampler)
            return super()._open(sampler)

    acc = Accountant(Budget(1.0))
    session = acc.session(Keeper(0.5, threshold=10.0, sensitivity=1.0))
    assert isinstance(kept[0].bits.word(), int)
    session.close()
    with pytest.raises(SamplerSpentError):
        kept[0].laplace(1.0)


def test_the_release_path_stays_one_lease_per_release() -> None:
    """Each release gets its own sampler; the accountant's own source is never handed out."""
    seen: list[Any] = []

    class Seer(Clipped):
        def draw(self, value: Any, sampler: Sampler) -> Any:
            seen.append(sampler)
            return super().draw(value, sampler)

    acc = Accountant(Budget(10.0))
    acc.release(Seer(0.5), 0.5)
    acc.release(Seer(0.5), 0.5)
    assert len({id(s) for s in seen}) == 2 and all(isinstance(s, OneShotSampler) for s in seen)
    assert acc._gate.sampler not in seen  # noqa: SLF001 - the source itself stays private


# -- 4. the audit: a record claiming a library mechanism its parameters do not give ------------


def _forge(acc: Accountant, name: str, params: dict[str, Any], charge: Charge,
           noise: str = "exact") -> None:
    """A release record written through the gate's own debit (a valid chain) describing
    ``name`` with ``params`` and ``charge``: what a writer of old code, or a forger, records."""
    step = Step(name, charge.budget, charge,
                {**step_fragments(name, params, charge), "noise": canonical(noise)})
    gate = acc._gate  # noqa: SLF001 - the test writes what the public API no longer can
    gate.debit(step, gate.plan(("default", None, None)), None)


LAPLACE_01 = mechanisms.Laplace(0.1, sensitivity=1.0)


@pytest.mark.parametrize("params, charge, noise", [
    (mechanisms.Laplace(0.9, sensitivity=1.0).params(), LAPLACE_01.charge, "exact"),     # ε 0.9 charged 0.1
    (mechanisms.Laplace(0.1, noise="float", sensitivity=1.0).params(), LAPLACE_01.charge, "exact"),  # noise
    ({}, LAPLACE_01.charge, "exact"),                                   # a custom class's params
    ({"epsilon": 0.1, "sensitivity": -1.0}, LAPLACE_01.charge, "exact"),  # does not rebuild
    (LAPLACE_01.params(), Charge(0.1, 0.0, rho=1e-9), "exact"),          # a ρ it does not have
], ids=["cost", "noise", "foreign-params", "invalid", "rho"])
def test_the_audit_flags_a_record_its_library_mechanism_cannot_give(params, charge,
                                                                    noise) -> None:
    acc = Accountant(Budget(10.0))
    acc.release(mechanisms.Laplace(0.1, sensitivity=1.0), 1.0)
    assert audit(acc.ledger).exit_status == 0  # a genuine record audits clean
    _forge(acc, "Laplace", params, charge, noise)
    report = audit(acc.ledger)
    assert report.exit_status == EXIT_BITS["release"]
    (problem,) = report.problems
    assert problem.kind == "release" and problem.seq == 2  # (1: the genuine one)
    assert "names the library mechanism Laplace" in problem.message


def test_the_audit_flags_a_batch_item_its_library_mechanism_cannot_give() -> None:
    acc = Accountant(Budget(10.0, 1e-5))
    acc.release_many([(mechanisms.Laplace(0.1, sensitivity=1.0), 1.0), (mechanisms.Gaussian(0.5, delta=1e-6, sensitivity=1.0), 1.0)])
    assert audit(acc.ledger).exit_status == 0
    honest = Step.batch((mechanisms.Laplace(0.1, sensitivity=1.0), mechanisms.Gaussian(0.5, delta=1e-6, sensitivity=1.0)))
    items = [{"name": "Laplace", "params": mechanisms.Laplace(0.9, sensitivity=1.0).params(),
              "cost": {"epsilon": 0.1, "delta": 0.0}},
             {"name": "Gaussian", "params": mechanisms.Gaussian(0.5, delta=1e-6, sensitivity=1.0).params(),
              "cost": {"epsilon": 0.5, "delta": 1e-6}}]
    forged = step_fragments("batch", {"items": items}, honest.charge)
    acc._gate.debit(honest._replace(members={**honest.members, **forged}),  # noqa: SLF001
                    acc._gate.plan(("default", None, None)), None)  # noqa: SLF001
    report = audit(acc.ledger)
    assert report.exit_status == EXIT_BITS["release"]
    assert "item 0" in report.problems[0].message


def test_the_audit_flags_a_batch_items_forged_curve() -> None:
    """Found by review: the replay charges a batch item's whole recorded cost (its RDP curve
    too), so that is what the item must rebuild to. A curve far cheaper than the mechanism's,
    with its genuine (ε, δ), is flagged; the honest batch audits clean."""
    acc = Accountant(Budget(3.0, 1e-5), composition="renyi")
    sgm = mechanisms.SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0)
    honest = Step.batch((sgm,))
    plan = acc._gate.plan(("default", None, None))  # noqa: SLF001
    acc._gate.debit(honest, plan, None)  # noqa: SLF001
    assert audit(acc.ledger).exit_status == 0
    part = honest.charge.parts[0]._replace(rdp=("poisson-discrete-gaussian", 1e-6, 100.0))
    cheap = honest.charge._replace(parts=(part,))
    items = [{"name": "SubsampledGaussian", "params": sgm.params(),
              "cost": {"epsilon": part.epsilon, "delta": part.delta}}]
    forged = step_fragments("batch", {"items": items}, cheap)
    acc._gate.debit(honest._replace(members={**honest.members, **forged}, charge=cheap),  # noqa: SLF001
                    plan, None)
    report = audit(acc.ledger)
    assert report.exit_status == EXIT_BITS["release"]
    assert "item 0" in report.problems[0].message and "rdp" in report.problems[0].message


def test_the_audit_cannot_tell_an_old_look_alike_with_genuine_parameters() -> None:
    """What the audit cannot see (docs/auditing.md): a record of a look-alike with exactly a
    genuine release's name, parameters, cost and noise is the library's record, byte for byte.
    Only old code could write it (the gate now records a custom class under its own name)."""
    acc = Accountant(Budget(10.0))
    _forge(acc, "Laplace", LAPLACE_01.params(), LAPLACE_01.charge)
    assert audit(acc.ledger).exit_status == 0


@pytest.mark.parametrize(("make", "value"), [
    (lambda: mechanisms.Laplace(1.0, sensitivity=1.0), 2 ** 60 + 128),
    (lambda: mechanisms.Laplace(1.0, sensitivity=1.0), np.array([1, 2 ** 60 + 128], dtype=np.int64)),
    (lambda: mechanisms.Exponential(1.0, candidates=["a", "b"], sensitivity=1.0), np.array([2 ** 60 + 128, 2 ** 60], dtype=np.int64)),
    (lambda: mechanisms.ReportNoisyMax(1.0, candidates=["a", "b"], sensitivity=1.0), [2 ** 60 + 129, 1]),
])
def test_integers_that_are_not_doubles_are_refused_before_the_debit(make, value) -> None:
    """2^60 + 128 and 2^60 + 129 are neighbours (Δ = 1) that become doubles 256 apart: refused,
    nothing drawn or debited, and the value is not shown."""
    acc = Accountant(Budget(10.0), rng=0)
    with pytest.raises(InvalidDataError) as info:
        acc.release(make(), value)
    assert "2^53" in str(info.value) and str(2 ** 60 + 128) not in str(info.value)
    assert acc.spent() == Budget(0.0)
    assert acc.release(make(), 2 ** 53 if not hasattr(value, "__len__") else [2 ** 53, 0]) \
        is not None
