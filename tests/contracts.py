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

Neither class is named ``Test*``, so pytest collects them only through their subclasses.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import threading
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import pytest

import mechanisms
from accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
    PrivacyError,
)
from accountant.ledger import GENESIS, Account, Entry, canonical, record_hash


def fields(**members: Any) -> dict[str, str]:
    """A record's members in the form ``Transaction.append`` takes: canonical JSON texts."""
    return {k: canonical(v) for k, v in members.items()}
from mechanisms.base import Mechanism
from tests.support import SEED, assert_chain, snapshot

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


class MechanismContract:
    """The battery every mechanism passes. Subclasses set:

    Attributes:
        mechanism_class: the class under test.
        kwargs: a valid construction.
        expected_cost: ``mechanism_class(**kwargs).cost``.
        extra_bad: bad constructions specific to the class (``_bad(...)`` params).
        has_delta: whether the class takes ``delta`` (then δ cases are added).
    """

    mechanism_class: ClassVar[type[Mechanism]]
    kwargs: ClassVar[dict[str, Any]]
    expected_cost: ClassVar[Budget]
    extra_bad: ClassVar[list[Any]] = []
    has_delta: ClassVar[bool] = False

    @classmethod
    def bad_constructions(cls) -> list[Any]:
        cases = _number_cases("epsilon") + _number_cases("sensitivity") + list(cls.extra_bad)
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
        acc.release(m, 1.0, dataset="d")
        assert acc.spent("d") == m.cost
        with pytest.raises(BudgetExceededError) as info:
            acc.release(m, 1.0, dataset="d")
        assert info.value.requested == m.cost and info.value.dataset == "d"

    # -- immutability -------------------------------------------------------------------------

    def test_immutable(self) -> None:
        m = self.make()
        before = (m.cost, m.params())
        for name in list(m.params()) + ["cost_override", "_cost", "epsilon"]:
            with pytest.raises(AttributeError):
                setattr(m, name, 1e6)
        with pytest.raises(AttributeError):
            m.cost = Budget(100.0)  # type: ignore[misc]
        assert (m.cost, m.params()) == before

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
        acc.release(self.make(), 1.0, dataset="d")
        before = snapshot(acc.ledger, rng)
        with pytest.raises(error):
            acc.release(self.make(), value, dataset="d")
        assert snapshot(acc.ledger, rng) == before
        assert acc.spent("d") == self.expected_cost

    @pytest.mark.parametrize("value", GOOD_SCALARS)
    def test_scalar_in_float_out(self, value: Any) -> None:
        assert type(self.make().prepare(value)) is float
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
        original = m._release

        def spy(value: Any, sampler: Any) -> Any:
            seen.append(acc.ledger.head()[0])  # the record must already be committed
            return original(value, sampler)

        object.__setattr__(m, "_release", spy)
        acc.release(m, 1.0)
        assert seen == [1]

    def test_refusal_draws_nothing(self) -> None:
        rng = np.random.default_rng(SEED)
        acc = Accountant(Budget(self.expected_cost.epsilon / 2), rng=rng)
        before = snapshot(acc.ledger, rng)
        with pytest.raises(BudgetExceededError):
            acc.release(self.make(), 1.0)
        assert snapshot(acc.ledger, rng) == before

    # -- documented and exported --------------------------------------------------------------

    def test_documented(self) -> None:
        doc = self.mechanism_class.__doc__ or ""
        assert len(doc.strip()) > 40
        assert re.search(r"\b(19|20)\d\d\b", doc), "the docstring must cite its paper (year)"
        assert ">>>" in doc, "the docstring must carry a runnable example"

    def test_exported(self) -> None:
        name = self.mechanism_class.__name__
        assert name in mechanisms.__all__
        assert getattr(mechanisms, name) is self.mechanism_class


