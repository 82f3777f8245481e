"""``Charge`` (``dpbudget.accountant.values.charge``): plain immutable data, built from a
mechanism's public parameters; its ``budget`` is its (ε, δ)."""

from __future__ import annotations

import pickle

import pytest

from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.mechanisms import Laplace


def test_a_charge_cannot_be_changed() -> None:
    charge = Charge(0.5, 1e-6, rho=0.125, mechanism="Gaussian")
    with pytest.raises(AttributeError):
        charge.epsilon = 0.0  # type: ignore[misc]
    assert charge._replace(epsilon=0.1).epsilon == 0.1 and charge.epsilon == 0.5


def test_its_budget_is_its_epsilon_delta_and_defaults_say_nothing_more() -> None:
    charge = Charge(0.5, 1e-6)
    assert charge.budget == Budget(0.5, 1e-6)
    assert (charge.rho, charge.mu, charge.rdp, charge.parts, charge.mechanism) == (None, None, None, (), "")


def test_a_batch_holds_its_items_charges_and_round_trips_by_value() -> None:
    items = (Charge(0.5, 0.0, mechanism="Laplace"), Charge(0.25, 0.0, mechanism="Laplace"))
    batch = Charge(0.75, 0.0, mechanism="batch", parts=items)
    assert pickle.loads(pickle.dumps(batch)) == batch and batch.parts[1].budget == Budget(0.25)


def test_a_mechanism_declares_its_charge_from_its_public_parameters() -> None:
    charge = Laplace(0.5, sensitivity=1.0).charge
    assert isinstance(charge, Charge) and charge.budget == Budget(0.5)
    assert charge == Laplace(0.5, sensitivity=1.0).charge  # the same parameters, the same charge
