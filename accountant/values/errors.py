"""The library's error tree.

Every error dpbudget raises on purpose is a :class:`PrivacyError`. The tree is shallow and grouped by
what the caller can do about it: fix an argument (:class:`InvalidArgumentError`, which is also a
``ValueError``, or :class:`InvalidTypeError`, also a ``TypeError``), ask for less or wait for a new
budget (:class:`BudgetExceededError`), or call an operator (:class:`LedgerError`). Whenever one of
these is raised by the accountant, nothing was drawn and nothing was debited — except
:class:`LedgerUnconfirmedError`: nothing was drawn, but the debit was (or may have been) committed,
so its budget stays spent and a retry would pay again.
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = [
    "PrivacyError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidDataError",
    "InvalidDataTypeError",
    "UnknownDatasetError",
    "UnknownAnalystError",
    "AnalystMismatchError",
    "PolicyError",
    "BudgetExceededError",
    "MechanismNotAllowedError",
    "UnitRequiredError",
    "MechanismExhaustedError",
    "SamplerSpentError",
    "WindowEndedError",
    "LedgerError",
    "LedgerUnconfirmedError",
    "LedgerCorruptedError",
    "LedgerStaleError",
    "LedgerConflictError",
    "PolicyChangedError",
    "ServiceError",
]


class PrivacyError(Exception):
    """Root of every error dpbudget raises on purpose.

    Every one pickles with its type, message and attributes, so an error raised in a worker
    process reaches the parent as itself (``multiprocessing`` and ``concurrent.futures`` send it
    back pickled). Python's default rebuilds an exception by calling its class with ``args`` (the
    message), which fails for a class whose ``__init__`` takes other arguments — and
    ``multiprocessing.Pool`` then waits for that result for good. An attribute that cannot be
    pickled (a parameter of some exotic type) travels as its description (``describe``).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, {k: _portable(v) for k, v in vars(self).items()})


