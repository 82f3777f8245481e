"""Issue 30: a mechanism takes at most its ε positionally, so parameters cannot be swapped.

``Laplace(1.0, 0.1)`` and ``Laplace(0.1, 1.0)`` were both accepted (ε and Δ read in either
order), and ``Quantile(0.5, 0.1, 0, 100)`` took 0.1 as q when ε = 0.1 may have been meant.
Every class ``mechanisms`` exports with privacy parameters now refuses a second positional
argument with a plain ``TypeError`` raised by Python's call binding — before any validation,
debit or draw.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from dpbudget import mechanisms
from dpbudget.accountant import Accountant, Budget, PrivacyError
from dpbudget.mechanisms import Laplace, Mechanism, PTRStatistic, Quantile

# The one parameter a class may take positionally (None: none at all).
POSITIONAL = {"SubsampledGaussian": "noise_multiplier", "PTRMean": None, "PTRMedian": None}

EXPORTED = sorted(
    (getattr(mechanisms, name) for name in mechanisms.__all__
     if inspect.isclass(getattr(mechanisms, name))
     and issubclass(getattr(mechanisms, name), (Mechanism, PTRStatistic))
     and not inspect.isabstract(getattr(mechanisms, name))),
    key=lambda c: c.__name__)


def positional(cls: type) -> list[str]:
    """The parameters of ``cls``'s constructor that a caller may pass by position."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [p.name for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]


def test_every_mechanism_class_is_covered() -> None:
    names = {c.__name__ for c in EXPORTED}
    assert {"Laplace", "Gaussian", "AnalyticGaussian", "DiscreteLaplace", "DiscreteGaussian",
            "Exponential", "ReportNoisyMax", "PermuteAndFlip", "RandomizedResponse",
            "AboveThreshold", "Sparse", "NumericSparse", "Quantile", "Median",
            "SmoothSensitivity", "ProposeTestRelease", "SampleAndAggregate",
            "SubsampledGaussian", "PTRMean", "PTRMedian"} <= names


@pytest.mark.parametrize("cls", EXPORTED, ids=lambda c: c.__name__)
def test_at_most_epsilon_is_positional(cls: type) -> None:
    wanted = POSITIONAL.get(cls.__name__, "epsilon")
    assert positional(cls) == ([] if wanted is None else [wanted])


@pytest.mark.parametrize("cls", EXPORTED, ids=lambda c: c.__name__)
def test_a_second_positional_argument_is_refused_by_the_call(cls: type) -> None:
    args = (0.5,) if POSITIONAL.get(cls.__name__, "epsilon") is None else (0.5, 0.1)
    with pytest.raises(TypeError, match="positional") as info:
        cls(*args)
    # Not an InvalidTypeError from validation: the call's binding itself refused it.
    assert not isinstance(info.value, PrivacyError)


@pytest.mark.parametrize("args", [(1.0, 0.1), (0.1, 1.0)], ids=["eps-first", "delta-first"])
def test_issue_laplace_in_either_order_is_refused(args: tuple[float, float]) -> None:
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(TypeError, match="positional"):
        acc.release(Laplace(*args), 3.0)
    assert acc.spent() == Budget(0.0) and list(acc.ledger.entries()) == []
    # The two readings differ by a factor of 100 in the noise: neither may be guessed.
    assert Laplace(1.0, sensitivity=0.1).scale == pytest.approx(0.1)
    assert Laplace(0.1, sensitivity=1.0).scale == pytest.approx(10.0)


def test_issue_quantile_with_swapped_epsilon_and_q_is_refused() -> None:
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(TypeError, match="positional"):
        acc.release(Quantile(0.5, 0.1, 0, 100), [1.0, 2.0, 3.0])
    assert acc.spent() == Budget(0.0) and list(acc.ledger.entries()) == []
    m = Quantile(0.1, q=0.5, lower=0, upper=100)  # the keyword form says which is which
    assert (m.epsilon, m.q) == (0.1, 0.5)


def test_negative_control_an_old_style_signature_is_caught() -> None:
    """A constructor that still takes Δ by position (the old ``Laplace``) fails both checks."""

    class OldLaplace(Laplace):
        def __init__(self, epsilon: float, sensitivity: float = 1.0,
                     noise: str = "exact") -> None:
            super().__init__(epsilon, sensitivity=sensitivity, noise=noise)

    assert positional(OldLaplace) == ["epsilon", "sensitivity", "noise"]
    m: Any = OldLaplace(0.1, 1.0)  # accepted silently: the hole the checks above close
    assert (m.epsilon, m.sensitivity) == (0.1, 1.0)
