"""One step presented to the gate (``dpbudget.accountant.gate.step``): encoded once per mechanism and
per (class, parameters, charge), so a mechanism is always charged its own cost; one account's
step refuses a rule changed mid-stream; the gate and the audit compute the same state."""

from __future__ import annotations

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.composition import BasicComposition, Refused, make_rule
from dpbudget.accountant.gate.step import Step, step_account
from dpbudget.accountant.ledger import Account
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.values.errors import InvalidArgumentError, LedgerConflictError
from dpbudget.mechanisms import Laplace


def test_a_mechanism_is_charged_its_own_cost_even_if_params_leave_it_out() -> None:
    """The gate reuses encoded steps between equal mechanisms; equality includes the declared
    charge, so a mechanism whose ``params()`` omits what its cost depends on is still charged
    exactly its own cost (an attacker's cheap twin cannot borrow another's record, or vice versa)."""
    from dpbudget.accountant.values.budget import Budget as B
    from dpbudget.mechanisms.base import NumericMechanism

    class Opaque(NumericMechanism):
        def __init__(self, epsilon: float) -> None:
            self.epsilon = epsilon
            self._cost = B(epsilon)

        def params(self) -> dict:
            return {}

        def draw(self, value, sampler):
            return value + sampler.laplace(1.0 / self.epsilon)

    acc = Accountant(Budget(10.0), rng=0)
    for eps in (0.5, 2.0, 0.5, 2.0):
        acc.release(Opaque(eps), 1.0)
    costs = [e.record["cost"]["epsilon"] for e in acc.ledger.entries()]
    assert costs == [0.5, 2.0, 0.5, 2.0]
    assert acc.spent() == Budget(5.0)


def test_a_mechanism_with_its_own_equality_is_charged_its_own_cost() -> None:
    """Review finding: the gate's step cache must go by identity, never by a class's __eq__. A
    class whose equality ignores what its cost depends on must not borrow another's charge."""
    from dpbudget.accountant import BudgetExceededError
    from dpbudget.accountant.values.budget import Budget as B
    from dpbudget.mechanisms.base import NumericMechanism

    class Scaled(NumericMechanism):
        def __init__(self, scale: float, sensitivity: float) -> None:
            self.scale, self.sensitivity = scale, sensitivity
            self._cost = B(sensitivity / scale)

        def params(self) -> dict:
            return {"scale": self.scale}

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Scaled) and other.scale == self.scale

        def __hash__(self) -> int:
            return hash(self.scale)

        def draw(self, value, sampler):
            return value + sampler.laplace(self.scale)

    acc = Accountant(Budget(5.0), rng=0)
    acc.release(Scaled(1.0, 1.0), 1.0)
    with pytest.raises(BudgetExceededError):
        acc.release(Scaled(1.0, 100.0), 1.0)  # declared ε = 100
    assert acc.spent() == Budget(1.0)


def test_a_step_is_encoded_once_per_mechanism_and_per_parameters_and_charge() -> None:
    first = Laplace(0.5, sensitivity=1.0)
    assert Step.of(first) is Step.of(first)  # the same object: no encoding again
    twin = Laplace(0.5, sensitivity=1.0)
    assert Step.of(twin) is Step.of(first)  # equal class, parameters and charge
    other = Step.of(Laplace(0.25, sensitivity=1.0))
    assert other.charge.epsilon == 0.25 and other.members != Step.of(first).members


def test_a_nan_cost_is_refused_before_anything_is_encoded() -> None:
    from dpbudget.mechanisms.base import NumericMechanism

    class Unvalidated(NumericMechanism):
        """A cost built past ``Budget``'s validation (pydantic's ``model_construct``)."""

        def __init__(self) -> None:
            self._cost = Budget.model_construct(epsilon=float("nan"), delta=0.0)

        def params(self) -> dict:
            return {}

        def draw(self, value, sampler):
            return value

    with pytest.raises(InvalidArgumentError):
        Step.of(Unvalidated())


def test_a_batch_is_one_step_whose_noise_is_float_if_any_item_is() -> None:
    items = (Laplace(0.5, sensitivity=1.0), Laplace(0.25, noise="float", sensitivity=1.0))
    batch = Step.batch(items)
    assert batch.name == "batch" and batch.cost == Budget(0.75) and batch.noise == "float"
    assert Step.batch(items[:1]).noise == "exact"


def test_an_account_continues_only_under_the_rule_it_was_recorded_under() -> None:
    basic = BasicComposition(Budget(1.0))
    state = step_account("dataset:d", basic, None, Charge(0.25, 0.0))
    assert basic.spent(state) == Budget(0.25)
    recorded = Account("dataset:d", basic.name, basic.describe(), state, 1)
    assert basic.spent(step_account("dataset:d", basic, recorded, Charge(0.5, 0.0))) == Budget(0.75)
    other = make_rule("renyi", Budget(1.0, 1e-6))
    with pytest.raises(LedgerConflictError, match="dataset:d cannot continue"):
        step_account("dataset:d", other, recorded, Charge(0.25, 0.0))


def test_a_step_beyond_the_limit_is_refused() -> None:
    basic = BasicComposition(Budget(1.0))
    state = step_account("dataset:d", basic, None, Charge(0.75, 0.0))
    recorded = Account("dataset:d", basic.name, basic.describe(), state, 1)
    with pytest.raises(Refused):
        step_account("dataset:d", basic, recorded, Charge(0.5, 0.0))
