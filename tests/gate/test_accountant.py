"""The ``Accountant`` gate: the issue's example, per-dataset limit semantics, exact fitting of
100 × 0.01 in 1.0, every kind of bad input and every refusal leaving the ledger and the RNG
untouched, ``can_afford``, ``last_receipt``, no true value in the ledger, resuming from a ledger,
rule conflicts, the per-query cap, and thread safety."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    InvalidTypeError,
    LedgerConflictError,
    LedgerError,
    MechanismNotAllowedError,
    PrivacyError,
    Receipt,
    UnknownDatasetError,
)
from dpbudget.accountant.ledger import Account, Ledger, MemoryLedger, SqliteLedger
from dpbudget.mechanisms import AnalyticGaussian, Gaussian, Laplace
from dpbudget.policies import DatasetLimit
from tests.contracts import fields
from tests.support import SEED, assert_chain, release_entries, snapshot

NAN, INF = float("nan"), float("inf")


# -- the issue's example --------------------------------------------------------------------------

def test_issue_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    acc = Accountant(Budget(epsilon=1.0, delta=1e-6), ledger="sqlite:///budget.db")
    noisy = acc.release(Laplace(epsilon=0.1, sensitivity=1.0), 4213, dataset="adult",
                        label="adults over 40")
    assert type(noisy) is float and math.isfinite(noisy)
    spent, remaining = acc.spent("adult"), acc.remaining("adult")
    assert isinstance(spent, Budget) and isinstance(remaining, Budget)
    assert spent == Budget(0.1, 0.0)
    assert remaining.delta == 1e-6
    assert 0.9 - 1e-15 <= remaining.epsilon <= 0.9  # rounded down, never up
    assert acc.ledger.url.endswith("budget.db") and (tmp_path / "budget.db").exists()
    (entry,) = release_entries(acc.ledger)
    record = entry.record
    assert record["dataset"] == "adult" and record["label"] == "adults over 40"
    assert record["kind"] == "release" and record["analyst"] is None
    assert record["mechanism"]["name"] == "Laplace"
    assert record["mechanism"]["params"]["epsilon"] == 0.1
    assert record["cost"]["epsilon"] == 0.1 and record["cost"]["delta"] == 0.0
    assert record["accounts"]["dataset:adult"]["state"]["epsilon"] == 0.1
    assert record["accounts"]["dataset:adult"]["rule"] == "basic"
    acc.close()


# -- per-dataset limits ---------------------------------------------------------------------------

def test_single_limit_applies_to_every_dataset_separately() -> None:
    acc = Accountant(Budget(1.0), rng=SEED)
    for dataset in ("adult", "census", "web"):
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset=dataset)
        assert acc.spent(dataset) == Budget(1.0)
        assert acc.remaining(dataset) == Budget(0.0)
    assert len(acc.ledger.accounts()) == 3


def test_single_limit_refuses_only_the_exhausted_dataset() -> None:
    acc = Accountant(Budget(1.0), rng=SEED)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    with pytest.raises(BudgetExceededError) as info:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult")
    assert info.value.dataset == "adult"
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="census")  # its own population, its own limit
    assert [a.key for a in acc.ledger.accounts()] == ["dataset:adult", "dataset:census"]


def test_default_dataset_name() -> None:
    acc = Accountant(Budget(1.0), rng=SEED)
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    assert acc.spent() == acc.spent("default") == Budget(0.25)
    assert acc.last_receipt.dataset == "default"


def test_limits_mapping_refuses_unlisted_dataset(rng: np.random.Generator) -> None:
    acc = Accountant(limits={"adult": Budget(1.0), "census": DatasetLimit(limit=Budget(2.0))},
                     rng=rng)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
    acc.release(Laplace(2.0, sensitivity=1.0), 1.0, dataset="census")
    before = snapshot(acc.ledger, rng)
    with pytest.raises(UnknownDatasetError) as info:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="survey")
    err = info.value
    assert isinstance(err, InvalidArgumentError) and isinstance(err, ValueError)
    assert err.argument == "dataset" and err.value == "survey"
    assert "'survey'" in str(err) and "adult" in str(err) and "census" in str(err)
    with pytest.raises(UnknownDatasetError):
        acc.can_afford(Laplace(0.1, sensitivity=1.0), dataset="survey")
    with pytest.raises(UnknownDatasetError):
        acc.spent("survey")
    with pytest.raises(UnknownDatasetError):
        acc.remaining("survey")
    assert snapshot(acc.ledger, rng) == before


def test_limits_with_default_limit_for_the_rest() -> None:
    acc = Accountant(Budget(0.5), limits={"adult": Budget(2.0)}, rng=SEED)
    acc.release(Laplace(2.0, sensitivity=1.0), 1.0, dataset="adult")
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="survey")
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="survey")
    assert acc.limit("adult").limit == Budget(2.0)
    assert acc.limit("other").limit == Budget(0.5)


def test_no_limit_is_recorded(ledger: Ledger) -> None:
    acc = Accountant(None, ledger=ledger, rng=SEED, simulation=True)
    for _ in range(50):
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="sim")
    acc.release(AnalyticGaussian(1.0, delta=0.5, sensitivity=1.0), np.zeros(3), dataset="sim")
    assert acc.spent("sim").epsilon == 51.0 and acc.spent("sim").delta == 0.5
    assert acc.remaining("sim") == Budget.unlimited() and acc.remaining("sim").is_unlimited
    assert acc.can_afford(Laplace(1e6, sensitivity=1.0), dataset="sim")
    assert assert_chain(acc.ledger) == 51
    limits_none = Accountant(limits={"sim": None}, rng=SEED)
    limits_none.release(Laplace(100.0, sensitivity=1.0), 1.0, dataset="sim")
    assert limits_none.remaining("sim").is_unlimited
    with pytest.raises(UnknownDatasetError):
        limits_none.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="other")


def test_budget_inf_means_no_limit() -> None:
    acc = Accountant(Budget.unlimited(), rng=SEED)
    acc.release(Laplace(1e3, sensitivity=1.0), 1.0)
    assert acc.remaining().is_unlimited


# -- exact fitting --------------------------------------------------------------------------------

def test_hundred_hundredths_fit_and_the_101st_is_refused(ledger: Ledger,
                                                         rng: np.random.Generator) -> None:
    acc = Accountant(Budget(1.0), ledger=ledger, rng=rng, simulation=True)
    m = Laplace(0.01, sensitivity=1.0)
    for _ in range(100):
        acc.release(m, 12.0, dataset="adult")
    spent = acc.spent("adult")
    assert Fraction(spent.epsilon) >= 100 * Fraction(0.01)  # rounded up, never down
    assert spent.epsilon <= 1.0 * (1 + 1e-9)
    assert acc.remaining("adult") == Budget(0.0)
    assert not acc.can_afford(m, dataset="adult")
    before = snapshot(acc.ledger, rng)
    with pytest.raises(BudgetExceededError) as info:
        acc.release(m, 12.0, dataset="adult")
    err = info.value
    assert isinstance(err, PrivacyError)
    assert err.requested == Budget(0.01) and isinstance(err.requested, Budget)
    assert isinstance(err.remaining, Budget) and err.remaining.epsilon < 0.01
    assert err.dataset == "adult" and err.account == "dataset:adult"
    assert "adult" in str(err) and "0.01" in str(err)
    assert snapshot(acc.ledger, rng) == before
    assert len(release_entries(acc.ledger)) == 100
    assert assert_chain(acc.ledger) == 100


def test_hundred_hundredths_fit_with_delta_budget() -> None:
    acc = Accountant(Budget(1.0, 1e-6), rng=SEED)
    for _ in range(100):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)


@pytest.mark.parametrize("k", [3, 7, 10, 49, 1000])
def test_k_releases_of_one_over_k_fit_exactly(k: int) -> None:
    acc = Accountant(Budget(1.0), rng=SEED)
    m = Laplace(1.0 / k, sensitivity=1.0)
    for _ in range(k):
        acc.release(m, 0.0)
    with pytest.raises(BudgetExceededError):
        acc.release(m, 0.0)
    assert Fraction(acc.spent().epsilon) >= k * Fraction(1.0 / k)


def test_delta_budget_fits_exactly_and_is_enforced() -> None:
    acc = Accountant(Budget(100.0, 1e-5), rng=SEED)
    for _ in range(10):
        acc.release(AnalyticGaussian(1.0, delta=1e-6, sensitivity=1.0), 0.0)
    with pytest.raises(BudgetExceededError) as info:
        acc.release(AnalyticGaussian(1.0, delta=1e-6, sensitivity=1.0), 0.0)
    assert info.value.requested == Budget(1.0, 1e-6)
    acc.release(Laplace(1.0, sensitivity=1.0), 0.0)  # a pure-ε step still fits


def test_tolerance_is_relative_1e9_and_no_more() -> None:
    acc = Accountant(Budget(1.0), rng=SEED)
    assert acc.can_afford(Laplace(1.0 + 0.5e-9, sensitivity=1.0))
    assert not acc.can_afford(Laplace(1.0 + 2e-9, sensitivity=1.0))
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(1.0 + 2e-9, sensitivity=1.0), 0.0)
    acc.release(Laplace(1.0 + 0.5e-9, sensitivity=1.0), 0.0)


def test_zero_limit_admits_nothing() -> None:
    acc = Accountant(Budget(0.0), rng=SEED)
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(1e-12, sensitivity=1.0), 0.0)


# -- bad input and refusals change nothing --------------------------------------------------------

Call = Callable[[Accountant], Any]
CASES: list[Any] = []


def case(id: str, call: Call, error: type[BaseException], argument: str | None = None,
         shown: Any = None) -> None:
    CASES.append(pytest.param(call, error, argument, shown, id=id))


def rel(mechanism: Any, value: Any = 1.0, **kw: Any) -> Call:
    return lambda acc: acc.release(mechanism() if callable(mechanism) and not isinstance(
        mechanism, type) else mechanism, value, **{"dataset": "adult", **kw})


# bad mechanism parameters (the error comes while building the mechanism, before the gate)
case("eps-nan", rel(lambda: Laplace(NAN, sensitivity=1.0)), InvalidArgumentError, "epsilon", "nan")
case("eps-inf", rel(lambda: Laplace(INF, sensitivity=1.0)), InvalidArgumentError, "epsilon", "inf")
case("eps-negative", rel(lambda: Laplace(-0.1, sensitivity=1.0)), InvalidArgumentError, "epsilon", "-0.1")
case("eps-zero", rel(lambda: Laplace(0.0, sensitivity=1.0)), InvalidArgumentError, "epsilon", "0.0")
case("eps-str", rel(lambda: Laplace("0.1", sensitivity=1.0)), InvalidTypeError, "epsilon", "'0.1'")
case("eps-bool", rel(lambda: Laplace(True, sensitivity=1.0)), InvalidTypeError, "epsilon", "True")
case("delta-one", rel(lambda: AnalyticGaussian(0.1, delta=1.0, sensitivity=1.0)), InvalidArgumentError, "delta", "1.0")
case("delta-negative", rel(lambda: AnalyticGaussian(0.1, delta=-1e-9, sensitivity=1.0)), InvalidArgumentError, "delta",
     "-1e-09")
case("delta-nan", rel(lambda: AnalyticGaussian(0.1, delta=NAN, sensitivity=1.0)), InvalidArgumentError, "delta", "nan")
case("delta-zero-gaussian", rel(lambda: Gaussian(0.1, delta=0.0, sensitivity=1.0)), InvalidArgumentError, "delta", "0.0")
case("classic-eps-ge-1", rel(lambda: Gaussian(1.0, delta=1e-7, sensitivity=1.0)), InvalidArgumentError, "epsilon", "1.0")
case("sens-zero", rel(lambda: Laplace(0.1, sensitivity=0.0)), InvalidArgumentError, "sensitivity",
     "0.0")
case("sens-negative", rel(lambda: Laplace(0.1, sensitivity=-2.0)), InvalidArgumentError,
     "sensitivity", "-2.0")
case("sens-nan", rel(lambda: AnalyticGaussian(0.1, delta=1e-7, sensitivity=NAN)), InvalidArgumentError,
     "sensitivity", "nan")
# bad values
case("value-nan", rel(Laplace(0.1, sensitivity=1.0), NAN), InvalidArgumentError, "value", "nan")
case("value-inf", rel(Laplace(0.1, sensitivity=1.0), INF), InvalidArgumentError, "value", "inf")
case("value-str", rel(Laplace(0.1, sensitivity=1.0), "4213"), InvalidTypeError, "value", "got a str")
case("value-None", rel(Laplace(0.1, sensitivity=1.0), None), InvalidTypeError, "value", "None")
case("value-bool", rel(Laplace(0.1, sensitivity=1.0), True), InvalidTypeError, "value", "a bool")
case("value-array-nan", rel(Laplace(0.1, sensitivity=1.0), np.array([1.0, NAN])), InvalidArgumentError, "value")
case("value-list-str", rel(Laplace(0.1, sensitivity=1.0), ["1", "2"]), InvalidTypeError, "value")
case("value-empty", rel(Laplace(0.1, sensitivity=1.0), []), InvalidArgumentError, "value")
case("value-gaussian-nan", rel(AnalyticGaussian(0.1, delta=1e-7, sensitivity=1.0), NAN), InvalidArgumentError, "value")
# bad mechanism objects
case("mechanism-str", rel("Laplace"), InvalidTypeError, "mechanism", "'Laplace'")
case("mechanism-class", rel(Laplace), InvalidTypeError, "mechanism")
case("mechanism-None", lambda acc: acc.release(None, 1.0, dataset="adult"), InvalidTypeError,
     "mechanism", "None")
case("mechanism-budget", lambda acc: acc.release(Budget(0.1), 1.0, dataset="adult"),
     InvalidTypeError, "mechanism")
# bad dataset / analyst / label: described, never shown (often data passed in the wrong place)
case("dataset-unknown", rel(Laplace(0.1, sensitivity=1.0), dataset="survey"), UnknownDatasetError, "dataset",
     "'survey'")
case("dataset-int", rel(Laplace(0.1, sensitivity=1.0), dataset=3), InvalidTypeError, "dataset", "got an int")
case("dataset-None", rel(Laplace(0.1, sensitivity=1.0), dataset=None), InvalidTypeError, "dataset", "None")
case("dataset-empty", rel(Laplace(0.1, sensitivity=1.0), dataset=""), InvalidArgumentError, "dataset", "got a str")
case("dataset-blank", rel(Laplace(0.1, sensitivity=1.0), dataset="   "), InvalidArgumentError, "dataset")
case("dataset-too-long", rel(Laplace(0.1, sensitivity=1.0), dataset="a" * 300), InvalidArgumentError, "dataset")
case("dataset-bytes", rel(Laplace(0.1, sensitivity=1.0), dataset=b"adult"), InvalidTypeError, "dataset", "got a bytes")
case("analyst-int", rel(Laplace(0.1, sensitivity=1.0), analyst=5), InvalidTypeError, "analyst", "got an int")
case("analyst-empty", rel(Laplace(0.1, sensitivity=1.0), analyst=""), InvalidArgumentError, "analyst", "got a str")
case("analyst-list", rel(Laplace(0.1, sensitivity=1.0), analyst=["bob"]), InvalidTypeError, "analyst")
case("label-float", rel(Laplace(0.1, sensitivity=1.0), label=1.5), InvalidTypeError, "label", "got a float")
case("label-empty", rel(Laplace(0.1, sensitivity=1.0), label=""), InvalidArgumentError, "label", "got a str")
case("label-dict", rel(Laplace(0.1, sensitivity=1.0), label={"x": 1}), InvalidTypeError, "label")
# refusals
case("over-epsilon", rel(Laplace(0.95, sensitivity=1.0)), BudgetExceededError)
case("over-delta", rel(AnalyticGaussian(0.1, delta=2e-6, sensitivity=1.0)), BudgetExceededError)
case("over-both", rel(AnalyticGaussian(5.0, delta=0.5, sensitivity=1.0)), BudgetExceededError)
case("per-query-over-budget-other-dataset", rel(Laplace(2.5, sensitivity=1.0), dataset="census"),
     BudgetExceededError)
# can_afford validates too
case("can-afford-bad-mechanism", lambda acc: acc.can_afford("x", dataset="adult"),
     InvalidTypeError, "mechanism")
case("can-afford-unknown-dataset", lambda acc: acc.can_afford(Laplace(0.1, sensitivity=1.0), dataset="nope"),
     UnknownDatasetError, "dataset")
case("can-afford-bad-analyst", lambda acc: acc.can_afford(Laplace(0.1, sensitivity=1.0), dataset="adult",
                                                          analyst=7), InvalidTypeError, "analyst")


@pytest.mark.parametrize(("call", "error", "argument", "shown"), CASES)
def test_bad_input_and_refusals_change_nothing(embedded_ledger: Ledger, rng: np.random.Generator,
                                               call: Call, error: type[BaseException],
                                               argument: str | None, shown: Any) -> None:
    acc = Accountant(limits={"adult": Budget(1.0, 1e-6), "census": Budget(2.0)},
                     ledger=embedded_ledger, rng=rng, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 5.0, dataset="adult", analyst="ann", label="first")
    acc.release(Laplace(0.1, sensitivity=1.0), 5.0, dataset="census")
    receipt = acc.last_receipt
    before = snapshot(acc.ledger, rng)
    spent = (acc.spent("adult"), acc.spent("census"))
    with pytest.raises(error) as info:
        call(acc)
    err = info.value
    assert isinstance(err, PrivacyError)
    if argument is not None:
        assert err.argument == argument
        assert repr(argument) in str(err)
        assert isinstance(err, ValueError if isinstance(err, InvalidArgumentError) else TypeError)
    if shown is not None:
        assert shown in str(err)
    if isinstance(err, BudgetExceededError):
        assert err.dataset in ("adult", "census") and isinstance(err.requested, Budget)
        assert isinstance(err.remaining, Budget)
    assert snapshot(acc.ledger, rng) == before
    assert (acc.spent("adult"), acc.spent("census")) == spent
    assert acc.last_receipt == receipt
    # ... and the accountant still works afterwards.
    acc.release(Laplace(0.1, sensitivity=1.0), 5.0, dataset="adult")
    assert assert_chain(acc.ledger) == 3


@pytest.mark.parametrize(("kwargs", "error", "argument"), [
    ({"limit": 1.0}, InvalidTypeError, "limit"),
    ({"limit": (1.0, 1e-6)}, InvalidTypeError, "limit"),
    ({"limit": Budget(1.0), "per_query": 0.1}, InvalidTypeError, "per_query"),
    ({"limit": Budget(1.0), "composition": "fancy"}, InvalidArgumentError, "composition"),
    ({"limit": Budget(1.0), "composition": None}, InvalidTypeError, "composition"),
    ({"limits": [("adult", Budget(1.0))]}, InvalidTypeError, "limits"),
    ({"limits": {"adult": 1.0}}, InvalidTypeError, "limits['adult']"),
    ({"limits": {"": Budget(1.0)}}, InvalidArgumentError, None),
    ({"limits": {3: Budget(1.0)}}, InvalidTypeError, None),
    ({"limit": Budget(1.0), "rng": "seed"}, InvalidTypeError, "rng"),
    ({"limit": Budget(1.0), "rng": 1.5}, InvalidTypeError, "rng"),
    ({"limit": Budget(1.0), "rng": True}, InvalidTypeError, "rng"),
    ({"limit": Budget(1.0), "rng": np.random.RandomState(0)}, InvalidTypeError, "rng"),
    ({"limit": Budget(1.0), "rng": -1}, InvalidArgumentError, "rng"),
    ({"limit": Budget(1.0), "ledger": 3}, InvalidTypeError, "ledger"),
    ({"limit": Budget(1.0), "ledger": "ftp://host/x"}, InvalidArgumentError, "ledger"),
], ids=["limit-float", "limit-tuple", "per-query-float", "composition-unknown", "composition-None",
        "limits-list", "limits-float-value", "limits-empty-key", "limits-int-key", "rng-str",
        "rng-float", "rng-bool", "rng-legacy-RandomState", "rng-negative-seed", "ledger-int",
        "ledger-bad-scheme"])
def test_constructor_rejects(kwargs: dict[str, Any], error: type, argument: str | None) -> None:
    with pytest.raises(error) as info:
        Accountant(**kwargs)
    assert isinstance(info.value, PrivacyError)
    if argument is not None:
        assert info.value.argument == argument


@pytest.mark.parametrize("kwargs", [
    {"composition": "fancy"}, {"rng": "seed"}, {"per_query": 0.1}, {"rng": -1},
], ids=["composition", "rng-str", "per-query", "rng-negative-seed"])
def test_constructor_errors_touch_no_ledger_file(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    path = tmp_path / "never.db"
    with pytest.raises(PrivacyError):
        Accountant(Budget(1.0), ledger=str(path), **kwargs)
    assert not path.exists()


# -- can_afford, last_receipt ---------------------------------------------------------------------

def test_refusals_change_nothing_on_every_backend(ledger: Ledger,
                                                 rng: np.random.Generator) -> None:
    """The matrix above runs on the embedded ledgers; this runs a refusal, a bad value and an
    unknown dataset on every registered backend."""
    acc = Accountant(limits={"adult": Budget(1.0)}, ledger=ledger, rng=rng, simulation=True)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult")
    before = snapshot(acc.ledger, rng)
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(0.6, sensitivity=1.0), 1.0, dataset="adult")
    with pytest.raises(InvalidArgumentError):
        acc.release(Laplace(0.1, sensitivity=1.0), NAN, dataset="adult")
    with pytest.raises(UnknownDatasetError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="census")
    assert snapshot(acc.ledger, rng) == before


def test_can_afford_debits_and_draws_nothing(ledger: Ledger, rng: np.random.Generator) -> None:
    acc = Accountant(Budget(1.0, 1e-6), ledger=ledger, rng=rng, simulation=True)
    acc.release(Laplace(0.5, sensitivity=1.0), 0.0)
    before = snapshot(acc.ledger, rng)
    assert acc.can_afford(Laplace(0.5, sensitivity=1.0))
    # (A ledger that authenticates its analyst — PostgreSQL, the session's role — takes no other
    # name: tests/ledger/postgres/test_ledger.py.)
    assert acc.can_afford(Laplace(0.5, sensitivity=1.0), analyst=ledger.authenticated_analyst or "bob")
    assert not acc.can_afford(Laplace(0.6, sensitivity=1.0))
    assert not acc.can_afford(AnalyticGaussian(0.1, delta=1e-5, sensitivity=1.0))
    assert acc.can_afford(AnalyticGaussian(0.1, delta=1e-6, sensitivity=1.0))
    for _ in range(5):
        acc.can_afford(Laplace(0.5, sensitivity=1.0))
    assert snapshot(acc.ledger, rng) == before
    assert acc.spent() == Budget(0.5)
    assert acc.can_afford(Laplace(0.5, sensitivity=1.0))  # still affordable: the dry runs spent nothing


def test_last_receipt(ledger: Ledger) -> None:
    acc = Accountant(Budget(1.0, 1e-6), ledger=ledger, rng=SEED, simulation=True)
    assert acc.last_receipt is None
    ann = ledger.authenticated_analyst or "ann"  # (on PostgreSQL, the session's role)
    acc.release(Laplace(0.25, sensitivity=1.0), 3.0, dataset="adult", analyst=ann, label="q1")
    r = acc.last_receipt
    assert isinstance(r, Receipt)
    first = release_entries(acc.ledger)[0]
    assert (r.seq, r.hash) == acc.ledger.head() == (first.seq, first.hash)
    assert (r.dataset, r.analyst, r.label, r.mechanism) == ("adult", ann, "q1", "Laplace")
    assert r.cost == Budget(0.25)
    assert r.spent == Budget(0.25) and r.remaining == Budget(0.75, 1e-6)
    d = r.as_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["seq"] == first.seq and d["spent"] == {"epsilon": 0.25, "delta": 0.0}
    acc.release(AnalyticGaussian(0.25, delta=5e-7, sensitivity=1.0), np.zeros(2), dataset="adult")
    r2 = acc.last_receipt
    assert r2.seq == first.seq + 1 and r2.mechanism == "AnalyticGaussian" and r2.label is None
    assert r2.spent == Budget(0.5, 5e-7)
    # a refusal leaves the last successful receipt in place
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(0.9, sensitivity=1.0), 0.0, dataset="adult")
    assert acc.last_receipt == r2
    # receipts are per thread
    seen: list[Any] = []
    t = threading.Thread(target=lambda: seen.append(acc.last_receipt))
    t.start()
    t.join()
    assert seen == [None]


# -- the true value never reaches the ledger ------------------------------------------------------

def test_true_value_never_in_ledger(tmp_path: Path) -> None:
    secrets = [98765.4321, 31337.0625, 271828.1828]
    path = tmp_path / "ledger.db"
    acc = Accountant(Budget(10.0, 1e-5), ledger=SqliteLedger(path), rng=SEED, simulation=True)
    acc.release(Laplace(0.5, sensitivity=1.0), secrets[0], dataset="adult", analyst="ann", label="income sum")
    acc.release(AnalyticGaussian(0.5, delta=1e-6, sensitivity=1.0), np.array(secrets[1:]), dataset="adult")
    acc.release(Gaussian(0.5, delta=1e-6, sensitivity=1.0), int(secrets[0] * 10000), dataset="adult")
    acc.release(Laplace(0.5, sensitivity=1.0), [secrets[1]] * 3, dataset="adult")
    texts = "\n".join(e.text for e in acc.ledger.entries())
    texts += json.dumps([(a.key, a.config, a.state) for a in acc.ledger.accounts()])
    acc.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    # Forms with a decimal point cannot occur by chance in hex hashes or in timestamps; the one
    # integer secret has 9 digits, which a 64-digit hex hash contains with probability < 1e-9.
    forms = {repr(s) for s in secrets} | {f"{s:.2f}" for s in secrets} | {
        repr(int(secrets[0] * 10000))}
    for form in forms:
        assert form not in texts, form
        assert form.encode() not in raw, form


# -- resume and conflicts -------------------------------------------------------------------------

def test_resume_from_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    first = Accountant(Budget(1.0, 1e-6), ledger=url)
    for _ in range(60):
        first.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult")
    first.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="census")
    spent, head = first.spent("adult"), first.ledger.head()
    first.close()

    # Resuming reads the stored running state; it must not rescan the history.
    def no_rescan(self: Any, start: int = 1) -> Any:
        raise AssertionError("resuming must not rescan the ledger")

    monkeypatch.setattr(SqliteLedger, "entries", no_rescan)
    second = Accountant(Budget(1.0, 1e-6), ledger=url)
    assert second.spent("adult") == spent
    assert second.spent("census") == Budget(0.3)
    for _ in range(40):
        second.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult")
    with pytest.raises(BudgetExceededError):
        second.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult")
    assert second.last_receipt.seq == head[0] + 40
    monkeypatch.undo()
    entries = list(second.ledger.entries())
    assert entries[head[0]].record["prev"] == head[1]  # the chain continues across sessions
    assert assert_chain(second.ledger) == 101
    second.close()


def _ledger_started_under(rule: str) -> MemoryLedger:
    ledger = MemoryLedger()
    with ledger.transaction() as tx:
        config = {"rule": rule, "limit": None}
        tx.append(fields(kind="release", dataset="adult",
                         accounts={"dataset:adult": {**config, "state": {"rho": 0.01}}}),
                  [Account("dataset:adult", rule, config, {"rho": 0.01}, 0)])
    return ledger


def test_rule_conflict_on_listed_dataset_refused_at_construction() -> None:
    ledger = _ledger_started_under("advanced")
    before = snapshot(ledger)
    with pytest.raises(LedgerConflictError) as info:
        Accountant(limits={"adult": Budget(1.0)}, ledger=ledger, rng=SEED, simulation=True)
    assert isinstance(info.value, LedgerError) and isinstance(info.value, PrivacyError)
    assert "advanced" in str(info.value) and "basic" in str(info.value)
    assert snapshot(ledger) == before


def test_rule_conflict_on_default_limit_refused_at_release(rng: np.random.Generator) -> None:
    ledger = _ledger_started_under("advanced")
    acc = Accountant(Budget(1.0), ledger=ledger, rng=rng, simulation=True)
    before = snapshot(ledger, rng)
    with pytest.raises(LedgerConflictError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    with pytest.raises(LedgerConflictError):
        acc.spent("adult")
    with pytest.raises(LedgerConflictError):
        acc.can_afford(Laplace(0.1, sensitivity=1.0), dataset="adult")
    assert snapshot(ledger, rng) == before
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="census")  # other datasets are unaffected


# -- per-query cap --------------------------------------------------------------------------------

def test_per_query_cap(rng: np.random.Generator) -> None:
    acc = Accountant(Budget(1.0, 1e-6), per_query=Budget(0.1, 1e-7), rng=rng)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.release(AnalyticGaussian(0.1, delta=1e-7, sensitivity=1.0), 1.0)
    before = snapshot(acc.ledger, rng)
    for m in (Laplace(0.2, sensitivity=1.0), AnalyticGaussian(0.05, delta=2e-7, sensitivity=1.0)):
        assert not acc.can_afford(m)
        with pytest.raises((BudgetExceededError, MechanismNotAllowedError)) as info:
            acc.release(m, 1.0)
        assert "per-query" in str(info.value)
    assert snapshot(acc.ledger, rng) == before
    for _ in range(8):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)


def test_per_query_cap_is_not_silently_ignored_with_limits() -> None:
    """``per_query`` given together with ``limits`` must be enforced on the listed datasets (or
    the combination refused) — never accepted and then silently ignored."""
    try:
        acc = Accountant(limits={"adult": Budget(1.0)}, per_query=Budget(0.1), rng=SEED)
    except InvalidArgumentError:
        return
    with pytest.raises((BudgetExceededError, MechanismNotAllowedError)):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult")


# -- threads --------------------------------------------------------------------------------------

def test_threads_never_overspend(ledger: Ledger) -> None:
    """8 threads × 50 releases against a limit admitting exactly 100: exactly 100 admitted."""
    acc = Accountant(Budget(1.0), ledger=ledger, rng=SEED, simulation=True)
    m = Laplace(0.01, sensitivity=1.0)
    barrier = threading.Barrier(8)
    admitted, refused, errors = [0] * 8, [0] * 8, []
    # One analyst per thread, where the caller names them; on PostgreSQL, the session's role.
    names = [ledger.authenticated_analyst or f"t{i}" for i in range(8)]

    def work(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(50):
                try:
                    acc.release(m, 1.0, dataset="adult", analyst=names[i])
                    admitted[i] += 1
                except BudgetExceededError:
                    refused[i] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(admitted) == 100 and sum(refused) == 300
    assert assert_chain(acc.ledger) == 100
    assert acc.spent("adult").epsilon <= 1.0 * (1 + 1e-9)
    assert Fraction(acc.spent("adult").epsilon) >= 100 * Fraction(0.01)


