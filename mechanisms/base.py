"""The ``Mechanism`` base class: a mechanism declares its cost and draws noise only when told to.

Invariant: ``cost`` (and ``rho``/``mu`` where defined) is a pure function of the constructor's
parameters, fixed at construction; a mechanism holds no data and no randomness, and is immutable once
built (the metaclass freezes it when its constructor returns). The accountant calls ``prepare``
(validation only) before it debits, and ``draw`` (the only method that draws noise) after the
debit has committed. Every mechanism of the library, and every one a user writes
(docs/custom-mechanisms.md), uses the same public surface: ``declare`` its cost in ``__init__``,
``params``, ``prepare``, ``draw``. A mechanism declares its public parameters, cost and noise kind;
its name is its class (``mechanism_name``), and what it is named, charged and recorded as
(``name``, ``cost``, ``noise``, ``charge``) is this base class's, which no subclass may define.
Composition math lives in ``dpbudget.accountant.composition`` and the ledger's encoding in
``dpbudget.accountant.ledger.record``, never here.
"""

from __future__ import annotations

import inspect
import math
import numbers
import sys
from abc import ABC, ABCMeta, abstractmethod
from typing import Any, ClassVar

import numpy as np

from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.values.errors import (
    InvalidArgumentError,
    InvalidDataError,
    InvalidDataTypeError,
    InvalidTypeError,
)
from dpbudget.mechanisms.sampling import Sampler

__all__ = ["NOISE_KINDS", "Mechanism", "NumericMechanism", "StreamMechanism", "array_as_float",
           "mechanism_name", "noise_kind", "real_as_float", "real_values"]

# "exact": noise from the exact integer samplers, released on a grid (the default);
# "float": the textbook floating-point samplers, an explicit opt-out (docs/exact-noise.md).
NOISE_KINDS = ("exact", "float")


def noise_kind(noise: Any) -> str:
    """Validate a mechanism's ``noise`` argument."""
    if noise not in NOISE_KINDS or not isinstance(noise, str):
        raise InvalidArgumentError("noise", noise, "'exact' (the default: exact integer noise on "
                                   "a grid) or 'float' (textbook float noise, open to the "
                                   "floating-point attacks; an explicit opt-out)")
    return str(noise)


# What a subclass may not define: what it is recorded and charged as is fixed by the base class
# when the constructor returns (the name from the class's identity, the cost and noise kind from
# ``declare``, the charge from both), and the attributes that hold them or could change them.
_FINAL = frozenset({"name", "cost", "noise", "charge", "declare", "_cost", "_charge", "_frozen",
                    "_declared_noise", "__setattr__", "__delattr__", "__getattribute__"})
# The public names of the library's own classes, and the qualified names of custom classes that
# their module holds under that name (see ``mechanism_name``).
_NAMES: dict[type, str] = {}


def mechanism_name(cls: type) -> str:
    """The name a mechanism class is recorded, allowed and refused under: its class identity.

    A class of the library (the very object the ``dpbudget.mechanisms`` package exports under its
    name) is named by its public name: ``"Laplace"`` is ``dpbudget.mechanisms.Laplace`` itself,
    never a subclass, a look-alike, or a class of another module placed under
    ``dpbudget.mechanisms.`` in ``sys.modules``. Every other class is named by its module and
    qualified name (``"mypkg.mech.Clipped"``; ``"tests.t.test_x.<locals>.Clipped"`` for a class
    defined in a function, which no ``allowed_mechanisms`` entry can name).

    Raises:
        TypeError: a class defined at module level that its module does not hold under the name
            it states (a ``__module__`` or ``__qualname__`` rewritten to pose as another class).
    """
    name = _NAMES.get(cls)
    if name is not None:
        return name
    module, qualname = cls.__module__, cls.__qualname__
    if "<locals>" in qualname:  # defined in a function: not reachable by name, not cached
        return f"{module}.{qualname}"
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not cls:
        raise TypeError(f"mechanism class {module}.{qualname} is not the class its module holds "
                        "under that name (a rewritten __module__ or __qualname__?): a mechanism "
                        "is named by its class, defined at module level or in a function")
    package = sys.modules.get("dpbudget.mechanisms")
    library = qualname == cls.__name__ and getattr(package, cls.__name__, None) is cls
    name = cls.__name__ if library else f"{module}.{qualname}"
    if library or not module.startswith("dpbudget.mechanisms"):  # (not while the package loads)
        _NAMES[cls] = name
    return name


