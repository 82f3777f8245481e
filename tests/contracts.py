"""Contract test base classes: one battery per abstraction, inherited by every implementation.

``MechanismContract``: every mechanism's test class inherits it and declares a few class
attributes (the class, a valid construction, the expected cost, its own bad constructions). The
battery: the cost is declared and is a ``Budget``; the mechanism is immutable; ``params()`` is
JSON-serialisable and holds no data; bad ε/δ/Δ and bad values are rejected with typed errors that
name the argument; nothing is debited or drawn when that happens; scalar in gives float out and
array in gives a same-shape array out through ``Accountant.release``; the class is documented and
exported.

``LedgerContract``: runs against every backend in ``tests.conftest.LEDGER_BACKENDS`` through the
``ledger_opener`` fixture: append/commit, rollback, the hash chain, ``entries(start)``, accounts,
``head()``.

``ChoiceMechanismContract`` (a ``MechanismContract``): the same battery for mechanisms whose value
is not a number: selection mechanisms (one score per candidate) and randomized response (a true
category). It sets the value hooks (``value``, ``value_argument``, ``bad_values()``, ...) and
replaces the numeric-only checks (scalar in, float out; array shapes) with the choice-shaped ones
(the answer is one of the public outcomes).

``StreamMechanismContract``: the sparse-vector family, which is never released one-shot: the whole
declared cost is debited once when ``Accountant.session`` opens, ⊥ answers cost nothing more, the
stream stops after ``max_positives`` ⊤, closing writes one zero-cost record of counts, and a bad
query leaves the session where it was.

``CompositionRuleContract``: every rule in ``RULES`` through ``Accountant(..., composition=name)``
(monotone ``spent()`` within the limit, ``max_releases`` and ``can_afford`` agreeing with what
``release`` admits, refusals changing nothing, resuming from a durable ledger, refusing a ledger
started under another rule) and through the rule-level API (``debit`` never mutates its state and
raises ``Refused`` when over).

Every check added here goes through the public API only (``Accountant``, the records read back
with ``acc.ledger.entries()``, the ``dpbudget.ledger`` logger, a seeded ``numpy.random.Generator``
whose ``bit_generator.state`` shows whether anything was drawn). Like the first two, none of
these classes is named ``Test*``.

Neither class is named ``Test*``, so pytest collects them only through their subclasses.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import pytest

from dpbudget import mechanisms
from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
    LedgerError,
    PrivacyError,
)
from dpbudget.accountant.ledger import GENESIS, Account, Entry, canonical, record_hash
from dpbudget.accountant import (
    RULES,
    LedgerConflictError,
    MechanismExhaustedError,
    MechanismNotAllowedError,
    NumericSession,
    SamplerSpentError,
    Session,
)
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.composition import Charge, Refused, make_rule
from dpbudget.accountant.ledger import SqliteLedger
from dpbudget.accountant.audit.logs import LOGGER_NAME


def fields(**members: Any) -> dict[str, str]:
    """A record's members in the form ``Transaction.append`` takes: canonical JSON texts."""
    return {k: canonical(v) for k, v in members.items()}


# The lane of a test record that charges no account: a ledger of lanes puts every record on one
# (accountant.ledger.lanes); a ledger of one chain ignores it.
LANE = ("test",)


def linked(ledger: Any, record: dict[str, Any], before: dict[str, Any]) -> bool:
    """Whether ``record`` links as its ledger's format says to ``before``: for each lane, the
    ``(seq, text, hash)`` of the last record before it there (None: the lane's first). One chain
    (format 1) links to the record before it, which these tests make that same record."""
    if ledger.lanes:
        want = {k: [0, GENESIS] if v is None else [v[0], v[2]] for k, v in before.items()}
        return bool(record["v"] == 2 and "prev" not in record
                    and all(record["links"].get(k) == w for k, w in want.items()))
    (last,) = before.values()
    return bool(record["v"] == 1 and record["prev"] == (GENESIS if last is None else last[2]))


def debit_fields(accounts: list[Account], **members: Any) -> dict[str, str]:
    """``fields`` of a record that writes ``accounts``, listing each one's rule, configuration
    and new state as the gate's records do: the PostgreSQL ledger's triggers refuse an account row
    that its record does not describe."""
    return fields(**members, accounts={a.key: {**a.config, "rule": a.rule, "state": a.state}
                                       for a in accounts})
from dpbudget.mechanisms.base import Mechanism
from tests.support import SEED, assert_chain, errors_in_threads, snapshot

NAN, INF = float("nan"), float("inf")

# (value, expected error type) for NumericMechanism.prepare; every one must name 'value'.
BAD_VALUES: list[Any] = [
    pytest.param((NAN, InvalidArgumentError), id="nan"),
    pytest.param((np.float64("nan"), InvalidArgumentError), id="np-nan"),
    pytest.param((INF, InvalidArgumentError), id="inf"),
    pytest.param((-INF, InvalidArgumentError), id="-inf"),
    pytest.param((np.float32("inf"), InvalidArgumentError), id="np32-inf"),
    pytest.param(([1.0, NAN], InvalidArgumentError), id="list-with-nan"),
    pytest.param((np.array([[0.0, 1.0], [INF, 2.0]]), InvalidArgumentError), id="array-with-inf"),
    pytest.param(([], InvalidArgumentError), id="empty-list"),
    pytest.param((np.array([]), InvalidArgumentError), id="empty-array"),
    pytest.param((np.zeros((3, 0)), InvalidArgumentError), id="empty-2d-array"),
    pytest.param(("3", InvalidTypeError), id="str"),
    pytest.param(("nan", InvalidTypeError), id="str-nan"),
    pytest.param((b"3", InvalidTypeError), id="bytes"),
    pytest.param((True, InvalidTypeError), id="bool"),
    pytest.param((np.bool_(True), InvalidTypeError), id="np-bool"),
    pytest.param((None, InvalidTypeError), id="None"),
    pytest.param((1 + 2j, InvalidTypeError), id="complex"),
    pytest.param((np.array([1 + 2j]), InvalidTypeError), id="complex-array"),
    pytest.param(([True, False], InvalidTypeError), id="bool-list"),
    pytest.param((["1", "2"], InvalidTypeError), id="str-list"),
    pytest.param(([1.0, None], InvalidTypeError), id="list-with-None"),
    pytest.param(({"a": 1.0}, InvalidTypeError), id="dict"),
    pytest.param(({1.0, 2.0}, InvalidTypeError), id="set"),
    pytest.param((object(), InvalidTypeError), id="object"),
    # An integer too large for a double is not a finite float: a typed error, not OverflowError.
    pytest.param((10 ** 400, InvalidArgumentError), id="huge-int"),
    # A ragged nested list is not an array of reals: a typed error, not numpy's bare ValueError.
    pytest.param(([[1.0, 2.0], [3.0]], (InvalidTypeError, InvalidArgumentError)), id="ragged-list"),
]

# Scalars of every real type the library accepts; each must come out as a Python float.
GOOD_SCALARS: list[Any] = [
    pytest.param(3, id="int"), pytest.param(-2.5, id="float"), pytest.param(0.0, id="zero"),
    pytest.param(np.float64(7.25), id="np-float64"), pytest.param(np.float32(1.5), id="np-float32"),
    pytest.param(np.int64(-4), id="np-int64"), pytest.param(Fraction(1, 3), id="fraction"),
]

GOOD_ARRAYS: list[Any] = [
    pytest.param(np.arange(5.0), id="1d"), pytest.param(np.ones((2, 3)), id="2d"),
    pytest.param(np.zeros((2, 1, 2), dtype=np.float32), id="3d-float32"),
    pytest.param(np.arange(4), id="int-array"), pytest.param([1.0, 2.0, 3.0], id="list"),
    pytest.param((4, 5), id="tuple"), pytest.param(np.array([9.0]), id="single"),
]


def _bad(kwargs: dict[str, Any], error: type[Exception], argument: str, id: str) -> Any:
    return pytest.param((kwargs, error, argument), id=id)


def _number_cases(argument: str, *, zero_ok: bool = False) -> list[Any]:
    """Bad values for a parameter that must be a finite number > 0."""
    cases = [
        _bad({argument: NAN}, InvalidArgumentError, argument, f"{argument}-nan"),
        _bad({argument: INF}, InvalidArgumentError, argument, f"{argument}-inf"),
        _bad({argument: -INF}, InvalidArgumentError, argument, f"{argument}--inf"),
        _bad({argument: -1.0}, InvalidArgumentError, argument, f"{argument}-negative"),
        _bad({argument: -1e-300}, InvalidArgumentError, argument, f"{argument}-tiny-negative"),
        _bad({argument: "1.0"}, InvalidTypeError, argument, f"{argument}-str"),
        _bad({argument: True}, InvalidTypeError, argument, f"{argument}-bool"),
        _bad({argument: None}, InvalidTypeError, argument, f"{argument}-None"),
        _bad({argument: [1.0]}, InvalidTypeError, argument, f"{argument}-list"),
        _bad({argument: 1 + 0j}, InvalidTypeError, argument, f"{argument}-complex"),
        _bad({argument: 10 ** 400}, InvalidArgumentError, argument, f"{argument}-huge-int"),
    ]
    if not zero_ok:
        cases.append(_bad({argument: 0.0}, InvalidArgumentError, argument, f"{argument}-zero"))
    return cases


def _delta_cases() -> list[Any]:
    """Bad δ for a mechanism that needs 0 < δ < 1."""
    return [
        _bad({"delta": NAN}, InvalidArgumentError, "delta", "delta-nan"),
        _bad({"delta": 0.0}, InvalidArgumentError, "delta", "delta-zero"),
        _bad({"delta": 1.0}, InvalidArgumentError, "delta", "delta-one"),
        _bad({"delta": 1.5}, InvalidArgumentError, "delta", "delta-above-one"),
        _bad({"delta": -1e-6}, InvalidArgumentError, "delta", "delta-negative"),
        _bad({"delta": INF}, InvalidArgumentError, "delta", "delta-inf"),
        _bad({"delta": "1e-6"}, InvalidTypeError, "delta", "delta-str"),
        _bad({"delta": False}, InvalidTypeError, "delta", "delta-bool"),
        _bad({"delta": None}, InvalidTypeError, "delta", "delta-None"),
    ]


