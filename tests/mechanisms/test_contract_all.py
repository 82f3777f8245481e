"""Every mechanism on a contract battery: the selection mechanisms and randomized response on
``ChoiceMechanismContract`` (the numeric ones are on ``MechanismContract`` in their own modules),
the sparse-vector family on ``StreamMechanismContract``. Public API only.

Also the constructions found, while writing these, to slip past the constructors' checks (marked
``xfail(strict=True)``: library bugs, described in each reason)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError, PrivacyError
from dpbudget.mechanisms import (
    AboveThreshold,
    AnalyticGaussian,
    Exponential,
    Gaussian,
    Laplace,
    NumericSparse,
    PermuteAndFlip,
    RandomizedResponse,
    ReportNoisyMax,
    Sparse,
)
from tests.contracts import (
    ChoiceMechanismContract,
    StreamMechanismContract,
    _bad,
)
from tests.support import SEED

NAN, INF = math.nan, math.inf
IAE, ITE = InvalidArgumentError, InvalidTypeError

# -- selection: one score per candidate ------------------------------------------------------------

# (scores, error) for three candidates; every error names 'scores'.
SCORES_BAD_VALUES: list[Any] = [
    pytest.param(([1.0, NAN, 2.0], IAE), id="nan"),
    pytest.param((np.array([1.0, 2.0, INF]), IAE), id="array-inf"),
    pytest.param(([-INF, 0.0, 1.0], IAE), id="-inf"),
    pytest.param(([1.0, 2.0], IAE), id="too-few"),
    pytest.param(([1, 2, 3, 4], IAE), id="too-many"),
    pytest.param(([], IAE), id="empty"),
    pytest.param((np.zeros((3, 1)), IAE), id="column"),
    pytest.param(([[1.0, 2.0, 3.0]], IAE), id="row"),
    pytest.param((["a", "b", "c"], ITE), id="strs"),
    pytest.param((["1", "2", "3"], ITE), id="numeric-strs"),
    pytest.param(([True, False, True], ITE), id="bools"),
    pytest.param((np.array([True, False, True]), ITE), id="bool-array"),
    pytest.param(([1 + 2j, 0, 0], ITE), id="complex"),
    pytest.param(([1.0, None, 2.0], ITE), id="with-None"),
    pytest.param(([10 ** 400, 1, 2], (ITE, IAE)), id="huge-int"),
    pytest.param((3.0, ITE), id="scalar"),
    pytest.param((np.float64(1.0), ITE), id="np-scalar"),
    pytest.param(("abc", ITE), id="str"),
    pytest.param((b"abc", ITE), id="bytes"),
    pytest.param((None, ITE), id="None"),
    pytest.param(({0: 1.0, 1: 2.0, 2: 3.0}, ITE), id="dict"),
    pytest.param(({1.0, 2.0, 3.0}, ITE), id="set"),
    pytest.param((object(), ITE), id="object"),
    pytest.param(([[1.0], [2.0, 3.0], [4.0]], (ITE, IAE)), id="ragged"),
]


class _Selection(ChoiceMechanismContract):
    kwargs = {"epsilon": 0.5, "candidates": ("lo", "mid", "hi"), "sensitivity": 2.0}
    expected_cost = Budget(0.5)
    value = [0.0, 1.0, 2.0]
    value_argument = "scores"
    required_params = ("epsilon", "candidates", "sensitivity", "monotonic", "scale")
    bool_params = ("monotonic",)
    extra_bad = [
        _bad({"monotonic": "yes"}, ITE, "monotonic", "monotonic-str"),
        _bad({"monotonic": 1}, ITE, "monotonic", "monotonic-int"),
        _bad({"monotonic": None}, ITE, "monotonic", "monotonic-None"),
    ]
    certain = ({}, [0.0, 1e6, 0.0], "mid")
    secret = ({}, [[987654.3212345, 314159.26535, 271828.18284],
                   np.array([161803.39887, -141421.35623, 173205.08075])],
              [repr(x) for x in (987654.3212345, 314159.26535, 271828.18284, 161803.39887,
                                 -141421.35623, 173205.08075)] + ["987654.3", "161803.4"])

    @classmethod
    def bad_values(cls) -> list[Any]:
        return SCORES_BAD_VALUES

    def test_scores_not_modified(self) -> None:
        scores = np.array([3.0, 1.0, 2.0])
        copy = scores.copy()
        Accountant(None, rng=SEED).release(self.make(), scores)
        assert np.array_equal(scores, copy)

    def test_good_score_types_accepted(self) -> None:
        acc = Accountant(None, rng=SEED)
        for scores in ([1, 2, 3], (1.0, 2.0, 3.0), np.arange(3), np.arange(3.0),
                       np.ones(3, dtype=np.float32), [np.float64(1.0), 2, np.int64(3)]):
            assert acc.release(self.make(), scores) in ("lo", "mid", "hi")

    def test_monotonic_halves_the_scale_not_the_cost(self) -> None:
        plain, monotonic = self.make(), self.make(monotonic=True)
        assert monotonic.cost == plain.cost == self.expected_cost
        assert monotonic.scale == pytest.approx(plain.scale / 2, rel=1e-12)
        assert monotonic.scale >= 2.0 / 0.5 and plain.scale >= 2 * 2.0 / 0.5  # rounded up


class TestExponentialContract(_Selection):
    mechanism_class = Exponential


class TestReportNoisyMaxContract(_Selection):
    mechanism_class = ReportNoisyMax


class TestPermuteAndFlipContract(_Selection):
    mechanism_class = PermuteAndFlip


# -- randomized response: the true category -------------------------------------------------------

RR_BAD_VALUES: list[Any] = [
    pytest.param(("perhaps", IAE), id="not-a-category"),
    pytest.param(("Yes", IAE), id="wrong-case"),
    pytest.param((b"yes", IAE), id="bytes"),
    pytest.param((("yes",), IAE), id="tuple"),
    pytest.param((None, IAE), id="None"),
    pytest.param((NAN, IAE), id="nan"),
    pytest.param((0, IAE), id="index-instead-of-category"),
    pytest.param((["yes"], ITE), id="list"),
    pytest.param(({"yes": 1}, ITE), id="dict"),
    pytest.param(({"yes"}, ITE), id="set"),
    pytest.param((np.array(["yes"]), ITE), id="array"),
]


class TestRandomizedResponseContract(ChoiceMechanismContract):
    mechanism_class = RandomizedResponse
    kwargs = {"epsilon": 0.5, "categories": ("yes", "no", "maybe")}
    expected_cost = Budget(0.5)
    value = "yes"
    outcomes_argument = "categories"
    min_outcomes = 2
    positive_params = ("epsilon",)
    required_params = ("epsilon", "categories", "p")
    # p = 1/(1 + 2e^-50) rounded down: anything but the truth has probability about 2e-22 per
    # release; five seeded releases.
    certain = ({"epsilon": 50.0}, "no", "no")
    secret = ({"categories": ("zebra-crossing", "yak-shaving", "quux-fence")},
              ["zebra-crossing", "yak-shaving", "quux-fence"],
              ["zebra-crossing", "yak-shaving", "quux-fence"])

    @classmethod
    def bad_values(cls) -> list[Any]:
        return RR_BAD_VALUES

    def test_truth_probability_never_above_the_bound(self) -> None:
        for k in (2, 3, 10):
            m = self.make(categories=tuple(range(k)))
            assert m.p <= math.e ** 0.5 / (math.e ** 0.5 + k - 1)
            assert m.cost == self.expected_cost


# -- the sparse-vector family ----------------------------------------------------------------------

class TestAboveThresholdContract(StreamMechanismContract):
    mechanism_class = AboveThreshold
    kwargs = {"epsilon": 0.5, "threshold": 10.0, "sensitivity": 1.0}
    expected_cost = Budget(0.5)
    max_positives = 1
    takes = ()


class TestSparseContract(StreamMechanismContract):
    mechanism_class = Sparse
    kwargs = {"epsilon": 0.5, "threshold": 10.0, "max_positives": 3, "sensitivity": 1.0}
    expected_cost = Budget(0.5)
    max_positives = 3


class TestSparseMonotonicContract(StreamMechanismContract):
    mechanism_class = Sparse
    kwargs = {"epsilon": 0.8, "threshold": 10.0, "max_positives": 2, "sensitivity": 0.5,
              "monotonic": True, "split": (1.0, 3.0)}
    expected_cost = Budget(0.8)
    max_positives = 2


class TestNumericSparseContract(StreamMechanismContract):
    mechanism_class = NumericSparse
    kwargs = {"epsilon": 0.5, "threshold": 10.0, "max_positives": 2, "sensitivity": 1.0}
    expected_cost = Budget(0.5)
    max_positives = 2
    split_length = 3

    def test_released_values_are_noisy_and_counted(self) -> None:
        acc = Accountant(Budget(1.0), rng=SEED)
        with acc.session(self.make()) as session:
            assert session.query(self.below) is None
            value = session.query(1e9)
            assert isinstance(value, float) and math.isfinite(value) and value != 1e9
        closed = [e.record for e in acc.ledger.entries()][-1]
        assert (closed["answered"], closed["positives"]) == (2, 1)
        assert repr(value) not in json.dumps(closed)


# -- extreme constructions: refused with a typed error, or storable -----------------------------------------------------

def _accepted_or_typed(build: Any) -> None:
    """A construction either fails with a typed error that names an argument, or gives a mechanism
    whose public parameters the ledger can store (JSON without inf/NaN)."""
    try:
        m = build()
    except PrivacyError as exc:
        assert isinstance(exc, (InvalidArgumentError, InvalidTypeError)) and exc.argument
        return
    json.dumps(m.params(), allow_nan=False)


@pytest.mark.parametrize("build", [
    pytest.param(lambda: Laplace(1e-310, sensitivity=1.0), id="laplace-subnormal-epsilon"),
    pytest.param(lambda: Laplace(1e-3, sensitivity=1e308), id="laplace-huge-sensitivity"),
    pytest.param(lambda: Exponential(1e-3, candidates=["a", "b"], sensitivity=1e308), id="exponential-huge-sensitivity"),
    pytest.param(lambda: Gaussian(0.5, delta=1e-6, sensitivity=1e308), id="gaussian-huge-sensitivity"),
    pytest.param(lambda: Sparse(1e-3, threshold=0.0, max_positives=1, sensitivity=1e308), id="sparse-huge-sensitivity"),
    pytest.param(lambda: Sparse(1.0, threshold=0.0, max_positives=1, split=(1e-320, 1.0), sensitivity=1.0), id="sparse-subnormal-share"),
    pytest.param(lambda: Sparse(1.0, threshold=0.0, max_positives=1, split=(5e-324, 1.0), sensitivity=1.0), id="sparse-share-rounds-to-zero"),
    pytest.param(lambda: AboveThreshold(5e-324, threshold=0.0, sensitivity=1.0), id="above-threshold-smallest-epsilon"),
    pytest.param(lambda: NumericSparse(1.0, threshold=0.0, max_positives=1, split=(1.0, 1.0, 5e-324), sensitivity=1.0), id="numeric-sparse-answer-share-rounds-to-zero"),
    pytest.param(lambda: AnalyticGaussian(0.5, delta=1e-6, sensitivity=1e308), id="analytic-gaussian-huge-sensitivity"),
    # Controls: the same extremes where the library copes.
    pytest.param(lambda: RandomizedResponse(5e-324, categories=["a", "b"]), id="rr-smallest-epsilon"),
    pytest.param(lambda: AnalyticGaussian(1e-300, delta=1e-6, sensitivity=1.0), id="analytic-gaussian-tiny-epsilon"),
    pytest.param(lambda: Laplace(1e-300, sensitivity=1.0), id="laplace-tiny-epsilon"),
    pytest.param(lambda: Sparse(1.0, threshold=0.0, max_positives=1, split=(1e-300, 1.0), sensitivity=1.0), id="sparse-tiny-share"),
])
def test_extreme_parameters_are_refused_or_storable(build: Any) -> None:
    _accepted_or_typed(build)


def test_release_with_an_overflowed_scale_is_a_typed_error() -> None:
    rng = np.random.default_rng(SEED)
    acc = Accountant(Budget(1.0), rng=rng)
    with pytest.raises(PrivacyError):
        acc.release(Laplace(1e-3, sensitivity=1e308), 1.0)