class _Frozen(ABCMeta):
    """Freezes every mechanism when its constructor returns, and fixes its ``Charge`` then.

    Cost is fixed at construction: changing a parameter afterwards would let a mechanism release
    with more noise-free signal than it declared. Subclasses only set their attributes and
    ``declare`` their cost in ``__init__``; nothing else is needed to make them immutable. A
    subclass that defines ``name``, ``cost``, ``noise``, ``charge`` (or what holds them) is refused
    when it is created: the gate checks caps and policies on exactly what it debits and records.
    """

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any],
                **kwargs: Any) -> Any:
        if any(isinstance(base, _Frozen) for base in bases):  # a subclass of Mechanism
            defined = sorted(_FINAL.intersection(namespace))
            if defined:
                raise TypeError(
                    f"mechanism class {name} may not define {', '.join(defined)}: a mechanism's "
                    "name is its class, and its cost and noise kind are what __init__ declares "
                    "(self.declare(Budget(...), noise=...)); rho, mu and rdp declare a tighter "
                    "cost")
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        # The constructor's own signature, for inspect and help(): this metaclass's __call__
        # takes (*args, **kwargs), which inspect would otherwise report.
        init = inspect.signature(getattr(cls, "__init__"))  # (own or inherited)
        type.__setattr__(cls, "__signature__", init.replace(
            parameters=list(init.parameters.values())[1:], return_annotation=init.empty))
        return cls

    def __setattr__(cls, key: str, value: Any) -> None:
        # Assigned after the class statement (``Poser.name = ...``) is defined all the same.
        if key in _FINAL:
            raise TypeError(f"mechanism class {cls.__name__}: {key} is fixed by the base class "
                            "and cannot be assigned")
        super().__setattr__(key, value)

    def __delattr__(cls, key: str) -> None:
        if key in _FINAL:
            raise TypeError(f"mechanism class {cls.__name__}: {key} is fixed by the base class "
                            "and cannot be deleted")
        super().__delattr__(key)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        name = _NAMES.get(cls) or mechanism_name(cls)  # (a poser is refused before it runs)
        try:
            mechanism = super().__call__(*args, **kwargs)
        except (ZeroDivisionError, OverflowError):
            # Valid-looking extremes (a subnormal ε, a Δ near the largest double) whose derived
            # scales cannot be computed: refused with the parameters shown, never a bare error.
            given = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            raise InvalidArgumentError(
                "parameters", f"{cls.__name__}({', '.join(given)})",
                "values whose noise scales are finite, non-zero doubles") from None
        state = mechanism.__dict__
        cost = state.get("_cost")
        if type(cost) is not Budget and not isinstance(cost, Budget):  # (ABC checks are slow)
            raise TypeError(f"{cls.__name__}.__init__ must declare its cost: self.declare(Budget(...))")
        noise = state.setdefault("_declared_noise", "float")
        if type(noise) is not str or noise not in NOISE_KINDS:  # (set other than by declare)
            noise_kind(noise)
        for key, value in mechanism.params().items():
            if isinstance(value, float) and not (math.isfinite(value) and (
                    value != 0.0 or key in type(mechanism)._may_be_zero)):
                raise InvalidArgumentError(
                    key, value, "a finite, non-zero double (the parameters given overflow or "
                    "underflow it)")
        # ρ, μ and the RDP curve are read here, once: the charge is what every debit uses.
        state["_charge"] = Charge(cost.epsilon, cost.delta, mechanism.rho, mechanism.mu,
                                  name, (), mechanism.rdp)
        state["_frozen"] = True
        return mechanism