def assert_names(error: BaseException, argument: str, value: Any) -> None:
    """The error is typed (a PrivacyError that is also a ValueError or TypeError), names the
    argument, and shows the offending value."""
    assert isinstance(error, PrivacyError)
    assert isinstance(error, ValueError if isinstance(error, InvalidArgumentError) else TypeError)
    assert error.argument == argument
    assert repr(argument) in str(error)
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(error.value) and "nan" in str(error)
    else:
        assert error.value is value or error.value == value
        assert repr(value) in str(error)


# -- shared by the contracts below -----------------------------------------------------------------

# The documented slack of every limit check: a request within a relative 1e-9 of what remains is
# admitted (``dpbudget.accountant.values._numeric.RELATIVE_TOLERANCE``), so spend may exceed a limit by that much.
TOLERANCE = 1e-9

# The members a ledger record carries (accountant/ledger/record.py documents the format).
# (Records written by earlier versions may also carry "table", a commitment no longer kept.)
CHAIN_MEMBERS = {"v", "seq", "time", "auth", "prev", "writer"}
RELEASE_MEMBERS = CHAIN_MEMBERS | {"kind", "dataset", "analyst", "label", "mechanism", "cost",
                                   "accounts", "noise"}
SESSION_CLOSE_MEMBERS = RELEASE_MEMBERS | {"session", "answered", "positives"}


def records(acc: Accountant) -> list[dict[str, Any]]:
    """Every committed record of ``acc``'s ledger, read back through the public ledger API."""
    return [e.record for e in acc.ledger.entries()]


def within_limit(spent: Budget, limit: Budget) -> bool:
    """``spent`` fits ``limit`` up to the documented relative tolerance, component-wise."""
    return (spent.epsilon <= limit.epsilon * (1 + TOLERANCE)
            and spent.delta <= limit.delta * (1 + TOLERANCE))


class _CommitSpy(logging.Handler):
    """Notes the generator's state each time the ledger reports a committed record. The ledger
    emits every record on the ``dpbudget.ledger`` logger right after its transaction commits
    (``dpbudget.accountant.audit.logs``), so the state seen there is the state at the moment of the debit."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__(logging.INFO)
        self.rng = rng
        self.seen: list[tuple[int, str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        entry = getattr(record, "dpbudget_entry", None)
        if entry is not None:
            self.seen.append((entry.seq, entry.record["kind"],
                              copy.deepcopy(self.rng.bit_generator.state)))


@contextmanager
def commit_spy(rng: np.random.Generator) -> Iterator[_CommitSpy]:
    """A ``_CommitSpy`` on the ledger logger for the duration of the block."""
    logger = logging.getLogger(LOGGER_NAME)
    level = logger.level
    spy = _CommitSpy(rng)
    logger.addHandler(spy)
    logger.setLevel(logging.INFO)
    try:
        yield spy
    finally:
        logger.removeHandler(spy)
        logger.setLevel(level)


def assert_immutable(m: Mechanism, names: list[str]) -> None:
    """Setting any parameter (or the cost) of a constructed mechanism raises, and changes
    nothing: a mechanism's cost is fixed when it is built."""
    before = (m.cost, m.params())
    for name in list(m.params()) + names:
        with pytest.raises(AttributeError):
            setattr(m, name, 1e6)
    with pytest.raises(AttributeError):
        m.cost = Budget(100.0)  # type: ignore[misc]
    assert (m.cost, m.params()) == before


class DocumentedAndExported:
    """Every mechanism class cites its paper, carries a runnable example, and is exported."""

    mechanism_class: ClassVar[type[Mechanism]]

    def test_documented(self) -> None:
        doc = self.mechanism_class.__doc__ or ""
        assert len(doc.strip()) > 40
        assert re.search(r"\b(19|20)\d\d\b", doc), "the docstring must cite its paper (year)"
        assert ">>>" in doc, "the docstring must carry a runnable example"

    def test_exported(self) -> None:
        name = self.mechanism_class.__name__
        assert name in mechanisms.__all__
        assert getattr(mechanisms, name) is self.mechanism_class


