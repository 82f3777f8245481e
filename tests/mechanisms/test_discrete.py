"""DiscreteLaplace and DiscreteGaussian (issue 10): the contract battery with integer values, the
reference vectors of CKS 2020, and integer in, integer out."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.values.errors import MechanismNotAllowedError
from dpbudget.mechanisms.discrete import (
    DiscreteGaussian, DiscreteLaplace, discrete_gaussian_delta, discrete_gaussian_sigma,
)
from tests.contracts import MechanismContract, _bad, _number_cases
from tests.support import SEED

ITE, IAE = InvalidTypeError, InvalidArgumentError

INTEGER_BAD_VALUES: list[Any] = [
    pytest.param((1.0, ITE), id="float"),
    pytest.param((math.nan, ITE), id="nan"),
    pytest.param((True, ITE), id="bool"),
    pytest.param(("3", ITE), id="str"),
    pytest.param((None, ITE), id="None"),
    pytest.param(([1.5, 2.0], ITE), id="float-list"),
    pytest.param((np.array([1.0]), ITE), id="float-array"),
    pytest.param(([], (ITE, IAE)), id="empty"),
    pytest.param((np.array([2 ** 62]), IAE), id="too-large-for-int64-noise"),
    pytest.param(([[1], [1, 2]], ITE), id="ragged"),
]


def _sensitivity_cases() -> list[Any]:
    return [_bad({"sensitivity": bad}, error, "sensitivity", f"sensitivity-{name}")
            for name, bad, error in [("zero", 0, IAE), ("negative", -1, IAE),
                                     ("float", 1.5, (ITE, IAE)), ("str", "1", ITE),
                                     ("bool", True, ITE)]]  # (None: taken from a Query)


INT_SCALARS = [3, np.int64(3), np.int32(-3), np.uint8(3), 10 ** 30]


class _IntegerContract(MechanismContract):
    """The battery's float-specific cases, restated for integer queries."""

    value = 3
    arrays_ok = True

    @pytest.mark.parametrize("value", [pytest.param(v, id=repr(v)) for v in INT_SCALARS])
    def test_scalar_in_float_out(self, value: Any) -> None:  # integer in, integer out here
        out = Accountant(None, rng=SEED).release(self.make(), value)
        assert type(out) is int

    @pytest.mark.parametrize("value", [[1, 2, 3], np.arange(6).reshape(2, 3),
                                       np.array([5], dtype=np.int16), (1, 2)])
    def test_array_in_same_shape_array_out(self, value: Any) -> None:
        acc = Accountant(None, rng=SEED)
        if not self.arrays_ok:
            with pytest.raises(InvalidTypeError):
                acc.release(self.make(), value)
            return
        out = acc.release(self.make(), value)
        assert out.shape == np.shape(value) and out.dtype == np.int64

    def test_input_array_not_modified(self) -> None:
        value = np.arange(6).reshape(2, 3)
        copy = value.copy()
        try:
            Accountant(None, rng=SEED).release(self.make(), value)
        except InvalidTypeError:
            assert not self.arrays_ok
        assert np.array_equal(value, copy)

    def test_same_seed_same_answer_and_no_draw_before_release(self) -> None:
        rng_a, rng_b = np.random.default_rng(SEED), np.random.default_rng(SEED)
        acc_a, acc_b = Accountant(None, rng=rng_a), Accountant(None, rng=rng_b)
        state = rng_a.bit_generator.state
        self.make().prepare(5)
        assert acc_a.can_afford(self.make())
        assert rng_a.bit_generator.state == state
        assert acc_a.release(self.make(), 5) == acc_b.release(self.make(), 5)
        assert rng_a.bit_generator.state != state

    def test_params_and_ledger_hold_no_data(self) -> None:
        secret = 987654321987
        m = self.make()
        acc = Accountant(None, rng=SEED)
        acc.release(m, secret, dataset="d", label="count")
        texts = json.dumps(m.params()) + "".join(e.text for e in acc.ledger.entries())
        assert str(secret) not in texts and "98765432" not in texts


