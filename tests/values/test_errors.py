"""The error tree (``dpbudget.accountant.values.errors``): every error is a ``PrivacyError`` and
also the built-in a caller would catch; a data value is described, never shown; every error
pickles back as itself with its attributes (a worker's error reaches its parent)."""

from __future__ import annotations

import copyreg
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
import importlib
import pkgutil
from typing import Any
import dpbudget.accountant
import dpbudget.examples
import dpbudget.mechanisms
import dpbudget.policies
from dpbudget.accountant import Budget
from dpbudget.accountant.values.errors import PrivacyError

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


# ------------------------------------------------------------------------------------------------
# Every library error pickles back to itself (issue 32): same type, message and attributes.
#
# ``multiprocessing`` and ``concurrent.futures`` send a worker's exception to the parent pickled;
# Python's default rebuilds it by calling its class with ``args`` (the message), which fails for a
# class whose ``__init__`` takes other arguments, and the pool then hangs or breaks
# (tests/system/test_pools.py shows that end to end). The classes tested here are found by walking
# ``PrivacyError``'s subclasses after importing every module of ``dpbudget``, and each is built from
# its own constructor's signature: a class added later, anywhere, is covered without editing this.
# ------------------------------------------------------------------------------------------------

def _import_everything() -> None:
    for package in (dpbudget.accountant, dpbudget.mechanisms, dpbudget.policies,
                    dpbudget.examples):
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(found.name)


def _subclasses(cls: type[PrivacyError]) -> list[type[PrivacyError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += [c for c in _subclasses(sub) if c not in out]
    return out


_import_everything()
CLASSES = sorted(set(_subclasses(PrivacyError)), key=lambda c: f"{c.__module__}.{c.__name__}")

# A sample argument for each annotation a constructor uses; a new annotation fails the test below
# until it gets one, rather than being skipped.
_SAMPLES: dict[str, Any] = {
    "str": "sample", "str | None": "sample", "float": 1_700_000_000.5, "int": 7,
    "tuple[str, ...]": ("ann", "bob"), "Any": Budget(0.5, 1e-6),
}


def _instance(cls: type[PrivacyError]) -> PrivacyError:
    """``cls`` built through its own constructor, every parameter given (the optional ones too,
    so no attribute keeps its default)."""
    args = []
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation if isinstance(param.annotation, str) else getattr(
            param.annotation, "__name__", repr(param.annotation))
        assert annotation in _SAMPLES, f"{cls.__name__}({name}: {annotation}): add a sample"
        args.append(f"{name}-{_SAMPLES[annotation]}" if annotation.startswith("str")
                    else _SAMPLES[annotation])
    return cls(*args) if args else cls("a message")  # (Exception's own __init__)


def test_the_walk_finds_every_error_of_the_tree() -> None:
    """The walk is not vacuous: it finds every class errors.py defines (and nothing else)."""
    defined = {c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, PrivacyError)}
    assert defined <= set(CLASSES) and len(CLASSES) >= 20
    assert all(issubclass(c, PrivacyError) for c in CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_error_pickles_back_to_itself(cls: type[PrivacyError]) -> None:
    err = _instance(cls)
    assert err.args and "sample" in str(err) or str(err) == "a message"
    err.add_note("a note")
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert type(back) is cls
        assert back.args == err.args and str(back) == str(err)
        assert vars(back) == vars(err)  # every attribute, the note included


def test_negative_control_the_default_reduce_does_not_round_trip(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``PrivacyError.__reduce__`` (Python's default), most classes fail to unpickle
    (BudgetExceededError, InvalidArgumentError, ...): what the test above would miss if it
    tested nothing."""
    monkeypatch.setattr(PrivacyError, "__reduce__", Exception.__reduce__)
    for cls in list(copyreg.dispatch_table):  # (a library may have registered exception
        if isinstance(cls, type) and issubclass(cls, BaseException):  # reducers in this
            monkeypatch.delitem(copyreg.dispatch_table, cls)  # process: distributed's tblib)
    broken = []
    for cls in CLASSES:
        try:
            pickle.loads(pickle.dumps(_instance(cls)))
        except TypeError:
            broken.append(cls.__name__)
    assert {"BudgetExceededError", "InvalidArgumentError"} <= set(broken) and len(broken) >= 9


def test_an_attribute_that_cannot_be_pickled_travels_as_its_description() -> None:
    err = errors.InvalidTypeError("mechanism", lambda: None, "a Mechanism")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.InvalidTypeError and str(back) == str(err)
    assert back.value == "a function" and back.argument == "mechanism"


def test_a_data_error_carries_no_data_across_a_pickle() -> None:
    canary = "canary-4417"
    err = errors.InvalidDataError("data", [canary], "numbers")
    text = pickle.dumps(err)
    assert canary.encode() not in text
    assert pickle.loads(text).value == "a list of length 1"
