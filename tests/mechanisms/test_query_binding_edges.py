"""Where a bound sensitivity could fall below the query's, or a plan disagree with the debit.

Each case was an attack on the first version of ``dp.queries`` binding:

- ``can_afford``/``max_releases`` priced an unbound Gaussian-family mechanism at Δ = 1; bound,
  DiscreteGaussian's charge is higher on the integer lattice (147 releases planned, 146 fit);
- a ``Query`` subclass could compute its sensitivities at will (a property returning 1e-12);
- a rational Δ was rounded to the nearest double, below itself (``Fraction(1, 3)``,
  ``2**53 + 1``);
- a class placed under ``dpbudget.mechanisms.`` in ``sys.modules`` was named as a library
  mechanism (``"Laplace"``), passing ``allowed_mechanisms = ["Laplace"]``;
- DiscreteLaplace refused an exact whole sum (``true_clamped_sum`` of integers, a Fraction).
"""

from __future__ import annotations

import math
import sys
import types
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant import (Accountant, Budget, InvalidArgumentError, InvalidTypeError,
                                 MechanismNotAllowedError)
from dpbudget.mechanisms import (AnalyticGaussian, DiscreteGaussian, DiscreteLaplace, Laplace,
                                 NumericMechanism)
from dpbudget.mechanisms.base import mechanism_name
from dpbudget.mechanisms.queries import Neighbouring, Query, bind, true_clamped_sum


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
