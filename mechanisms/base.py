"""The ``Mechanism`` base class: a mechanism declares its cost and draws noise only when told to.

Invariant: ``cost`` (and ``rho``/``mu`` where defined) is a pure function of the constructor's
parameters, fixed at construction; a mechanism holds no data and no randomness. The accountant calls
``prepare`` (validation only) before it debits, and ``_release`` (the only method that draws noise)
after the debit has committed. Composition math lives in ``accountant``, never here.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from accountant.budget import Budget
from accountant.composition import Charge
from accountant.errors import InvalidArgumentError, InvalidTypeError
from accountant.ledger.record import step_fragments
from mechanisms.sampling import Sampler

__all__ = ["Mechanism", "NumericMechanism", "StreamMechanism"]


# Encoded ledger descriptions by (mechanism class, parameters): building a fresh mechanism per
# release is the common usage, and its description only depends on these.
_FRAGMENTS: dict[tuple, dict[str, str]] = {}


class Mechanism(ABC):
    """Base of every mechanism.

    Subclasses set ``self._cost`` (a ``Budget``) in ``__init__`` and implement ``params``,
    ``prepare`` and ``_release``.
    """

    _cost: Budget
    _charge: Charge | None = None
    _fragments: dict[str, str] | None = None

    @property
    def cost(self) -> Budget:
        """The (ε, δ)-DP cost of one release."""
        return self._cost

    @property
    def rho(self) -> float | None:
        """The zero-concentrated DP cost ρ where the mechanism has a tighter one, else None."""
        return None

    @property
    def mu(self) -> float | None:
        """The Gaussian-DP parameter μ where the mechanism has one, else None."""
        return None

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def charge(self) -> Charge:
        """Everything a composition rule needs to know about one release of this mechanism."""
        if self._charge is None:
            self._charge = Charge(self._cost.epsilon, self._cost.delta, self.rho, self.mu,
                                  self.name)
        return self._charge

    @property
    def ledger_fragments(self) -> dict[str, str]:
        """The ``mechanism`` and ``cost`` members of a ledger record, as canonical JSON (cached:
        a mechanism is immutable)."""
        if self._fragments is None:
            params = self.params()
            try:  # mechanisms with equal parameters share their encoded description
                key = (type(self), tuple(params.items()))
                cached = _FRAGMENTS.get(key)
            except TypeError:  # unhashable parameters (candidate lists): encode each time
                key = cached = None
            if cached is None:
                cached = step_fragments(self.name, params, self.charge.as_record())
                if key is not None:
                    if len(_FRAGMENTS) > 4096:
                        _FRAGMENTS.clear()
                    _FRAGMENTS[key] = cached
            self._fragments = cached
        return self._fragments

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The public parameters, written to the ledger (never data)."""

    @abstractmethod
    def prepare(self, value: Any) -> Any:
        """Validate the true value; raise a typed error naming it. Draws nothing."""

    @abstractmethod
    def _release(self, value: Any, sampler: Sampler) -> Any:
        """The noisy answer. Called by the accountant only, after the debit has committed."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.name}({args})"

    def __setattr__(self, key: str, value: Any) -> None:
        # Cost is fixed at construction: changing a parameter afterwards would let a mechanism
        # release with more noise-free signal than it declared.
        if key not in ("_charge", "_fragments") and getattr(self, "_frozen", False):
            raise AttributeError(f"{self.name} is immutable; build a new one")
        object.__setattr__(self, key, value)


class NumericMechanism(Mechanism):
    """A mechanism that adds noise to a number or a numpy array of numbers."""

    def prepare(self, value: Any) -> Any:
        """A finite real scalar (returned as ``float``) or a non-empty array of them (``float64``).

        Raises:
            InvalidTypeError: a string, a bool, None, or an array that is not numeric.
            InvalidArgumentError: NaN or infinite entries, or an empty array.
        """
        if type(value) is float and math.isfinite(value):  # the common case, checked cheaply
            return value
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                x = float(value)
            except OverflowError:  # an int beyond the largest double
                raise InvalidArgumentError("value", value, "a finite number") from None
            if not np.isfinite(x):
                raise InvalidArgumentError("value", value, "a finite number")
            return x
        if isinstance(value, (np.ndarray, list, tuple)):
            try:
                arr = np.asarray(value)
            except ValueError:  # a ragged nested list
                raise InvalidTypeError("value", value, "a rectangular array of real numbers") \
                    from None
            if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.number)
                                         and not np.issubdtype(arr.dtype, np.complexfloating)):
                raise InvalidTypeError("value", value, "a real number or an array of real numbers")
            arr = arr.astype(np.float64)
            if arr.size == 0:
                raise InvalidArgumentError("value", value, "a non-empty array")
            bad = ~np.isfinite(arr)
            if bad.any():
                index = tuple(int(i) for i in np.argwhere(bad)[0])
                raise InvalidArgumentError("value", value, f"finite everywhere (entry {index} is "
                                           f"{arr[index]!r})")
            return arr
        raise InvalidTypeError("value", value, "a real number or an array of real numbers")


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

    def _release(self, value: Any, sampler: Sampler) -> Any:  # pragma: no cover - prepare refuses
        raise InvalidTypeError("mechanism", self, "a one-shot mechanism")

    @abstractmethod
    def _open(self, sampler: Sampler) -> Any:
        """The stream state of a new session. Called by the accountant only, after the debit."""