class MechanismContract(DocumentedAndExported):
    """The battery every mechanism passes. Subclasses set:

    Attributes:
        mechanism_class: the class under test.
        kwargs: a valid construction.
        expected_cost: ``mechanism_class(**kwargs).cost``.
        extra_bad: bad constructions specific to the class (``_bad(...)`` params).
        has_delta: whether the class takes ``delta`` (then δ cases are added).

    Hooks for mechanisms whose value is not a number (defaults: numeric):
        value: a valid true value (default ``1.0``).
        value_argument: the argument a bad value's error names (default ``"value"``).
        required_params: members ``params()`` must have (default ε and Δ).
        bool_params: ``params()`` members that are booleans (default none).
        bad_values(): (value, error type) cases (default ``BAD_VALUES``).
        make(**overrides): how to build one (default ``mechanism_class(**kwargs, **overrides)``).
    """

    mechanism_class: ClassVar[type[Mechanism]]
    kwargs: ClassVar[dict[str, Any]]
    expected_cost: ClassVar[Budget]
    extra_bad: ClassVar[list[Any]] = []
    has_delta: ClassVar[bool] = False
    value: ClassVar[Any] = 1.0
    value_argument: ClassVar[str] = "value"
    required_params: ClassVar[tuple[str, ...]] = ("epsilon", "sensitivity")
    bool_params: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def bad_constructions(cls) -> list[Any]:
        # A Query-capable mechanism (``query_norm``) takes sensitivity=None: "take it from the
        # Query" (a plain number is then refused at release: tests/mechanisms/test_sensitivity.py).
        unstated_ok = cls.mechanism_class.query_norm is not None
        cases = _number_cases("epsilon") + [c for c in _number_cases("sensitivity") if not (
            unstated_ok and c.id == "sensitivity-None")] + list(cls.extra_bad)
        return cases + (_delta_cases() if cls.has_delta else [])

    @classmethod
    def bad_values(cls) -> list[Any]:
        return BAD_VALUES

    def make(self, **overrides: Any) -> Mechanism:
        return self.mechanism_class(**{**self.kwargs, **overrides})

    # -- cost ---------------------------------------------------------------------------------

    def test_cost_is_declared_budget(self) -> None:
        m = self.make()
        assert isinstance(m.cost, Budget)
        assert m.cost == self.expected_cost
        assert m.charge.epsilon == m.cost.epsilon and m.charge.delta == m.cost.delta
        assert m.charge.rho == m.rho and m.charge.mu == m.mu
        assert m.charge.mechanism == m.name == self.mechanism_class.__name__

    def test_cost_is_pure_function_of_parameters(self) -> None:
        assert self.make().cost == self.make().cost
        assert self.make().params() == self.make().params()

    def test_declared_cost_is_what_is_debited(self) -> None:
        m = self.make()
        acc = Accountant(m.cost, rng=SEED)
        acc.release(m, self.value, dataset="d")
        assert acc.spent("d") == m.cost
        with pytest.raises(BudgetExceededError) as info:
            acc.release(m, self.value, dataset="d")
        assert info.value.requested == m.cost and info.value.dataset == "d"

    # -- immutability -------------------------------------------------------------------------

    def test_immutable(self) -> None:
        assert_immutable(self.make(), ["cost_override", "_cost", "epsilon"])

    def test_params_returns_a_copy(self) -> None:
        m = self.make()
        p = m.params()
        p["epsilon"] = 1e9
        assert m.params()["epsilon"] == self.kwargs["epsilon"]
        assert m.cost == self.expected_cost

    # -- params -------------------------------------------------------------------------------

    def test_params_json_and_public_only(self) -> None:
        m = self.make()
        p = m.params()
        text = json.dumps(p, allow_nan=False, sort_keys=True)
        assert json.loads(text) == p
        assert {"epsilon", "sensitivity"} <= set(p)
        for key, value in p.items():
            assert isinstance(key, str)
            assert isinstance(value, (int, float, str)) and not isinstance(value, bool)
        assert repr(m).startswith(self.mechanism_class.__name__ + "(")

    def test_params_and_ledger_hold_no_data(self) -> None:
        secret = 987654.3212345
        m = self.make()
        acc = Accountant(None, rng=SEED)
        acc.release(m, secret, dataset="d", label="count")
        array_secret = np.array([314159.26535, 271828.18284])
        acc.release(m, array_secret, dataset="d")
        texts = json.dumps(m.params()) + "".join(e.text for e in acc.ledger.entries())
        for needle in (secret, *array_secret):
            assert repr(float(needle)) not in texts
            assert f"{needle:.1f}" not in texts

    # -- bad construction ---------------------------------------------------------------------

    def test_bad_construction_rejected(self, bad_construction: Any) -> None:
        overrides, error, argument = bad_construction
        with pytest.raises(error) as info:
            self.make(**overrides)
        assert_names(info.value, argument, overrides[argument])

    # -- values -------------------------------------------------------------------------------

    def test_prepare_rejects(self, bad_value: Any) -> None:
        value, error = bad_value
        with pytest.raises(error) as info:
            self.make().prepare(value)
        assert isinstance(info.value, PrivacyError)
        assert info.value.argument == "value"
        assert "'value'" in str(info.value)

    def test_release_of_bad_value_changes_nothing(self, bad_value: Any) -> None:
        value, error = bad_value
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(100.0, 0.5), rng=rng)
        acc.release(self.make(), self.value, dataset="d")
        before = snapshot(acc.ledger, rng)
        with pytest.raises(error):
            acc.release(self.make(), value, dataset="d")
        assert snapshot(acc.ledger, rng) == before
        assert acc.spent("d") == self.expected_cost

    @pytest.mark.parametrize("value", GOOD_SCALARS)
    def test_scalar_in_float_out(self, value: Any) -> None:
        prepared = self.make().prepare(value)
        # An exact rational may be kept exact (Laplace rounds it to its grid exactly), never
        # changed; anything else becomes a double.
        assert type(prepared) is float or (type(prepared) is Fraction and prepared == value)
        out = Accountant(None, rng=SEED).release(self.make(), value)
        assert type(out) is float
        assert math.isfinite(out) and out != float(value)

    @pytest.mark.parametrize("value", GOOD_ARRAYS)
    def test_array_in_same_shape_array_out(self, value: Any) -> None:
        expected_shape = np.shape(value)
        out = Accountant(None, rng=SEED).release(self.make(), value)
        assert isinstance(out, np.ndarray)
        assert out.shape == expected_shape
        assert out.dtype == np.float64
        assert np.all(np.isfinite(out))
        assert np.all(out != np.asarray(value, dtype=np.float64))  # noise on every entry

    def test_input_array_not_modified(self) -> None:
        value = np.arange(6.0).reshape(2, 3)
        copy = value.copy()
        Accountant(None, rng=SEED).release(self.make(), value)
        assert np.array_equal(value, copy)

    def test_same_seed_same_answer_and_no_draw_before_release(self) -> None:
        rng_a, rng_b = np.random.default_rng(SEED), np.random.default_rng(SEED)
        acc_a, acc_b = Accountant(None, rng=rng_a), Accountant(None, rng=rng_b)
        state = rng_a.bit_generator.state
        self.make().prepare(np.ones(3))
        assert acc_a.can_afford(self.make())
        assert rng_a.bit_generator.state == state  # neither prepare nor a dry run draws
        assert acc_a.release(self.make(), 5.0) == acc_b.release(self.make(), 5.0)
        assert rng_a.bit_generator.state != state

    def test_noise_drawn_only_after_debit_commits(self) -> None:
        m = self.make()
        acc = Accountant(Budget(100.0, 0.5), rng=SEED)
        seen: list[int] = []
        original = m.draw

        def spy(value: Any, sampler: Any) -> Any:
            seen.append(acc.ledger.head()[0])  # the record must already be committed
            return original(value, sampler)

        object.__setattr__(m, "draw", spy)
        acc.release(m, self.value)
        assert seen == [1]

    def test_refusal_draws_nothing(self) -> None:
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(self.expected_cost.epsilon / 2), rng=rng)
        before = snapshot(acc.ledger, rng)
        with pytest.raises(BudgetExceededError):
            acc.release(self.make(), self.value)
        assert snapshot(acc.ledger, rng) == before

    # -- the debit, read back; bad values and refusals leave no trace (public API only) -------

    def test_debit_read_back_from_the_ledger(self) -> None:
        """The one record a release writes carries, as its ``cost``, exactly the declared cost (and
        ρ, μ); the account's state is that debit; the mechanism appears as its public params."""
        m = self.make()
        acc = Accountant(Budget(100.0, 0.5), rng=SEED)
        acc.release(m, self.value, dataset="d")
        (record,) = records(acc)
        assert record["kind"] == "release" and record["dataset"] == "d"
        assert set(record) == RELEASE_MEMBERS
        cost = record["cost"]
        assert Budget(cost["epsilon"], cost["delta"]) == m.cost == self.expected_cost
        assert cost["rho"] == m.rho and cost["mu"] == m.mu
        assert record["mechanism"] == {"name": self.mechanism_class.__name__,
                                       "params": m.params()}
        # Which noise was drawn, from which source (a seeded generator here): never left unsaid.
        assert record["noise"] == f"{m.noise}-seeded" and m.noise in ("exact", "float")
        state = record["accounts"]["dataset:d"]["state"]
        assert (state["epsilon"], state["delta"]) == (m.cost.epsilon, m.cost.delta)
        assert acc.spent("d") == m.cost

    def test_cost_follows_the_parameters_only(self) -> None:
        """Equal parameters give equal costs, another ε gives that ε, and releasing never changes
        a mechanism's cost, charge or params."""
        m = self.make()
        eps = self.kwargs["epsilon"]
        assert self.make(epsilon=eps / 2).cost.epsilon == eps / 2
        assert self.make(epsilon=eps / 2).cost.delta == m.cost.delta
        before = (m.cost, m.charge, m.params())
        acc = Accountant(None, rng=SEED)
        for _ in range(3):
            acc.release(m, self.value)
        assert (m.cost, m.charge, m.params()) == before
        assert self.make().cost == m.cost

    def test_bad_value_on_a_fresh_accountant_leaves_no_trace(self, bad_value: Any) -> None:
        """A refused value: a typed error naming the value argument, no ledger record, no
        account, nothing spent, not one random bit consumed."""
        value, error = bad_value
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(100.0, 0.5), rng=rng)
        state = copy.deepcopy(rng.bit_generator.state)
        with pytest.raises(error) as info:
            acc.release(self.make(), value, dataset="d")
        assert isinstance(info.value, PrivacyError)
        assert info.value.argument == self.value_argument
        assert list(acc.ledger.entries()) == [] and acc.ledger.accounts() == []
        assert acc.ledger.head() == (0, GENESIS)
        assert acc.spent("d") == Budget(0.0)
        assert rng.bit_generator.state == state

    def test_no_bits_drawn_before_the_debit_commits(self) -> None:
        """The draw-after-debit invariant through the public API: when the ledger reports the
        committed record, the generator has not moved; after the release it has."""
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(100.0, 0.5), rng=rng)
        start = copy.deepcopy(rng.bit_generator.state)
        with commit_spy(rng) as spy:
            acc.release(self.make(), self.value)
        assert spy.seen == [(1, "release", start)]
        assert rng.bit_generator.state != start

    def test_refusal_after_spending_changes_nothing(self) -> None:
        """Over budget after an admitted release: ``BudgetExceededError`` naming the dataset and
        the request, ``can_afford`` agreeing; ledger, accounts, spend and generator unchanged."""
        cost = self.expected_cost
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(cost.epsilon * 1.5, min(0.5, cost.delta * 1.5)), rng=rng)
        acc.release(self.make(), self.value, dataset="d")
        before = snapshot(acc.ledger, rng)
        assert not acc.can_afford(self.make(), dataset="d")
        with pytest.raises(BudgetExceededError) as info:
            acc.release(self.make(), self.value, dataset="d")
        assert info.value.dataset == "d" and info.value.requested == cost
        assert snapshot(acc.ledger, rng) == before
        assert acc.spent("d") == cost

    # -- what it is recorded and charged as; the sampler it is given (issue 28) ---------------

    def test_recorded_as_itself_and_the_audit_rebuilds_it(self) -> None:
        """Its records name the class itself, and the audit rebuilds it from the recorded
        parameters with exactly the recorded cost and noise kind: no ``release`` problem."""
        acc = Accountant(None, rng=SEED)
        acc.release(self.make(), self.value, dataset="d")
        acc.release_many([(self.make(), self.value), (self.make(), self.value)], dataset="d")
        assert [r["mechanism"]["name"] for r in records(acc)] == [self.mechanism_class.__name__,
                                                                   "batch"]
        assert_no_library_problem(acc)

    def test_a_subclass_cannot_redefine_what_is_charged_or_recorded(self) -> None:
        assert_final_members(self.mechanism_class)

    def test_a_subclass_is_recorded_under_its_own_name(self) -> None:
        """A subclass (here one that releases the true value) is never the library's class: its
        records and refusals name it by its module and qualified name."""
        class Leaky(self.mechanism_class):  # type: ignore[name-defined,misc]
            def draw(self, value: Any, sampler: Any) -> Any:
                return value

        m = Leaky(**self.kwargs)
        assert m.name == f"{__name__}.{Leaky.__qualname__}" != self.mechanism_class.__name__
        acc = Accountant(None, rng=SEED)
        acc.release(m, self.value, dataset="d")
        assert records(acc)[0]["mechanism"]["name"] == m.name

    def test_the_sampler_dies_when_its_release_returns(self) -> None:
        """What ``draw`` was given (the sampler, its bits) draws nothing once the release has
        returned: a mechanism cannot keep it to draw for another request."""
        kept: list[Any] = []

        class Keeper(self.mechanism_class):  # type: ignore[name-defined,misc]
            def draw(self, value: Any, sampler: Any) -> Any:
                kept.append(sampler)
                return super().draw(value, sampler)

        acc = Accountant(None, rng=SEED)
        acc.release(Keeper(**self.kwargs), self.value)
        acc.release_many([(Keeper(**self.kwargs), self.value)])
        assert_spent_samplers(kept, 2)



def assert_no_library_problem(acc: Accountant) -> None:
    """The audit finds no record claiming a library mechanism that its parameters do not give."""
    problems = [p for p in audit(acc.ledger).problems if "library mechanism" in p.message]
    assert problems == []


def assert_final_members(cls: type) -> None:
    """A subclass of ``cls`` defining what a mechanism is charged or recorded as is refused
    when it is created (``TypeError`` naming the member)."""
    for member in ("name", "cost", "noise", "charge", "_cost", "_charge", "declare"):
        with pytest.raises(TypeError, match=f"may not define {member}"):
            type("Sub", (cls,), {member: property(lambda self: Budget(0.0))})


def assert_spent_samplers(kept: list[Any], n: int) -> None:
    """Each of the ``n`` samplers kept from releases refuses every use with a typed error."""
    assert len(kept) == n
    uses: list[Callable[[Any], Any]] = [
        lambda s: s.bits.word(), lambda s: s.bits.words(2), lambda s: s.bits.below(7),
        lambda s: s.bits.below_array(7, 2), lambda s: s.laplace(1.0), lambda s: s.uniform(),
        lambda s: s.bits.pooled("k", lambda: [1]), lambda s: s.bits.pooled_many("k", 2, list),
        lambda s: s.one_shot().bits.word()]
    for sampler in kept:
        for use in uses:
            with pytest.raises(SamplerSpentError):
                use(sampler)