class TestDiscreteLaplaceContract(_IntegerContract):
    mechanism_class = DiscreteLaplace
    kwargs = {"epsilon": 0.5, "sensitivity": 2}
    expected_cost = Budget(0.5)

    @classmethod
    def bad_constructions(cls) -> list[Any]:
        return _number_cases("epsilon") + _sensitivity_cases()

    @classmethod
    def bad_values(cls) -> list[Any]:
        return INTEGER_BAD_VALUES


class TestDiscreteGaussianContract(_IntegerContract):
    mechanism_class = DiscreteGaussian
    kwargs = {"epsilon": 1.0, "delta": 1e-5, "sensitivity": 1}
    expected_cost = Budget(1.0, 1e-5)
    has_delta = True
    arrays_ok = False

    @classmethod
    def bad_constructions(cls) -> list[Any]:
        from tests.contracts import _delta_cases
        return _number_cases("epsilon") + _sensitivity_cases() + _delta_cases()

    @classmethod
    def bad_values(cls) -> list[Any]:
        return INTEGER_BAD_VALUES


def test_reference_vectors() -> None:
    """CKS 2020 Thm 7 (docs/exact-noise.md): the smallest σ at (1, 1e-5, 1) is 3.7404847042, and
    the continuous σ 3.730631635 leaks δ = 1.0346e-5 on the integers."""
    assert discrete_gaussian_sigma(1.0, 1e-5) == pytest.approx(3.7404847042, rel=1e-9)
    assert discrete_gaussian_delta(3.730631635, 1.0) == pytest.approx(1.0346e-5, rel=1e-4)
    assert DiscreteLaplace(1.0, sensitivity=1).zero_probability == pytest.approx(0.4621171573, abs=1e-10)
    m = DiscreteGaussian(1.0, delta=1e-5, sensitivity=1)
    assert m.sigma >= 3.7404847042 and m.sigma == pytest.approx(3.7404847042, rel=1e-5)
    assert m.rho == pytest.approx(1 / (2 * m.sigma ** 2), rel=1e-12)
    assert m.rho >= 1 / (2 * m.sigma ** 2) * (1 - 1e-15)


def test_sampled_sigma_is_safe_by_the_bound() -> None:
    m = DiscreteGaussian(0.5, delta=1e-6, sensitivity=3)
    assert discrete_gaussian_delta(m.sigma, 0.5, 3) <= 1e-6


def test_integer_in_integer_out() -> None:
    acc = Accountant(None, rng=4)
    assert type(acc.release(DiscreteLaplace(1.0, sensitivity=1), 7)) is int
    assert type(acc.release(DiscreteGaussian(1.0, delta=1e-5, sensitivity=1), np.int64(7))) is int
    out = acc.release(DiscreteLaplace(1.0, sensitivity=1), [1, 2, 3])
    assert out.dtype == np.int64 and out.shape == (3,)


def test_gaussian_rule_refuses_the_discrete_gaussian() -> None:
    """No Gaussian-DP μ is cited for it: the gaussian (GDP) rule refuses it, naming why."""
    acc = Accountant(Budget(1.0, 1e-5), composition="gaussian", rng=1)
    with pytest.raises(MechanismNotAllowedError) as info:
        acc.release(DiscreteGaussian(0.5, delta=1e-6, sensitivity=1), 3)
    assert "mu" in str(info.value)
    assert acc.spent() == Budget(0.0)


def test_the_discrete_gaussian_is_not_mu_gdp_at_the_continuous_mu() -> None:
    """Why no μ is declared: at σ² = 1, ε = 0.1 (Δ = 1) the discrete Gaussian's δ (CKS Thm 7)
    exceeds the continuous one (Balle–Wang), which μ = Δ/σ-GDP would forbid."""
    from dpbudget.mechanisms import analytic_gaussian_delta
    assert discrete_gaussian_delta(1.0, 0.1) == pytest.approx(0.3673, abs=1e-4)
    assert analytic_gaussian_delta(1.0, 0.1) == pytest.approx(0.3523, abs=1e-4)
