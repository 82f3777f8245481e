"""Every name in every ``__all__`` exists; every public class, and every function a package exports,
has a docstring; every mechanism class is exported."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

PACKAGES = ["dpbudget.accountant", "dpbudget.accountant.composition", "dpbudget.accountant.ledger",
            "dpbudget.mechanisms", "dpbudget.policies"]


def _modules() -> list[str]:
    """Every public module of the three packages (names starting with '_' are private)."""
    names = []
    for package in ("dpbudget.accountant", "dpbudget.mechanisms", "dpbudget.policies"):
        mod = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(mod.__path__, prefix=package + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    return sorted(set(names))


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # an optional extra (e.g. psycopg for the PostgreSQL ledger)
        pytest.skip(f"{name} needs an optional dependency: {exc}")


@pytest.mark.parametrize("name", PACKAGES)
def test_package_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported)), "duplicate names in __all__"
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which does not exist"
        obj = getattr(module, attr)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), f"{name}.{attr} is exported without a docstring"


@pytest.mark.parametrize("name", _modules())
def test_module_all_names_exist_and_classes_are_documented(name: str) -> None:
    module = _import(name)
    assert (module.__doc__ or "").strip(), f"module {name} has no docstring"
    for attr in getattr(module, "__all__", []):
        obj = getattr(module, attr)  # AttributeError = a stale __all__
        if inspect.isclass(obj):
            assert (obj.__doc__ or "").strip(), f"public class {name}.{attr} has no docstring"


def test_core_contract_names() -> None:
    """The names docs/architecture.md marks as contract."""
    from dpbudget import accountant
    from dpbudget import mechanisms

    for attr in ("Accountant", "Budget", "PrivacyError", "BudgetExceededError"):
        assert attr in accountant.__all__
    for attr in ("Laplace", "Gaussian", "AnalyticGaussian"):
        assert attr in mechanisms.__all__
    assert issubclass(accountant.BudgetExceededError, accountant.PrivacyError)
    assert issubclass(accountant.InvalidArgumentError, ValueError)
    assert issubclass(accountant.InvalidTypeError, TypeError)
    for cls in (accountant.InvalidArgumentError, accountant.InvalidTypeError,
                accountant.UnknownDatasetError, accountant.LedgerError,
                accountant.LedgerConflictError, accountant.LedgerCorruptedError,
                accountant.MechanismNotAllowedError):
        assert issubclass(cls, accountant.PrivacyError)
    assert issubclass(accountant.UnknownDatasetError, accountant.InvalidArgumentError)
    assert issubclass(accountant.LedgerConflictError, accountant.LedgerError)


def test_every_mechanism_class_is_exported() -> None:
    from dpbudget import mechanisms
    from dpbudget.mechanisms.base import Mechanism

    def subclasses(cls: type) -> list[type]:
        out = []
        for sub in cls.__subclasses__():
            out += [sub, *subclasses(sub)]
        return out

    for cls in subclasses(Mechanism):
        if cls.__module__.startswith("dpbudget.mechanisms.") and not cls.__name__.startswith("_"):
            assert cls.__name__ in mechanisms.__all__, cls