class LedgerContract:
    """The battery every ledger backend passes, run once per entry of ``LEDGER_BACKENDS``."""

    @staticmethod
    def _append(ledger: Any, n: int = 1, key: str = "dataset:a") -> list[Entry]:
        out = []
        for i in range(n):
            with ledger.transaction() as tx:
                prev = tx.account(key)
                total = (prev.state["epsilon"] if prev else 0.0) + 0.25
                accounts = [Account(key, "basic", {"rule": "basic"},
                                    {"epsilon": total, "delta": 0.0}, 0)]
                out.append(tx.append(debit_fields(accounts, kind="release", dataset=key, i=i),
                                     accounts))
        return out

    def test_empty(self, ledger: Any) -> None:
        assert ledger.head() == (0, GENESIS)
        assert list(ledger.entries()) == []
        assert ledger.accounts() == []
        assert ledger.account("dataset:a") is None

    def test_append_commit(self, ledger: Any) -> None:
        account = Account("dataset:a", "basic", {"rule": "basic", "limit": None},
                          {"epsilon": 0.1, "delta": 1e-7}, 0)
        with ledger.transaction() as tx:
            entry = tx.append(debit_fields([account], kind="release", dataset="a",
                                           label="é ünïcode"), [account])
            assert tx.account("dataset:a").state == account.state  # read-your-writes
        assert entry.seq == 1
        (stored,) = list(ledger.entries())
        assert stored == entry
        record = stored.record
        assert record["kind"] == "release" and record["label"] == "é ünïcode"
        assert record["seq"] == 1 and linked(ledger, record, {"dataset:a": None})
        assert record["time"].endswith("+00:00") and record["auth"] == "sha256"
        assert ledger.head() == (1, entry.hash)
        got = ledger.account("dataset:a")
        assert (got.key, got.rule, got.config, got.state, got.seq) == (
            "dataset:a", "basic", {"rule": "basic", "limit": None},
            {"epsilon": 0.1, "delta": 1e-7}, 1)

    def test_a_decreasing_or_invalid_state_is_refused(self, ledger: Any) -> None:
        """The ledger itself refuses a write that would lower a running state (a refund), drop
        one of its components, or store a negative or non-finite one: nothing is written."""
        self._append(ledger, 2)  # dataset:a at epsilon 0.5
        before = snapshot(ledger)
        for state in ({"epsilon": 0.25, "delta": 0.0}, {"epsilon": 1.0}, {"e": 9.0},
                      {"epsilon": float("nan"), "delta": 0.0}, {"epsilon": 1.0, "delta": -1.0},
                      {"epsilon": float("inf"), "delta": 0.0}):
            with pytest.raises(LedgerError):
                with ledger.transaction() as tx:
                    tx.append(fields(kind="release"), [Account("dataset:a", "basic", {}, state, 0)])
            assert snapshot(ledger) == before
        with pytest.raises(LedgerError):  # a new account must start valid too
            with ledger.transaction() as tx:
                tx.append(fields(kind="release"),
                          [Account("dataset:new", "basic", {}, {"epsilon": -1.0}, 0)])
        assert snapshot(ledger) == before

    def test_rollback_on_exception_leaves_nothing(self, ledger: Any) -> None:
        self._append(ledger, 2)
        before = snapshot(ledger)

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            with ledger.transaction() as tx:
                accounts = [Account("dataset:a", "basic", {}, {"epsilon": 9.0, "delta": 0.0}, 0),
                            Account("dataset:b", "basic", {}, {"epsilon": 9.0, "delta": 0.0}, 0)]
                tx.append(debit_fields(accounts, kind="release"), accounts)
                tx.append(fields(kind="release"), [], LANE)
                raise Boom
        assert snapshot(ledger) == before
        assert ledger.account("dataset:b") is None
        # ... and the ledger is usable afterwards, continuing the chain from the last commit.
        (entry,) = self._append(ledger, 1)
        # (a ledger of lanes may skip the numbers a rolled-back transaction took)
        assert entry.seq == 3 or ledger.lanes and entry.seq > 3
        assert linked(ledger, entry.record, {"dataset:a": before[0][-1]})
        assert_chain(ledger)

    def test_rollback_on_keyboard_interrupt(self, ledger: Any) -> None:
        before = snapshot(ledger)
        with pytest.raises(KeyboardInterrupt):
            with ledger.transaction() as tx:
                tx.append(fields(kind="release"), [], LANE)
                raise KeyboardInterrupt
        assert snapshot(ledger) == before

    def test_unserialisable_record_is_refused_and_rolled_back(self, ledger: Any) -> None:
        self._append(ledger, 1)
        before = snapshot(ledger)
        with pytest.raises(ValueError):
            with ledger.transaction() as tx:
                tx.append(fields(kind="release", bad=float("nan")), [], LANE)
        assert snapshot(ledger) == before

    def test_hash_chain_links(self, ledger: Any) -> None:
        entries = self._append(ledger, 6)
        stored = list(ledger.entries())
        assert stored == entries
        assert linked(ledger, stored[0].record, {"dataset:a": None})
        for before, after in zip(stored, stored[1:]):
            assert linked(ledger, after.record, {"dataset:a": (before.seq, before.text,
                                                               before.hash)})
            assert after.seq == before.seq + 1
        for e in stored:
            assert e.hash == hashlib.sha256(e.text.encode("utf-8")).hexdigest() == record_hash(
                e.text)
            assert canonical(json.loads(e.text)) == e.text
        assert assert_chain(ledger) == 6

    def test_entries_stream_in_order_from_start(self, ledger: Any) -> None:
        self._append(ledger, 5)
        it = ledger.entries(3)
        assert iter(it) is it  # an iterator, not a list
        assert [e.seq for e in it] == [3, 4, 5]
        assert [e.seq for e in ledger.entries()] == [1, 2, 3, 4, 5]
        assert [e.seq for e in ledger.entries(1)] == [1, 2, 3, 4, 5]
        assert [e.seq for e in ledger.entries(5)] == [5]
        assert list(ledger.entries(6)) == []

    def test_entries_stream_beyond_one_page(self, ledger: Any) -> None:
        n = 4100  # more than one SQLite page of 4096 rows
        with ledger.transaction() as tx:
            for i in range(n):
                tx.append(fields(kind="release", i=i), [], LANE)
        seqs = [e.seq for e in ledger.entries()]
        assert seqs == list(range(1, n + 1))
        assert [e.seq for e in ledger.entries(4090)] == list(range(4090, n + 1))
        assert assert_chain(ledger) == n

    def test_accounts_persist_and_update(self, ledger_opener: Any) -> None:
        ledger = ledger_opener()
        self._append(ledger, 3, key="dataset:b")
        self._append(ledger, 1, key="dataset:a")
        reopened = ledger_opener()
        accounts = reopened.accounts()
        assert [a.key for a in accounts] == ["dataset:a", "dataset:b"]  # sorted by key
        assert reopened.account("dataset:b").state == {"epsilon": 0.75, "delta": 0.0}
        assert reopened.account("dataset:b").seq == 3
        assert reopened.account("dataset:a").seq == 4
        assert reopened.head() == ledger.head()
        assert [e.text for e in reopened.entries()] == [e.text for e in ledger.entries()]

    def test_floats_round_trip_exactly(self, ledger_opener: Any) -> None:
        state = {"epsilon": 0.1 + 0.2, "delta": 5e-324, "rho": 1.7976931348623157e308}
        ledger = ledger_opener()
        with ledger.transaction() as tx:
            accounts = [Account("dataset:x", "basic", {}, state, 0)]
            tx.append(debit_fields(accounts, kind="release"), accounts)
        assert ledger_opener().account("dataset:x").state == state

    def test_head(self, ledger: Any) -> None:
        assert ledger.head() == (0, GENESIS)
        entries = self._append(ledger, 3)
        assert ledger.head() == (3, entries[-1].hash)

    def test_concurrent_threads_keep_the_chain(self, ledger: Any) -> None:
        barrier = threading.Barrier(4)

        def work() -> None:
            barrier.wait()
            self._append(ledger, 25)

        assert errors_in_threads(work, 4) == []
        assert assert_chain(ledger) == 100
        assert ledger.account("dataset:a").state["epsilon"] == 25.0  # no lost update

    def test_hmac_chain(self, ledger_opener: Any) -> None:
        """With a secret key each hash is HMAC-SHA256(key, text) and the record says so."""
        key = b"correct horse battery staple"
        ledger = ledger_opener(hmac_key=key)
        assert ledger.authenticated
        entries = self._append(ledger, 3)
        prev = None
        for e in entries:
            assert e.record["auth"] == "hmac-sha256"
            assert linked(ledger, e.record, {"dataset:a": prev})
            assert e.hash == hmac.new(key, e.text.encode("utf-8"), hashlib.sha256).hexdigest()
            assert e.hash != hashlib.sha256(e.text.encode("utf-8")).hexdigest()
            prev = (e.seq, e.text, e.hash)

    def test_context_manager_and_close_idempotent(self, ledger: Any) -> None:
        with ledger as same:
            assert same is ledger
        ledger.close()


def _bad_item(kwargs: dict[str, Any], error: type[Exception], argument: str, value: Any,
              id: str) -> Any:
    """A bad construction whose error names a part of an argument (``split[1]``,
    ``candidates[2]``): the offending ``value`` is given explicitly."""
    return pytest.param((kwargs, error, argument, value), id=id)


def _assert_bad_construction(make: Callable[..., Any], case: tuple[Any, ...]) -> None:
    overrides, error, argument, *explicit = case
    with pytest.raises(error) as info:
        make(**overrides)
    assert_names(info.value, argument, explicit[0] if explicit else overrides[argument])