def _rebuild(cls: type[PrivacyError], args: tuple[Any, ...],
             state: dict[str, Any]) -> PrivacyError:
    """The error ``PrivacyError.__reduce__`` described, rebuilt without calling its ``__init__``."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


def _portable(value: Any) -> Any:
    try:
        pickle.dumps(value)
    except Exception:  # (whatever the object's own __reduce__ raises)
        return describe(value)
    return value


class InvalidArgumentError(PrivacyError, ValueError):
    """An argument has the right type but a value that is not allowed.

    Attributes:
        argument: the name of the offending argument.
        value: the value that was passed.
    """

    def __init__(self, argument: str, value: Any, expected: str, hint: str = "") -> None:
        self.argument = argument
        self.value = value
        self.expected = expected
        message = f"{argument!r} must be {expected}; got {value!r}"
        super().__init__(message + (f". {hint}" if hint else ""))


class InvalidTypeError(PrivacyError, TypeError):
    """An argument has the wrong type.

    Attributes:
        argument: the name of the offending argument.
        value: the value that was passed.
    """

    def __init__(self, argument: str, value: Any, expected: str) -> None:
        self.argument = argument
        self.value = value
        self.expected = expected
        super().__init__(
            f"{argument!r} must be {expected}; got {value!r} of type {type(value).__name__}"
        )


def describe(value: Any) -> str:
    """What a data value is, never what it holds: its type, and its shape and dtype or length.

    Data (a true answer, a score, a category, a row) must never appear in an error message, a repr
    or a log line: messages end up in notebooks, logs and tickets. Only non-finite floats are
    named (``nan``, ``inf``), because *that* they are not finite is the complaint.

    >>> describe([1.0, 2.0]), describe(3.5), describe(float("nan"))
    ('a list of length 2', 'a float', 'a float (nan)')
    """
    kind = type(value)
    name = kind.__name__
    module = kind.__module__.split(".")[0]
    prefix = "" if module in ("builtins", "numpy") else f"{module} "
    try:  # a hostile object's own properties may raise with data in the message
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
    except Exception:
        shape = dtype = None
    if isinstance(shape, tuple) and not isinstance(value, (int, float, complex)):
        # A string dtype's item size (<U11) is the longest string's length: kind only.
        kind_char = getattr(dtype, "kind", "")
        shown = {"U": "str", "S": "bytes"}.get(kind_char, str(dtype)) if dtype is not None else ""
        dtypes = "" if dtype is None else f" and dtype {shown}"
        if shape == () and dtype is not None:  # a numpy scalar
            return _scalar(value, f"a numpy {dtype}")
        return f"{_a(prefix + name)} of shape {shape}{dtypes}"
    if isinstance(value, float):
        return _scalar(value, "a float")
    if isinstance(value, (str, bytes)):  # its length could identify the value
        return f"a {name}"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"a {name} of length {len(value)}"
    if value is None:
        return "None"
    return _a(prefix + name)


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" or noun.startswith("nd") else "a ") + noun


def _scalar(value: Any, what: str) -> str:
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return what
    return what if x - x == 0.0 else f"{what} ({'nan' if x != x else 'inf'})"


class InvalidDataError(InvalidArgumentError):
    """A data value (a true answer, a score, a category, a row) that is not allowed. The message
    names the argument, describes the value (type, shape, where the problem is) and never shows it;
    ``value`` holds that description, not the data."""

    def __init__(self, argument: str, value: Any, expected: str, where: str = "") -> None:
        self.argument = argument
        self.value = describe(value)
        self.expected = expected
        Exception.__init__(self, f"{argument!r} must be {expected}; got {self.value}{where}")


class InvalidDataTypeError(InvalidTypeError):
    """A data value of the wrong type; like ``InvalidDataError``, it never shows the value."""

    def __init__(self, argument: str, value: Any, expected: str) -> None:
        self.argument = argument
        self.value = describe(value)
        self.expected = expected
        Exception.__init__(self, f"{argument!r} must be {expected}; got {self.value}")


class UnknownDatasetError(InvalidArgumentError):
    """A release named a dataset that has no declared limit (and the accountant has no default)."""

    def __init__(self, dataset: str, known: tuple[str, ...]) -> None:
        super().__init__(
            "dataset",
            dataset,
            f"one of the datasets with a declared limit {list(known)}",
            "Declare a limit for it, or give the Accountant a default `limit`.",
        )


class UnknownAnalystError(InvalidArgumentError):
    """The policy does not admit this analyst on this dataset: the dataset (or the policy's
    top-level ``[analysts]`` table) sets ``other_analysts = "deny"`` and does not list them (an
    anonymous release, ``analyst=None``, is refused there too)."""

    def __init__(self, analyst: str | None, where: str, known: tuple[str, ...]) -> None:
        super().__init__(
            "analyst", analyst, f"one of the analysts {where} lists {list(known)}",
            f'{where} sets other_analysts = "deny"; nothing was drawn and nothing was debited.')


class AnalystMismatchError(UnknownAnalystError):
    """The ledger authenticated the analyst (on PostgreSQL, the role its session logged in as),
    and the request names someone else: a release is charged to the analyst the ledger knows,
    never to a name the caller chooses. Nothing was drawn and nothing was debited.

    Attributes:
        authenticated: the analyst the ledger authenticated.
    """

    def __init__(self, analyst: str, authenticated: str) -> None:
        self.authenticated = authenticated
        InvalidArgumentError.__init__(
            self, "analyst", analyst, f"None or {authenticated!r}, the role this ledger's "
            "session logged in as", "A release is charged to the analyst the ledger "
            "authenticated; nothing was drawn and nothing was debited.")


class PolicyError(PrivacyError, ValueError):
    """A policy file is malformed. Nothing was opened, drawn or debited.

    The message starts with the exact key path of the problem, for example
    ``datasets.adult.limit.epsilon: must be a finite number >= 0 (or inf for no limit); got -1``.

    Attributes:
        path: the dotted key path (``""`` for a problem with the file as a whole).
        file: the policy file's name, when the policy was read from a file.
    """

    def __init__(self, path: str, message: str, file: str | None = None) -> None:
        self.path = path
        self.file = file
        super().__init__(f"{path}: {message}" if path else message)


class BudgetExceededError(PrivacyError):
    """The requested release does not fit in what is left of a limit. Nothing was debited.

    Attributes:
        requested: the cost of the refused release, as a ``Budget``.
        remaining: what is left of the limit that refused it, as a ``Budget``.
        dataset: the dataset whose limit refused it.
        account: which limit refused it (for example ``"dataset:adult"``).
    """

    def __init__(self, requested: Any, remaining: Any, dataset: str, account: str = "",
                 reason: str = "") -> None:
        self.requested = requested
        self.remaining = remaining
        self.dataset = dataset
        self.account = account or f"dataset:{dataset}"
        detail = f" ({reason})" if reason else ""
        super().__init__(
            f"release refused on {self.account}: requested {requested}, remaining {remaining}"
            f"{detail}; nothing was drawn and nothing was debited"
        )


class MechanismNotAllowedError(PrivacyError):
    """The limit that applies does not admit this kind of mechanism (for example a non-Gaussian
    step under the ``"gaussian"`` rule, one costlier than the declared per-query cost, or one a
    policy's ``allowed_mechanisms`` does not list). Nothing was drawn or debited."""


class UnitRequiredError(PrivacyError):
    """A release on a dataset that declares a privacy unit, not computed per that unit: a raw
    value (its sensitivity per unit cannot be checked) where its policy does not say
    ``raw_values = "allow"``, a table query per row or per another column, or a join per a unit
    that one of its datasets does not declare (``dpbudget.policies.units.unit_refusal``). Nothing
    was drawn or debited.

    Attributes:
        dataset: the dataset whose policy refuses it.
    """

    def __init__(self, dataset: str, why: str, hint: str) -> None:
        self.dataset = dataset
        super().__init__(f"{why} ({hint}); nothing was drawn and nothing was debited")


class WindowEndedError(PrivacyError):
    """A session or pipeline was opened in a renewal window (``period``) that has since ended:
    that window paid for it, so it answers nothing more (``dpbudget.policies.periods``). Nothing was drawn
    or debited; open a new one, charged to the current window.

    Attributes:
        ended: when the window ended (seconds since the epoch).
    """

    def __init__(self, message: str, ended: float) -> None:
        self.ended = ended
        super().__init__(message)


class MechanismExhaustedError(PrivacyError):
    """A sparse-vector session has given its last answer: it reached its cutoff of
    ``max_positives`` ⊤ answers, or it was closed. Its cost stays spent; open a new session (at a
    new cost) to ask more.

    Attributes:
        answered: how many queries the session answered.
        positives: how many of those answers were ⊤.
    """

    def __init__(self, message: str, answered: int = 0, positives: int = 0) -> None:
        self.answered = answered
        self.positives = positives
        super().__init__(message)


class SamplerSpentError(PrivacyError):
    """A sampler handed to a release was used after that release returned (or after its session
    closed): a mechanism kept it to draw for another request. Nothing was drawn."""


class LedgerError(PrivacyError):
    """The ledger could not be opened, read or written. From a release: nothing was committed,
    unless it is a :class:`LedgerUnconfirmedError` (committed, not confirmed on disk)."""


class LedgerUnconfirmedError(LedgerError):
    """The debit was committed (or may have been: the connection broke during the commit), but
    the ledger could not confirm that it reached the disk: a commit that failed (SQLite); a
    session that ended during the commit's round trip (PostgreSQL); or its record could not be
    written to the process's log of ledger records (``dpbudget.accountant.audit.logs``).

    Do not retry: the budget is spent, the answer is withheld. Nothing was drawn on this debit
    and it is never refunded (it may be on disk after all); a retry is a new release, which pays
    again. Any other ``LedgerError`` from a release means that nothing was committed (save
    one: in a process forked during a debit, whose parent pays for the answer and draws it).
    Call an operator: the ledger's disk or server is failing (on SQLite a failed sync also
    refuses every later debit on that file in this process).
    """


class LedgerStaleError(LedgerError):
    """A debit locked the accounts of another renewal window than its transaction's time fell
    in; nothing was written. The gate redoes it on the accounts of that time; a caller never
    sees it."""


class LedgerCorruptedError(LedgerError):
    """The ledger's records or running state fail verification (broken hash chain, malformed
    record, state that does not match the records)."""


class LedgerConflictError(LedgerError):
    """The ledger was started under settings (such as a composition rule) that differ from the
    ones this accountant was given; rules cannot change mid-stream."""


class OwnerKeyError(LedgerError):
    """A policy change without the ledger owner's key: none given, another key than the one the
    ledger's first record pins, or a ledger that pins none (its policy cannot change); or an
    owner key that cannot be used (its file, or the ``cryptography`` package, missing). Nothing
    was written (``dpbudget.accountant.gate.owner_key``)."""


class PolicyChangedError(LedgerConflictError):
    """The policy stored in the ledger changed after this accountant opened it: it refuses
    rather than enforce limits that are no longer in force. Open the ledger again."""


class ServiceError(PrivacyError):
    """The query service refused a request before reading it as a query: ``status`` 401 (no,
    a forged, expired or revoked token; a bad owner signature), 413 (too large), 429 (over the
    token's rate). Nothing was drawn or debited (``dpbudget.accountant.service``).

    Attributes:
        status: the HTTP status the service answered.
    """

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def as_value_error(exc: InvalidTypeError) -> InvalidArgumentError:
    """The same complaint as an ``InvalidArgumentError`` (a ``ValueError``), for code that runs
    inside pydantic validators: pydantic reports ``ValueError`` with the key's location but lets a
    ``TypeError`` escape without it."""
    err = InvalidArgumentError(exc.argument, exc.value, exc.expected)
    err.args = exc.args
    return err


def from_validation_error(exc: Any) -> InvalidArgumentError:
    """Our typed error for the first problem in a pydantic ``ValidationError``, naming the exact
    key path (for example ``limit.epsilon``) and the offending value."""
    first = exc.errors(include_url=False)[0]
    path = ".".join(str(p) for p in first["loc"]) or "value"
    message = str(first["msg"]).removeprefix("Value error, ")
    err = InvalidArgumentError(path, first.get("input"), "valid")
    err.args = (f"{path}: {message}",)
    return err