class LedgerContract:
    """The battery every ledger backend passes, run once per entry of ``LEDGER_BACKENDS``."""

    @staticmethod
    def _append(ledger: Any, n: int = 1, key: str = "dataset:a") -> list[Entry]:
        out = []
        for i in range(n):
            with ledger.transaction() as tx:
                prev = tx.account(key)
                total = (prev.state["epsilon"] if prev else 0.0) + 0.25
                out.append(tx.append(fields(kind="release", dataset=key, i=i),
                                     [Account(key, "basic", {"rule": "basic"},
                                              {"epsilon": total, "delta": 0.0}, 0)]))
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
            entry = tx.append(fields(kind="release", dataset="a", label="é ünïcode"), [account])
            assert tx.account("dataset:a").state == account.state  # read-your-writes
        assert entry.seq == 1
        (stored,) = list(ledger.entries())
        assert stored == entry
        record = stored.record
        assert record["kind"] == "release" and record["label"] == "é ünïcode"
        assert record["seq"] == 1 and record["prev"] == GENESIS and record["v"] == 1
        assert record["time"].endswith("+00:00") and record["auth"] == "sha256"
        assert ledger.head() == (1, entry.hash)
        got = ledger.account("dataset:a")
        assert (got.key, got.rule, got.config, got.state, got.seq) == (
            "dataset:a", "basic", {"rule": "basic", "limit": None},
            {"epsilon": 0.1, "delta": 1e-7}, 1)

    def test_rollback_on_exception_leaves_nothing(self, ledger: Any) -> None:
        self._append(ledger, 2)
        before = snapshot(ledger)

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            with ledger.transaction() as tx:
                tx.append(fields(kind="release"), [
                    Account("dataset:a", "basic", {}, {"e": 9.0}, 0),
                    Account("dataset:b", "basic", {}, {"e": 9.0}, 0)])
                tx.append(fields(kind="release"), [])
                raise Boom
        assert snapshot(ledger) == before
        assert ledger.account("dataset:b") is None
        # ... and the ledger is usable afterwards, continuing the chain from the last commit.
        (entry,) = self._append(ledger, 1)
        assert entry.seq == 3 and entry.record["prev"] == before[0][-1][2]
        assert_chain(ledger)

    def test_rollback_on_keyboard_interrupt(self, ledger: Any) -> None:
        before = snapshot(ledger)
        with pytest.raises(KeyboardInterrupt):
            with ledger.transaction() as tx:
                tx.append(fields(kind="release"), [])
                raise KeyboardInterrupt
        assert snapshot(ledger) == before

    def test_unserialisable_record_is_refused_and_rolled_back(self, ledger: Any) -> None:
        self._append(ledger, 1)
        before = snapshot(ledger)
        with pytest.raises(ValueError):
            with ledger.transaction() as tx:
                tx.append(fields(kind="release", bad=float("nan")), [])
        assert snapshot(ledger) == before

    def test_hash_chain_links(self, ledger: Any) -> None:
        entries = self._append(ledger, 6)
        stored = list(ledger.entries())
        assert stored == entries
        assert stored[0].record["prev"] == GENESIS
        for before, after in zip(stored, stored[1:]):
            assert after.record["prev"] == before.hash
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
                tx.append(fields(kind="release", i=i), [])
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
            tx.append(fields(kind="release"), [Account("dataset:x", "basic", {}, state, 0)])
        assert ledger_opener().account("dataset:x").state == state

    def test_head(self, ledger: Any) -> None:
        assert ledger.head() == (0, GENESIS)
        entries = self._append(ledger, 3)
        assert ledger.head() == (3, entries[-1].hash)

    def test_concurrent_threads_keep_the_chain(self, ledger: Any) -> None:
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                barrier.wait()
                self._append(ledger, 25)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert assert_chain(ledger) == 100
        assert ledger.account("dataset:a").state["epsilon"] == 25.0  # no lost update

    def test_hmac_chain(self, ledger_opener: Any) -> None:
        """With a secret key each hash is HMAC-SHA256(key, text) and the record says so."""
        key = b"correct horse battery staple"
        ledger = ledger_opener(hmac_key=key)
        assert ledger.authenticated
        entries = self._append(ledger, 3)
        prev = GENESIS
        for e in entries:
            assert e.record["auth"] == "hmac-sha256" and e.record["prev"] == prev
            assert e.hash == hmac.new(key, e.text.encode("utf-8"), hashlib.sha256).hexdigest()
            assert e.hash != hashlib.sha256(e.text.encode("utf-8")).hexdigest()
            prev = e.hash

    def test_context_manager_and_close_idempotent(self, ledger: Any) -> None:
        with ledger as same:
            assert same is ledger
        ledger.close()