def _assert_params_public(p: dict[str, Any], required: tuple[str, ...],
                          bool_params: tuple[str, ...]) -> None:
    """JSON without NaN/inf (the ledger stores it), string keys, scalar values, and booleans only
    where the class declares them."""
    text = json.dumps(p, allow_nan=False, sort_keys=True)
    assert json.loads(text) == p
    assert set(required) <= set(p)
    for key, value in p.items():
        assert isinstance(key, str)
        if isinstance(value, bool):
            assert key in bool_params, f"unexpected boolean parameter {key!r}"
        else:
            assert isinstance(value, (int, float, str)), (key, value)


# =================================================================================================
# ChoiceMechanismContract: selection mechanisms and randomized response
# =================================================================================================

# Bad items of the outcomes (candidates/categories): (items, error, index of the offending item).
OUTCOME_ITEM_CASES: list[Any] = [
    pytest.param(["a", "b", "a"], InvalidArgumentError, 2, id="repeated"),
    pytest.param([1.0, NAN], InvalidArgumentError, 1, id="nan"),
    pytest.param(["x", INF], InvalidArgumentError, 1, id="inf"),
    pytest.param([[1], [2]], InvalidTypeError, 0, id="unhashable-list"),
    pytest.param(["a", {"b"}], InvalidTypeError, 1, id="unhashable-set"),
    pytest.param([1, True], InvalidArgumentError, 1, id="bool-equal-to-an-int"),
]


class ChoiceMechanismContract(MechanismContract):
    """``MechanismContract`` for a mechanism that answers with one of a public set of outcomes.

    Subclasses set ``MechanismContract``'s attributes and its value hooks (``value``,
    ``value_argument``, ``bad_values()``, ``required_params``, ``bool_params``), and:

    Attributes:
        outcomes_argument: the constructor argument and attribute holding the outcomes.
        min_outcomes: how many outcomes a construction needs at least.
        positive_params: constructor arguments that must be finite numbers > 0.
        certain: ``(overrides, value, answer)``: a construction and value whose answer is
            overwhelmingly likely (probability of anything else below 1e-100).
        secret: ``(overrides, values, needles)``: values to release and the strings (pieces of
            those values) that must never reach the ledger.
    """

    outcomes_argument: ClassVar[str] = "candidates"
    min_outcomes: ClassVar[int] = 1
    positive_params: ClassVar[tuple[str, ...]] = ("epsilon", "sensitivity")
    required_params = ("epsilon",)
    certain: ClassVar[tuple[dict[str, Any], Any, Any]]
    secret: ClassVar[tuple[dict[str, Any], list[Any], list[str]]]

    @classmethod
    def bad_constructions(cls) -> list[Any]:
        arg = cls.outcomes_argument
        cases = [case for name in cls.positive_params for case in _number_cases(name)]
        cases += [
            _bad({arg: []}, InvalidArgumentError, arg, f"{arg}-empty-list"),
            _bad({arg: ()}, InvalidArgumentError, arg, f"{arg}-empty-tuple"),
            _bad({arg: "abc"}, InvalidTypeError, arg, f"{arg}-str"),
            _bad({arg: b"ab"}, InvalidTypeError, arg, f"{arg}-bytes"),
            _bad({arg: 5}, InvalidTypeError, arg, f"{arg}-int"),
            _bad({arg: None}, InvalidTypeError, arg, f"{arg}-None"),
        ]
        if cls.min_outcomes > 1:
            cases.append(_bad({arg: ["only"]}, InvalidArgumentError, arg, f"{arg}-too-few"))
        cases += [_bad_item({arg: items}, error, f"{arg}[{index}]", items[index],
                            f"{arg}-item-{param.id}")
                  for param in OUTCOME_ITEM_CASES for items, error, index in [param.values]]
        return cases + list(cls.extra_bad)

    def outcomes(self, m: Mechanism) -> tuple[Any, ...]:
        return tuple(getattr(m, self.outcomes_argument))

    # -- the numeric battery's checks, for a choice-valued mechanism ------------------------

    # Numeric-only checks of the base battery (a float out of a scalar, an array out of an array)
    # do not apply; the private-attribute spy is replaced by the public
    # ``test_no_bits_drawn_before_the_debit_commits``. A non-callable attribute is not collected.
    test_scalar_in_float_out = None
    test_array_in_same_shape_array_out = None
    test_input_array_not_modified = None
    test_noise_drawn_only_after_debit_commits = None

    def test_bad_construction_rejected(self, bad_construction: Any) -> None:
        _assert_bad_construction(self.make, bad_construction)

    def test_declared_cost_is_what_is_debited(self) -> None:
        m = self.make()
        acc = Accountant(m.cost, rng=SEED)
        acc.release(m, self.value, dataset="d")
        assert acc.spent("d") == m.cost
        with pytest.raises(BudgetExceededError) as info:
            acc.release(m, self.value, dataset="d")
        assert info.value.requested == m.cost and info.value.dataset == "d"

    def test_params_json_and_public_only(self) -> None:
        m = self.make()
        p = m.params()
        _assert_params_public(p, self.required_params, self.bool_params)
        # The outcomes themselves are public, but params() records only how many there are.
        assert p[self.outcomes_argument] == len(self.outcomes(m))
        assert repr(m).startswith(self.mechanism_class.__name__ + "(")

    def test_params_and_ledger_hold_no_data(self) -> None:
        overrides, values, needles = self.secret
        m = self.make(**overrides)
        acc = Accountant(None, rng=SEED)
        for value in values:
            assert acc.release(m, value, dataset="d", label="choice") in self.outcomes(m)
        texts = json.dumps(m.params()) + "".join(e.text for e in acc.ledger.entries())
        for needle in needles:
            assert needle not in texts

    def test_prepare_rejects(self, bad_value: Any) -> None:
        value, error = bad_value
        with pytest.raises(error) as info:
            self.make().prepare(value)
        assert isinstance(info.value, PrivacyError)
        assert info.value.argument == self.value_argument
        assert repr(self.value_argument) in str(info.value)

    def test_release_of_bad_value_changes_nothing(self, bad_value: Any) -> None:
        value, error = bad_value
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(100.0, 0.5), rng=rng)
        acc.release(self.make(), self.value, dataset="d")
        before = snapshot(acc.ledger, rng)
        with pytest.raises(error):
            acc.release(self.make(), value, dataset="d")
        assert snapshot(acc.ledger, rng) == before
        assert acc.spent("d") == self.expected_cost

    def test_same_seed_same_answer_and_no_draw_before_release(self) -> None:
        rng_a, rng_b = np.random.default_rng(SEED), np.random.default_rng(SEED)
        acc_a, acc_b = Accountant(None, rng=rng_a), Accountant(None, rng=rng_b)
        state = copy.deepcopy(rng_a.bit_generator.state)
        self.make().prepare(self.value)
        assert acc_a.can_afford(self.make())
        assert rng_a.bit_generator.state == state  # neither prepare nor a dry run draws
        answers_a = [acc_a.release(self.make(), self.value) for _ in range(20)]
        answers_b = [acc_b.release(self.make(), self.value) for _ in range(20)]
        assert answers_a == answers_b
        assert rng_a.bit_generator.state != state

    def test_refusal_draws_nothing(self) -> None:
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(self.expected_cost.epsilon / 2), rng=rng)
        before = snapshot(acc.ledger, rng)
        with pytest.raises(BudgetExceededError):
            acc.release(self.make(), self.value)
        assert snapshot(acc.ledger, rng) == before

    # -- choice-shaped answers ------------------------------------------------------------------

    def test_answer_is_one_of_the_outcomes(self) -> None:
        m = self.make()
        acc = Accountant(None, rng=SEED)
        answers = {acc.release(m, self.value) for _ in range(50)}
        assert answers <= set(self.outcomes(m))
        assert isinstance(self.outcomes(m), tuple) and len(self.outcomes(m)) >= self.min_outcomes

    def test_overwhelming_value_decides_the_answer(self) -> None:
        overrides, value, answer = self.certain
        for seed in range(5):
            assert Accountant(None, rng=seed).release(self.make(**overrides), value) == answer

    def test_outcomes_are_copied_at_construction(self) -> None:
        """The outcomes are fixed when the mechanism is built: changing the list passed in
        afterwards changes neither the outcomes nor the cost."""
        items = list(self.outcomes(self.make()))
        m = self.make(**{self.outcomes_argument: items})
        items.append("added later")
        items[0] = "replaced later"
        assert "added later" not in self.outcomes(m) and "replaced later" not in self.outcomes(m)
        assert m.params() == self.make().params() and m.cost == self.expected_cost


# =================================================================================================
# StreamMechanismContract: the sparse-vector family (AboveThreshold, Sparse, NumericSparse)
# =================================================================================================

# Query values a session refuses, with the error type; each must name 'value' and leave the session
# where it was.
STREAM_BAD_QUERIES: list[Any] = [
    pytest.param((NAN, InvalidArgumentError), id="nan"),
    pytest.param((np.float64("nan"), InvalidArgumentError), id="np-nan"),
    pytest.param((INF, InvalidArgumentError), id="inf"),
    pytest.param((-INF, InvalidArgumentError), id="-inf"),
    pytest.param((np.float32("inf"), InvalidArgumentError), id="np32-inf"),
    pytest.param((10 ** 400, InvalidArgumentError), id="huge-int"),
    pytest.param(("3", InvalidTypeError), id="str"),
    pytest.param(("nan", InvalidTypeError), id="str-nan"),
    pytest.param((b"1", InvalidTypeError), id="bytes"),
    pytest.param((None, InvalidTypeError), id="None"),
    pytest.param((True, InvalidTypeError), id="bool"),
    pytest.param((np.bool_(True), InvalidTypeError), id="np-bool"),
    pytest.param(([1.0], InvalidTypeError), id="list"),
    pytest.param((np.array([1.0]), InvalidTypeError), id="array"),
    pytest.param((1 + 2j, InvalidTypeError), id="complex"),
]