class Mechanism(ABC, metaclass=_Frozen):
    """Base of every mechanism, the library's and yours (docs/custom-mechanisms.md).

    A subclass, in ``__init__``, validates its public parameters and calls ``self.declare(cost,
    noise=...)`` with the (ε, δ) ``Budget`` of one release, computed from those parameters only,
    and how its noise is drawn (``"exact"`` or ``"float"``, the default); it implements
    ``params`` (the public parameters, written to the ledger), ``prepare`` (validate the true
    value, raise a typed error naming it, draw nothing) and ``draw`` (the noisy answer, using only
    the ``Sampler`` it is given). Where it has a tighter zCDP or Gaussian-DP cost it overrides
    ``rho`` / ``mu``. It is immutable once constructed. The library's mechanisms take only ε by
    position and every other parameter by keyword (issue 30: ``Laplace(1.0, 0.1)`` is refused,
    so ε and Δ cannot be swapped); a subclass of your own should do the same.
    """

    _cost: Budget
    _charge: Charge
    #: Which sensitivity of a ``dpbudget.mechanisms.queries.Query`` the mechanism is calibrated with when
    #: one is released through it: ``"l1"`` (the Laplace family), ``"l2"`` (the Gaussian family),
    #: or None (it takes no ``Query``; the default). Such a mechanism may leave ``sensitivity``
    #: unstated (None) and take it from the query (``dpbudget.mechanisms.queries.bind``).
    query_norm: ClassVar[str | None] = None
    # Public float parameters for which 0 is a value, not an underflow (every other float
    # parameter must be a finite, non-zero double).
    _may_be_zero: ClassVar[tuple[str, ...]] = ("threshold",)

    @property
    def cost(self) -> Budget:
        """The (ε, δ)-DP cost of one release (fixed at construction; a subclass cannot define
        it)."""
        return self._cost

    def declare(self, cost: Budget, noise: str = "float") -> None:
        """Declare the (ε, δ) cost of one release and how its noise is drawn; called once, in
        ``__init__``, with values computed from the public parameters only (never from data).

        Args:
            cost: the (ε, δ)-DP cost of one release.
            noise: ``"exact"`` (drawn with the exact samplers, e.g. through the library's own
                mechanisms) or ``"float"`` (textbook float noise; the default).
        """
        if "_frozen" in self.__dict__:
            raise AttributeError(f"{self.name} is immutable; its cost is declared in __init__")
        if not isinstance(cost, Budget):
            raise InvalidTypeError("cost", cost, "a Budget")
        object.__setattr__(self, "_cost", cost)
        object.__setattr__(self, "_declared_noise", noise if type(noise) is str
                           and noise in NOISE_KINDS else noise_kind(noise))

    @property
    def rho(self) -> float | None:
        """The zero-concentrated DP cost ρ where the mechanism has a tighter one, else None."""
        return None

    @property
    def mu(self) -> float | None:
        """The Gaussian-DP parameter μ where the mechanism has one, else None."""
        return None

    @property
    def rdp(self) -> tuple[Any, ...] | None:
        """The Rényi-DP curve where the mechanism has one tighter than its ρ or pure ε imply (a
        description ``(kind, parameters...)`` that ``dpbudget.accountant.values.rdp`` evaluates), else None."""
        return None

    @property
    def name(self) -> str:
        """The class's public name for the library's own classes, else its module-qualified name
        (``mechanism_name``): what records, policies and refusals name it by."""
        return mechanism_name(type(self))

    @property
    def noise(self) -> str:
        """How the noise is drawn: ``"exact"`` (exact samplers) or ``"float"`` (textbook float
        samplers), as ``declare`` said. Written into every release record; a mechanism that does
        not say is "float"."""
        kind: str = self.__dict__.get("_declared_noise", "float")
        return kind

    @property
    def charge(self) -> Charge:
        """Everything a composition rule needs to know about one release of this mechanism."""
        return self._charge

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The public parameters, written to the ledger (never data)."""

    @abstractmethod
    def prepare(self, value: Any) -> Any:
        """Validate the true value; raise a typed error naming it. Draws nothing."""

    @abstractmethod
    def draw(self, value: Any, sampler: Sampler) -> Any:
        """The noisy answer to ``value`` (what ``prepare`` returned), drawing randomness only
        from ``sampler``. The accountant calls it only after the debit has committed."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.name}({args})"

    def __setattr__(self, key: str, value: Any) -> None:
        if "_frozen" in self.__dict__:
            raise AttributeError(f"{self.name} is immutable; build a new one")
        object.__setattr__(self, key, value)

    def __delattr__(self, key: str) -> None:
        raise AttributeError(f"{self.name} is immutable; build a new one")


class NumericMechanism(Mechanism):
    """A mechanism that adds noise to a number or a numpy array of numbers."""

    def prepare(self, value: Any) -> Any:
        """A finite real scalar (returned as ``float``) or a non-empty array of them (``float64``);
        a pandas Series or DataFrame is taken as the array of its values.

        Raises:
            InvalidTypeError: a string, a bool, None, or an array that is not numeric.
            InvalidArgumentError: NaN or infinite entries, or an empty array.
        """
        return real_values("value", value)


