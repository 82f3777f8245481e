"""The error tree (``dpbudget.accountant.values.errors``): every error is a ``PrivacyError`` and
also the built-in a caller would catch; a data value is described, never shown; every error
pickles back as itself with its attributes (a worker's error reaches its parent)."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest

from dpbudget.accountant.values import errors
from dpbudget.accountant.values.errors import (
    BudgetExceededError,
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
    PolicyError,
    PrivacyError,
    as_value_error,
    describe,
)

CANARY = 7_351_911.25  # a "true value": must never appear in a message about data


def test_every_error_class_is_a_privacy_error() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, Exception) and c.__module__ == errors.__name__]
    assert len(classes) > 15 and all(issubclass(c, PrivacyError) for c in classes)
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(InvalidTypeError, TypeError)
    assert issubclass(PolicyError, ValueError)


def test_an_argument_error_names_the_argument_its_value_and_what_was_expected() -> None:
    err = InvalidArgumentError("epsilon", -1.0, "a finite number > 0")
    assert str(err) == "'epsilon' must be a finite number > 0; got -1.0"
    assert (err.argument, err.value, err.expected) == ("epsilon", -1.0, "a finite number > 0")


@pytest.mark.parametrize("value", [CANARY, [CANARY, 1.0], np.array([CANARY]), "7351911.25",
                                   {"x": CANARY}])
def test_a_data_error_describes_the_value_and_never_shows_it(value: object) -> None:
    for err in (InvalidDataError("value", value, "finite"),
                InvalidDataTypeError("value", value, "a number")):
        assert "7351911" not in str(err) and "7351911" not in repr(err.value)
        assert str(err).startswith("'value' must be")


def test_negative_control_an_argument_error_does_show_its_value() -> None:
    """Negative control: the parameter error (for parameters, not data) shows the value, so the
    canary would be seen by the test above if a data error were built like one."""
    assert "7351911" in str(InvalidArgumentError("value", CANARY, "finite"))


def test_describe_gives_type_and_shape_and_names_only_non_finite_floats() -> None:
    assert describe(np.zeros((2, 3))) == "an ndarray of shape (2, 3) and dtype float64"
    assert describe(np.array(["secret"])) == "an ndarray of shape (1,) and dtype str"
    assert describe("secret") == "a str" and describe(None) == "None"
    assert describe(float("inf")) == "a float (inf)" and describe(CANARY) == "a float"


@pytest.mark.parametrize("err", [
    InvalidArgumentError("epsilon", -1.0, "a number > 0", hint="see docs"),
    InvalidTypeError("epsilon", "x", "a number"),
    InvalidDataError("value", CANARY, "finite"),
    BudgetExceededError(requested="0.5", remaining="0.1", dataset="adult"),
])
def test_every_error_pickles_back_as_itself(err: PrivacyError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and back.args == err.args and vars(back) == vars(err)


def test_an_attribute_that_cannot_pickle_travels_as_its_description() -> None:
    err = InvalidArgumentError("fn", lambda: None, "a picklable function")
    back = pickle.loads(pickle.dumps(err))
    assert back.value == "a function" and back.args == err.args


def test_a_type_error_becomes_a_value_error_with_the_same_message() -> None:
    err = as_value_error(InvalidTypeError("epsilon", "x", "a number"))
    assert isinstance(err, InvalidArgumentError) and isinstance(err, ValueError)
    assert str(err) == "'epsilon' must be a number; got 'x' of type str"