class StreamMechanismContract(DocumentedAndExported):
    """The battery every sparse-vector mechanism passes. Subclasses set:

    Attributes:
        mechanism_class: the class under test.
        kwargs: a valid construction (threshold 10, so ``below``/``above`` are decided).
        expected_cost: the session's declared cost.
        max_positives: the cutoff c of that construction (AboveThreshold: 1).
        takes: which optional knobs the constructor has (``max_positives``, ``monotonic``,
            ``split``); AboveThreshold has none of them.
        split_length: how many relative shares ``split`` takes.
        below, above: query values answered ⊥ / ⊤ with overwhelming probability.
        near: query values close to the threshold, whose answers depend on the noise.
    """

    mechanism_class: ClassVar[type[Mechanism]]
    kwargs: ClassVar[dict[str, Any]]
    expected_cost: ClassVar[Budget]
    max_positives: ClassVar[int]
    takes: ClassVar[tuple[str, ...]] = ("max_positives", "monotonic", "split")
    split_length: ClassVar[int] = 2
    below: ClassVar[float] = -1e9
    above: ClassVar[float] = 1e9
    near: ClassVar[tuple[float, ...]] = (-30.0, 5.0, 9.0, 10.0, 12.0, 20.0, 50.0, 0.0, 15.0, 11.0)
    extra_bad: ClassVar[list[Any]] = []

    @classmethod
    def bad_constructions(cls) -> list[Any]:
        cases = _number_cases("epsilon") + _number_cases("sensitivity") + [
            _bad({"threshold": NAN}, InvalidArgumentError, "threshold", "threshold-nan"),
            _bad({"threshold": INF}, InvalidArgumentError, "threshold", "threshold-inf"),
            _bad({"threshold": -INF}, InvalidArgumentError, "threshold", "threshold--inf"),
            _bad({"threshold": 10 ** 400}, InvalidArgumentError, "threshold", "threshold-huge"),
            _bad({"threshold": "10"}, InvalidTypeError, "threshold", "threshold-str"),
            _bad({"threshold": None}, InvalidTypeError, "threshold", "threshold-None"),
            _bad({"threshold": True}, InvalidTypeError, "threshold", "threshold-bool"),
        ]
        if "max_positives" in cls.takes:
            cases += [
                _bad({"max_positives": 0}, InvalidArgumentError, "max_positives", "c-zero"),
                _bad({"max_positives": -1}, InvalidArgumentError, "max_positives", "c-negative"),
                _bad({"max_positives": np.int64(0)}, InvalidArgumentError, "max_positives",
                     "c-np-zero"),
                _bad({"max_positives": 1.5}, InvalidTypeError, "max_positives", "c-float"),
                _bad({"max_positives": 2.0}, InvalidTypeError, "max_positives", "c-whole-float"),
                _bad({"max_positives": INF}, InvalidTypeError, "max_positives", "c-inf"),
                _bad({"max_positives": NAN}, InvalidTypeError, "max_positives", "c-nan"),
                _bad({"max_positives": None}, InvalidTypeError, "max_positives", "c-None"),
                _bad({"max_positives": True}, InvalidTypeError, "max_positives", "c-bool"),
                _bad({"max_positives": "3"}, InvalidTypeError, "max_positives", "c-str"),
            ]
        if "monotonic" in cls.takes:
            cases += [
                _bad({"monotonic": "yes"}, InvalidTypeError, "monotonic", "monotonic-str"),
                _bad({"monotonic": 1}, InvalidTypeError, "monotonic", "monotonic-int"),
                _bad({"monotonic": None}, InvalidTypeError, "monotonic", "monotonic-None"),
            ]
        if "split" in cls.takes:
            n = cls.split_length
            ones = (1.0,) * n
            cases += [
                _bad({"split": ones[:-1]}, InvalidTypeError, "split", "split-too-short"),
                _bad({"split": ones + (1.0,)}, InvalidTypeError, "split", "split-too-long"),
                _bad({"split": "11"}, InvalidTypeError, "split", "split-str"),
                _bad({"split": 1.0}, InvalidTypeError, "split", "split-number"),
                _bad({"split": {1.0, 2.0}}, InvalidTypeError, "split", "split-set"),
            ]
            for weight, error, name in ((0.0, InvalidArgumentError, "zero"),
                                        (-1.0, InvalidArgumentError, "negative"),
                                        (NAN, InvalidArgumentError, "nan"),
                                        (INF, InvalidArgumentError, "inf"),
                                        ("1", InvalidTypeError, "str")):
                split = ones[:-1] + (weight,)
                cases.append(_bad_item({"split": split}, error, f"split[{n - 1}]", weight,
                                       f"split-share-{name}"))
        return cases + list(cls.extra_bad)

    @classmethod
    def bad_values(cls) -> list[Any]:
        return STREAM_BAD_QUERIES

    def make(self, **overrides: Any) -> Mechanism:
        return self.mechanism_class(**{**self.kwargs, **overrides})

    def ask(self, session: Session, value: Any) -> Any:
        """One query: ``query`` on a session that releases values (True/False becomes the value or
        None), else ``test``."""
        return session.query(value) if isinstance(session, NumericSession) else session.test(value)

    # -- the declared cost ------------------------------------------------------------------------

    def test_cost_is_declared_budget(self) -> None:
        m = self.make()
        assert isinstance(m.cost, Budget)
        assert m.cost == self.expected_cost
        assert m.charge.epsilon == m.cost.epsilon and m.charge.delta == m.cost.delta
        assert m.charge.mechanism == m.name == self.mechanism_class.__name__
        assert m.max_positives == self.max_positives
        assert isinstance(m, mechanisms.StreamMechanism)

    def test_cost_is_pure_function_of_parameters(self) -> None:
        assert self.make().cost == self.make().cost
        assert self.make().params() == self.make().params()
        eps = self.kwargs["epsilon"]
        assert self.make(epsilon=eps / 2).cost == Budget(eps / 2)
        # The threshold and the sensitivity move the noise, never the cost.
        assert self.make(threshold=-3.0, sensitivity=7.0).cost == self.expected_cost

    def test_shares_never_sum_above_the_cost(self) -> None:
        p = self.make().params()
        shares = [Fraction(v) for k, v in p.items() if k.startswith("epsilon_")]
        assert len(shares) == (3 if self.mechanism_class.releases_values else 2)
        assert sum(shares) <= Fraction(self.expected_cost.epsilon)

    # -- immutability and params ------------------------------------------------------------------

    def test_immutable(self) -> None:
        assert_immutable(self.make(), ["epsilon", "max_positives", "query_scale"])

    def test_params_json_and_public_only(self) -> None:
        m = self.make()
        _assert_params_public(m.params(), ("epsilon", "threshold", "max_positives", "sensitivity",
                                           "threshold_scale", "query_scale"), ("monotonic",))
        assert repr(m).startswith(self.mechanism_class.__name__ + "(")

    # -- bad constructions; the broken variants -----------------------------------------------

    def test_bad_construction_rejected(self, bad_construction: Any) -> None:
        _assert_bad_construction(self.make, bad_construction)

    def test_broken_variants_cannot_be_built(self) -> None:
        """Lyu–Su–Li 2017's broken variants have no public constructor: no knob sets a noise
        scale, there is no stream without a cutoff, no share of ε can be zero, the query noise
        always carries c, and only a mechanism that pays a share for it releases numbers."""
        for knob in ("scale", "query_scale", "threshold_scale", "noise_scale", "answer_scale"):
            with pytest.raises(TypeError):  # not a keyword the constructor knows
                self.make(**{knob: 1.0})
        if "max_positives" in self.takes:
            for no_cutoff in (None, 0, INF):
                with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
                    self.make(max_positives=no_cutoff)
                assert info.value.argument == "max_positives"
        else:
            with pytest.raises(TypeError):  # the cutoff is fixed
                self.make(max_positives=2)
        if "split" in self.takes:
            free = (1.0,) * (self.split_length - 1) + (0.0,)
            with pytest.raises(InvalidArgumentError):
                self.make(split=free)
        else:
            with pytest.raises(TypeError):
                self.make(split=(1.0, 1.0))
        for monotonic in ((False, True) if "monotonic" in self.takes else (False,)):
            m = self.make(**({"monotonic": monotonic} if "monotonic" in self.takes else {}))
            per_query = Fraction(m.max_positives * (1 if monotonic else 2))
            exact = per_query * Fraction(m.sensitivity) / Fraction(m.epsilon_queries)
            assert Fraction(m.query_scale) >= exact  # the noise carries c, rounded up
            assert Fraction(m.threshold_scale) >= Fraction(m.sensitivity) / Fraction(
                m.epsilon_threshold)
        m = self.make()
        acc = Accountant(None, rng=SEED)
        with acc.session(m) as session:
            assert hasattr(session, "query") == self.mechanism_class.releases_values
        if self.mechanism_class.releases_values:
            exact = Fraction(m.max_positives) * Fraction(m.sensitivity) / Fraction(
                m.epsilon_answers)
            assert Fraction(m.answer_scale) >= exact

    # -- never one-shot --------------------------------------------------------------------------

    def test_one_shot_release_is_refused_and_debits_nothing(self) -> None:
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(10.0), rng=rng)
        before = snapshot(acc.ledger, rng)
        for attempt in (lambda: acc.release(self.make(), 1.0),
                        lambda: acc.release_many([(self.make(), 1.0)])):
            with pytest.raises(InvalidTypeError) as info:
                attempt()
            assert info.value.argument == "mechanism"
            assert "session" in str(info.value)
        assert snapshot(acc.ledger, rng) == before
        assert acc.spent() == Budget(0.0)

    # -- a session ---------------------------------------------------------------------------------

    def test_session_debits_the_full_cost_once(self) -> None:
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(10.0), rng=rng)
        start = copy.deepcopy(rng.bit_generator.state)
        with commit_spy(rng) as spy:
            session = acc.session(self.make(), dataset="d", label="svt")
        # The debit committed before anything was drawn; opening then drew the threshold noise.
        assert spy.seen == [(1, "session", start)]
        assert rng.bit_generator.state != start
        assert type(session) is (NumericSession if self.mechanism_class.releases_values
                                 else Session)
        (opened,) = records(acc)
        assert set(opened) == RELEASE_MEMBERS
        assert opened["kind"] == "session" and opened["dataset"] == "d"
        assert opened["label"] == "svt"
        assert Budget(opened["cost"]["epsilon"], opened["cost"]["delta"]) == self.expected_cost
        assert opened["mechanism"] == {"name": self.mechanism_class.__name__,
                                       "params": self.make().params()}
        assert acc.spent("d") == self.expected_cost
        assert session.receipt.seq == opened["seq"] and session.receipt.cost == self.expected_cost
        head, accounts = acc.ledger.head(), acc.ledger.accounts()
        for _ in range(2_000):  # ⊥ answers cost nothing more
            assert self.ask(session, self.below) in (False, None)
        assert acc.ledger.head() == head and acc.ledger.accounts() == accounts
        assert acc.spent("d") == self.expected_cost
        assert (session.answered, session.positives) == (2_000, 0)
        session.close()

    def test_cutoff_after_max_positives(self) -> None:
        acc = Accountant(Budget(10.0), rng=SEED)
        session = acc.session(self.make())
        for i in range(self.max_positives):
            assert self.ask(session, self.below) in (False, None)
            answer = self.ask(session, self.above)
            assert answer is True or isinstance(answer, float)
        answered = session.answered
        assert (answered, session.positives) == (2 * self.max_positives, self.max_positives)
        head = acc.ledger.head()
        for value in (self.above, self.below, NAN):
            with pytest.raises(MechanismExhaustedError) as info:
                self.ask(session, value)
            assert (info.value.answered, info.value.positives) == (answered, self.max_positives)
            assert session.answered == answered
        assert not session.closed and acc.ledger.head() == head
        assert acc.spent() == self.expected_cost
        session.close()
        with pytest.raises(MechanismExhaustedError):
            session.test(self.below)

    def test_close_writes_one_zero_cost_record_of_counts(self) -> None:
        secrets = [-987654.3212345, -314159.26535, -161803.39887, 271828182.84]  # ⊥, ⊥, ⊥, ⊤
        acc = Accountant(Budget(10.0), rng=SEED)
        with acc.session(self.make(), dataset="d", label="svt") as session:
            answers = [self.ask(session, v) for v in secrets]
            accounts = acc.ledger.accounts()
        assert session.closed
        positives = sum(1 for a in answers if a is True or isinstance(a, float))
        assert positives == 1
        opened, closed = records(acc)
        assert set(closed) == SESSION_CLOSE_MEMBERS
        assert closed["kind"] == "session-close" and closed["session"] == opened["seq"]
        assert (closed["answered"], closed["positives"]) == (4, 1)
        assert type(closed["answered"]) is int and type(closed["positives"]) is int
        assert closed["cost"] == {"epsilon": 0.0, "delta": 0.0, "rho": None, "mu": None}
        assert closed["accounts"] == {}
        assert (closed["dataset"], closed["label"], closed["mechanism"]) == (
            opened["dataset"], opened["label"], opened["mechanism"])
        assert acc.ledger.accounts() == accounts  # the close changes no account
        assert acc.spent("d") == self.expected_cost
        texts = "".join(e.text for e in acc.ledger.entries())
        for secret in secrets:
            assert repr(secret) not in texts and f"{secret:.1f}" not in texts
        head = acc.ledger.head()
        session.close()  # idempotent: still one close record
        assert acc.ledger.head() == head
        assert_chain(acc.ledger)

    def test_session_sampler_lives_as_long_as_the_session(self) -> None:
        """The sampler a session's stream keeps draws while the session is open, and nothing once
        it is closed; its records name the class itself and audit clean."""
        kept: list[Any] = []

        class Keeper(self.mechanism_class):  # type: ignore[name-defined,misc]
            def _open(self, sampler: Any) -> Any:
                kept.append(sampler)
                return super()._open(sampler)

        acc = Accountant(None, rng=SEED)
        with acc.session(Keeper(**self.kwargs)) as session:
            self.ask(session, self.below)
            assert isinstance(kept[0].bits.word(), int)  # alive for the session's life
        assert_spent_samplers(kept, 1)
        acc.session(self.mechanism_class(**self.kwargs), dataset="d").close()
        assert records(acc)[-1]["mechanism"]["name"] == self.mechanism_class.__name__
        assert_no_library_problem(acc)
        assert_final_members(self.mechanism_class)

    def test_refused_session_opens_nothing(self) -> None:
        cost = self.expected_cost
        for limit, first in ((Budget(cost.epsilon / 2), False), (Budget(cost.epsilon * 1.5), True)):
            rng = np.random.default_rng(SEED)
            acc = Accountant(limit, rng=rng)
            if first:
                acc.session(self.make()).close()
            before = snapshot(acc.ledger, rng)
            with pytest.raises(BudgetExceededError) as info:
                acc.session(self.make())
            assert info.value.requested == cost
            assert snapshot(acc.ledger, rng) == before
            assert acc.spent() == (cost if first else Budget(0.0))

    def test_bad_query_does_not_advance_the_session(self, bad_value: Any) -> None:
        """A refused query: a typed error naming 'value'; the counts, the ledger and the noise
        stream stay where they were, so the session answers exactly as a twin session that never
        saw the bad query."""
        value, error = bad_value
        acc, twin = Accountant(Budget(10.0), rng=SEED), Accountant(Budget(10.0), rng=SEED)
        m = self.make(max_positives=50) if "max_positives" in self.takes else self.make()
        with acc.session(m) as session, twin.session(m) as reference:
            head = acc.ledger.head()
            for q in self.near:
                if session.positives == m.max_positives:
                    break  # the cutoff: a further query would be refused anyway
                counts = (session.answered, session.positives)
                with pytest.raises(error) as info:
                    self.ask(session, value)
                assert isinstance(info.value, PrivacyError)
                assert info.value.argument == "value"
                assert (session.answered, session.positives) == counts
                assert self.ask(session, q) == self.ask(reference, q)
            assert acc.ledger.head() == head
            assert session.answered == reference.answered >= 1