class StreamMechanism(Mechanism):
    """A mechanism whose one fixed cost covers a stream of answers (the sparse-vector family).

    It is never released with ``Accountant.release``: ``Accountant.session`` debits ``cost`` once,
    then calls ``_open`` (after the debit has committed), which draws the session's one-off noise
    and returns the private stream state that answers the queries. The stream validates each query
    value itself, before its state advances. ``releases_values`` says whether the stream also
    releases noisy values (``query``) besides ⊤/⊥ (``test``).
    """

    releases_values: ClassVar[bool] = False

    def prepare(self, value: Any) -> Any:
        raise InvalidTypeError("mechanism", self, "a one-shot mechanism for Accountant.release; "
                               "open a sparse-vector mechanism with Accountant.session")

    def draw(self, value: Any, sampler: Sampler) -> Any:  # pragma: no cover - prepare refuses
        raise InvalidTypeError("mechanism", self, "a one-shot mechanism")

    @abstractmethod
    def _open(self, sampler: Sampler) -> Any:
        """The stream state of a new session. Called by the accountant only, after the debit."""


def real_values(argument: str, value: Any) -> Any:
    """A finite real scalar (as ``float``) or a non-empty array of them (``float64``); a pandas
    Series or DataFrame is taken as the array of its values. Errors name ``argument`` (and an
    index), never a value.

    Raises:
        InvalidDataTypeError: a string, a bool, None, or an array that is not numeric.
        InvalidDataError: NaN or infinite entries, or an empty array.
    """
    if type(value) is float and math.isfinite(value):  # the common case, checked cheaply
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        x = real_as_float(argument, value)
        if not np.isfinite(x):
            raise InvalidDataError(argument, value, "a finite number")
        return x
    if hasattr(value, "to_numpy") and hasattr(value, "dtypes" if hasattr(value, "columns")
                                              else "dtype"):
        value = value.to_numpy()  # a pandas Series or DataFrame: its values, as an array
    if isinstance(value, (np.ndarray, list, tuple)):
        try:
            arr = np.asarray(value)
        except Exception:  # a ragged nested list (or an object whose conversion fails)
            raise InvalidDataTypeError(argument, value, "a rectangular array of real numbers") \
                from None
        if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.number)
                                     and not np.issubdtype(arr.dtype, np.complexfloating)):
            raise InvalidDataTypeError(argument, value, "a real number or an array of real numbers")
        if arr.size == 0:
            raise InvalidDataError(argument, value, "a non-empty array")
        arr = array_as_float(argument, value, arr)
        bad = ~np.isfinite(arr)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidDataError(argument, value, "finite everywhere",
                                   f"; {argument}{list(index)} is not finite")
        return arr
    raise InvalidDataTypeError(argument, value, "a real number or an array of real numbers")


# Integers beyond 2^53 are not all doubles: converting them would round neighbours up to 2^k apart
# (256 at 2^60), far beyond any sensitivity the mechanism was calibrated for.
_EXACT_INT = 1 << 53


def real_as_float(argument: str, value: Any) -> float:
    """A real number as a double, refusing an integer that would be rounded (|v| > 2^53) or that
    is beyond the double range. The value is data: errors describe it, never show it."""
    if isinstance(value, numbers.Integral) and not -_EXACT_INT <= int(value) <= _EXACT_INT:
        raise InvalidDataError(argument, value, "an integer of magnitude at most 2^53 (a larger "
                               "one is not a double: converting it would move it by more than "
                               "the sensitivity allows)")
    try:
        return float(value)
    except OverflowError:
        raise InvalidDataError(argument, value, "a finite number") from None


def array_as_float(argument: str, value: Any, arr: Any) -> Any:
    """A numeric array as float64, refusing integer entries beyond 2^53 (see ``real_as_float``)."""
    if np.issubdtype(arr.dtype, np.integer) and arr.size and (
            int(arr.max()) > _EXACT_INT or int(arr.min()) < -_EXACT_INT):
        raise InvalidDataError(argument, value, "integers of magnitude at most 2^53 (larger "
                               "ones are not doubles: converting them would move them by more "
                               "than the sensitivity allows)")
    return arr.astype(np.float64)