# =================================================================================================
# CompositionRuleContract: every rule in RULES, through the Accountant and the rule-level API
# =================================================================================================

# Arguments that make each rule valid, for probing a ledger with "another rule".
RULE_ARGUMENTS: dict[str, dict[str, Any]] = {
    "basic": {}, "advanced": {}, "optimal": {"per_query": Budget(0.5, 1e-7)}, "gaussian": {},
    "renyi": {}, "pld": {"step": (0.05, 2.0)},
}


def fill(acc: Accountant, mechanism: Mechanism, value: Any, cap: int = 20_000) -> int:
    """Release ``mechanism`` until refused; the number admitted."""
    for n in range(cap):
        try:
            acc.release(mechanism, value)
        except BudgetExceededError:
            return n
    raise AssertionError(f"more than {cap} releases admitted")


class CompositionRuleContract:
    """The battery every composition rule passes. Subclasses set:

    Attributes:
        rule: the rule's name in ``RULES``.
        limit: the limit the accountant enforces.
        per_query: the ``per_query`` argument (required by ``"optimal"``).
        steps: ``(mechanism, value)`` pairs the rule admits, of different costs; releases cycle
            through them.
        bad_arguments: rule-specific bad ``make_rule`` arguments:
            ``(limit, per_query, kwargs, error, argument)``.
    """

    rule: ClassVar[str]
    limit: ClassVar[Budget] = Budget(1.0, 1e-6)
    per_query: ClassVar[Budget | None] = None
    steps: ClassVar[list[tuple[Mechanism, Any]]]
    bad_arguments: ClassVar[list[tuple[Any, Any, dict[str, Any], type[Exception], str]]] = []

    # A cheap member of each mechanism family, with a valid value: which of them the rule admits
    # is decided by ``admits``.
    FAMILIES: ClassVar[list[tuple[Mechanism, Any]]] = [
        (mechanisms.Laplace(0.05, sensitivity=1.0), 1.0),
        (mechanisms.AnalyticGaussian(0.05, delta=1e-9, sensitivity=1.0), 1.0),
        (mechanisms.Gaussian(0.05, delta=1e-9, sensitivity=1.0), 1.0),
        (mechanisms.Exponential(0.05, candidates=["a", "b"], sensitivity=1.0), [1.0, 2.0]),
        (mechanisms.RandomizedResponse(0.05, categories=["yes", "no"]), "yes"),
    ]

    def accountant(self, rng: Any = SEED, ledger: Any = None) -> Accountant:
        return Accountant(self.limit, composition=self.rule, per_query=self.per_query, rng=rng,
                          simulation=True,
                          ledger=ledger)

    def make_rule(self) -> Any:
        return make_rule(self.rule, self.limit, self.per_query)

    def admits(self, m: Mechanism) -> bool:
        """Whether the rule accepts this kind of step at all (default: every step)."""
        return True

    def drive(self, acc: Accountant, before: Callable[[Mechanism], Any] | None = None,
              after: Callable[[Mechanism, bool, Any], None] | None = None) -> int:
        """Cycle through ``steps`` until a whole cycle is refused; ``before(m)`` runs before each
        attempt and its result is passed to ``after(m, admitted, result)``. The count admitted."""
        idle = admitted = i = 0
        while idle < len(self.steps):
            m, value = self.steps[i % len(self.steps)]
            i += 1
            seen = before(m) if before else None
            try:
                acc.release(m, value)
            except BudgetExceededError:
                idle += 1
                ok = False
            else:
                idle, admitted, ok = 0, admitted + 1, True
            if after:
                after(m, ok, seen)
            assert i < 20_000, "the limit never refuses"
        return admitted

    # -- spend ------------------------------------------------------------------------------------

    def test_spent_is_monotone_and_never_beyond_the_limit(self) -> None:
        acc = self.accountant()
        assert acc.spent() == Budget(0.0)
        trail = [acc.spent()]

        def after(m: Mechanism, admitted: bool, _: Any) -> None:
            spent = acc.spent()
            last = trail[-1]
            assert spent.epsilon >= last.epsilon and spent.delta >= last.delta
            assert within_limit(spent, self.limit), (spent, self.limit)
            if not admitted:
                assert spent == last  # a refusal spends nothing
            trail.append(spent)

        admitted = self.drive(acc, after=after)
        assert admitted >= 3 and trail[-1] != Budget(0.0)
        remaining = acc.remaining()
        assert remaining.epsilon >= 0.0 and remaining.delta >= 0.0

    def test_max_releases_equals_what_is_admitted(self) -> None:
        for first in [None] + self.steps:
            for m, value in self.steps:
                acc = self.accountant()
                if first is not None:
                    acc.release(*first)
                predicted = acc.max_releases(m)
                assert fill(acc, m, value) == predicted, (first, m)
                assert acc.max_releases(m) == 0 and not acc.can_afford(m)

    def test_can_afford_agrees_with_release_and_writes_nothing(self) -> None:
        rng = np.random.default_rng(SEED)
        acc = self.accountant(rng=rng)

        def before(m: Mechanism) -> bool:
            state = snapshot(acc.ledger, rng)
            answer = acc.can_afford(m)
            planned = acc.max_releases(m)
            assert snapshot(acc.ledger, rng) == state  # dry runs write and draw nothing
            assert answer == (planned > 0)
            return answer

        def after(m: Mechanism, admitted: bool, predicted: bool) -> None:
            assert admitted == predicted, m

        self.drive(acc, before, after)

    def test_refusal_leaves_ledger_and_rng_unchanged(self) -> None:
        rng = np.random.default_rng(SEED)
        acc = self.accountant(rng=rng)
        self.drive(acc)
        for m, value in self.steps:
            before = snapshot(acc.ledger, rng)
            with pytest.raises(BudgetExceededError) as info:
                acc.release(m, value)
            assert info.value.requested == m.cost and info.value.account == "dataset:default"
            assert snapshot(acc.ledger, rng) == before

    def test_which_mechanisms_are_admitted(self) -> None:
        """A step the rule cannot account at all is refused with ``MechanismNotAllowedError`` by
        ``release``, ``can_afford`` and ``max_releases`` alike, and changes nothing; every other
        family is admitted."""
        for m, value in self.FAMILIES:
            rng = np.random.default_rng(SEED)
            acc = self.accountant(rng=rng)
            if self.admits(m):
                assert acc.can_afford(m) and acc.max_releases(m) > 0
                acc.release(m, value)
                continue
            before = snapshot(acc.ledger, rng)
            for attempt in (lambda: acc.release(m, value), lambda: acc.can_afford(m),
                            lambda: acc.max_releases(m)):
                with pytest.raises(MechanismNotAllowedError):
                    attempt()
            assert snapshot(acc.ledger, rng) == before

    # -- a durable ledger ------------------------------------------------------------------------

    def test_rebuilt_accountant_resumes_the_same_spend(self, tmp_path: Any) -> None:
        """Stopping part-way and rebuilding the accountant on the same SQLite file resumes the
        same ``spent``/``remaining``/``max_releases``, and then admits exactly what one accountant
        running the same schedule without a restart admits."""
        m, value = self.steps[0]
        half = self.accountant().max_releases(m) // 2
        reference = self.accountant()
        for _ in range(half):
            reference.release(m, value)
        expected = (reference.spent(), reference.remaining(),
                    [reference.max_releases(s) for s, _ in self.steps])
        expected_rest = self.drive(reference)
        path = tmp_path / "ledger.db"
        with self.accountant(ledger=path) as acc:
            for _ in range(half):
                acc.release(m, value)
            assert (acc.spent(), acc.remaining(),
                    [acc.max_releases(s) for s, _ in self.steps]) == expected
        with self.accountant(rng=SEED + 1, ledger=path) as acc:
            assert (acc.spent(), acc.remaining(),
                    [acc.max_releases(s) for s, _ in self.steps]) == expected
            assert self.drive(acc) == expected_rest
            assert acc.spent() == reference.spent()
            assert within_limit(acc.spent(), self.limit)
            assert_chain(acc.ledger)

    def test_another_rule_on_the_same_ledger_is_refused(self, tmp_path: Any) -> None:
        path = tmp_path / "ledger.db"
        with self.accountant(ledger=path) as acc:
            acc.release(*self.steps[0])
            spent = acc.spent()
        probe = mechanisms.AnalyticGaussian(0.1, delta=1e-8, sensitivity=1.0)  # every rule admits it
        with SqliteLedger(path) as ledger:
            before = snapshot(ledger)
        for other in sorted(set(RULES) - {self.rule}):
            def use(call: Callable[[Accountant], Any]) -> None:
                other_acc = Accountant(self.limit, composition=other, ledger=path, rng=SEED,
                                       simulation=True,
                                       **RULE_ARGUMENTS[other])
                try:
                    call(other_acc)
                finally:
                    other_acc.close()

            for call in (lambda a: a.spent(), lambda a: a.release(probe, 1.0),
                         lambda a: a.can_afford(probe)):
                with pytest.raises(LedgerConflictError) as info:
                    use(call)
                assert self.rule in str(info.value) and other in str(info.value)
        with SqliteLedger(path) as ledger:
            assert snapshot(ledger) == before
        with self.accountant(ledger=path) as acc:  # the rightful rule still continues
            assert acc.spent() == spent
            acc.release(*self.steps[0])

    # -- construction ----------------------------------------------------------------------------

    def test_bad_arguments_are_typed(self) -> None:
        cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
            (lambda: make_rule(3, self.limit, self.per_query), InvalidTypeError, "composition"),
            (lambda: make_rule(None, self.limit, self.per_query), InvalidTypeError,
             "composition"),
            (lambda: make_rule(self.rule.upper(), self.limit, self.per_query),
             InvalidArgumentError, "composition"),
            (lambda: make_rule(self.rule + " ", self.limit, self.per_query),
             InvalidArgumentError, "composition"),
            (lambda: Accountant(self.limit, composition=self.rule.title(),
                                per_query=self.per_query), InvalidArgumentError, "composition"),
            (lambda: Accountant("1.0", composition=self.rule, per_query=self.per_query),
             InvalidTypeError, "limit"),
            (lambda: Accountant(1.0, composition=self.rule, per_query=self.per_query),
             InvalidTypeError, "limit"),
            (lambda: Accountant(self.limit, composition=self.rule, per_query=0.5),
             InvalidTypeError, "per_query"),
        ]
        if self.rule != "advanced":
            cases.append((lambda: make_rule(self.rule, self.limit, self.per_query,
                                            conversion_share=0.5),
                          InvalidArgumentError, "conversion_share"))
        for limit, per_query, kwargs, error, argument in self.bad_arguments:
            cases.append((lambda limit=limit, per_query=per_query, kwargs=kwargs:
                          make_rule(self.rule, limit, per_query, **kwargs), error, argument))
            if not kwargs:  # the same through the Accountant
                cases.append((lambda limit=limit, per_query=per_query:
                              Accountant(limit, composition=self.rule, per_query=per_query),
                              error, argument))
        for build, error, argument in cases:
            with pytest.raises(error) as info:
                build()
            assert isinstance(info.value, PrivacyError)
            assert info.value.argument == argument

    @pytest.mark.parametrize(("limit", "per_query", "argument"), [
        pytest.param("1.0", None, "limit", id="limit-str"),
        pytest.param(1.0, None, "limit", id="limit-float"),
        pytest.param({"epsilon": 1.0}, None, "limit", id="limit-dict"),
        pytest.param(Budget(1.0, 1e-6), 0.5, "per_query", id="per-query-float"),
    ])
    def test_make_rule_rejects_a_non_budget_with_a_typed_error(self, limit: Any, per_query: Any,
                                                               argument: str) -> None:
        if argument == "limit" and self.rule == "optimal":
            per_query = self.per_query
        with pytest.raises(InvalidTypeError) as info:  # at construction, or at the latest on use
            rule = make_rule(self.rule, limit, per_query)
            rule.describe()
            rule.debit(rule.initial_state(), Charge(0.01, 0.0, 0.0, 0.01))
        assert info.value.argument == argument

    # -- the rule-level API ----------------------------------------------------------------------

    def test_debit_never_mutates_state_and_refuses_when_over(self) -> None:
        rule = self.make_rule()
        state = rule.initial_state()
        canonical(state)  # JSON: any ledger can store it
        idle = refusals = i = 0
        while idle < len(self.steps):
            m, _ = self.steps[i % len(self.steps)]
            i += 1
            frozen = copy.deepcopy(state)
            try:
                new = rule.debit(state, m.charge)
            except Refused as refusal:
                assert state == frozen
                assert isinstance(refusal.reason, str) and refusal.reason
                idle, refusals = idle + 1, refusals + 1
                continue
            assert state == frozen and new is not state
            canonical(new)
            old_spent, new_spent = rule.spent(state), rule.spent(new)
            assert new_spent.epsilon >= old_spent.epsilon and new_spent.delta >= old_spent.delta
            assert within_limit(new_spent, self.limit)
            idle, state = 0, new
        assert refusals >= len(self.steps)

    def test_max_steps_equals_sequential_debits(self) -> None:
        rule = self.make_rule()
        for m, _ in self.steps:
            state, n = rule.initial_state(), 0
            predicted = rule.max_steps(state, m.charge)
            frozen = copy.deepcopy(state)
            while True:
                try:
                    state = rule.debit(state, m.charge)
                except Refused:
                    break
                n += 1
            assert n == predicted, m
            assert rule.max_steps(state, m.charge) == 0
            assert frozen == rule.initial_state()

    def test_initial_state_is_fresh(self) -> None:
        rule = self.make_rule()
        a, b = rule.initial_state(), rule.initial_state()
        assert a == b and a is not b
        assert rule.spent(a) == Budget(0.0)
        assert rule.remaining(a) == self.limit
