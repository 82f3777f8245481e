"""``group_by``: one debit of ε for the whole table whatever the number of groups (parallel
composition), the sensitivities stated (checked by brute force on neighbours, with asymmetric
bounds, and attained), the noise law (KS, α = 1e-6, power check), undeclared keys dropped without
an error, means all or nothing, and bad input typed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, InvalidArgumentError
from dpbudget.accountant.values.errors import InvalidDataError
from dpbudget.accountant.values.errors import InvalidTypeError
from dpbudget.mechanisms import Neighbouring, group_by
from dpbudget.mechanisms.group_by import _group_index
from tests.mechanisms.stat_checks import ks_with_power, laplace_cdf

GROUPS = ["a", "b", "c", "d"]
KEYS = ["a"] * 40 + ["b"] * 25 + ["c"] * 5 + ["x"] * 7  # "x" is not declared
VALUES = list(np.linspace(-5.0, 15.0, len(KEYS)))


def _true(statistic: str, keys: list[str], values: list[float], lo: float = 0.0,
          hi: float = 10.0) -> np.ndarray:
    idx = _group_index(keys, GROUPS)
    kept = idx >= 0
    v = np.clip(np.asarray(values), lo, hi)
    counts = np.bincount(idx[kept], minlength=4).astype(float)
    if statistic == "count":
        return counts
    if statistic == "centred":  # the sums a mean releases: around the midpoint
        v = v - (lo + hi) / 2
    return np.bincount(idx[kept], weights=v[kept], minlength=4)


@pytest.mark.parametrize("lo, hi", [(0.0, 10.0), (-15.0, 10.0), (2.0, 10.0)])
@pytest.mark.parametrize("relation, statistic", [
    (Neighbouring.ADD_REMOVE, "count"), (Neighbouring.REPLACE, "count"),
    (Neighbouring.ADD_REMOVE, "sum"), (Neighbouring.REPLACE, "sum"),
    (Neighbouring.ADD_REMOVE, "centred"), (Neighbouring.REPLACE, "centred"),
])
def test_stated_sensitivity_holds_on_every_neighbour(relation: Neighbouring, statistic: str,
                                                     lo: float, hi: float) -> None:
    reach = max(abs(lo), abs(hi))
    delta = {("count", True): 1.0, ("count", False): 2.0,
             ("sum", True): reach, ("sum", False): max(hi - lo, 2 * reach),
             ("centred", True): (hi - lo) / 2, ("centred", False): hi - lo}[
        (statistic, relation is Neighbouring.ADD_REMOVE)]
    # The data holds both bounds, so that the worst case over all datasets is attained here.
    data_keys, data_values = KEYS + ["a", "b"], VALUES + [lo, hi]
    base = _true(statistic, data_keys, data_values, lo, hi)
    worst = 0.0
    for i in range(len(data_keys)):
        ks, vs = data_keys, data_values
        if relation is Neighbouring.ADD_REMOVE:
            neighbours = [(ks[:i] + ks[i + 1:], vs[:i] + vs[i + 1:])]
            neighbours += [(ks + [g], vs + [v]) for g in GROUPS for v in (lo, hi)]
        else:
            neighbours = [(ks[:i] + [g] + ks[i + 1:], vs[:i] + [v] + vs[i + 1:])
                          for g in GROUPS + ["x"] for v in (-100.0, lo, 0.0, hi, 100.0)]
        for keys, values in neighbours:
            worst = max(worst, float(np.abs(_true(statistic, keys, values, lo, hi)
                                            - base).sum()))
    assert worst <= delta + 1e-9
    assert worst == pytest.approx(delta)  # and it is attained: not an over-statement


def test_one_debit_for_the_whole_table() -> None:
    acc = Accountant(Budget(1.0), rng=0)
    many = [f"g{i}" for i in range(500)]
    out = group_by(acc, [f"g{i % 500}" for i in range(5000)], many, epsilon=1.0)
    assert len(out) == 500
    records = [e.record for e in acc.ledger.entries() if e.record["kind"] == "release"]
    assert len(records) == 1 and records[0]["cost"]["epsilon"] == 1.0
    assert acc.spent() == Budget(1.0)


def test_count_noise_is_laplace_one_over_epsilon() -> None:
    acc = Accountant(None, rng=np.random.default_rng(41))
    noise = np.array([group_by(acc, KEYS, GROUPS, epsilon=0.5)["d"] for _ in range(3000)])
    ks_with_power(noise, laplace_cdf, 1.0 / 0.5)  # group d is empty: the release is pure noise


def test_undeclared_keys_are_dropped_silently() -> None:
    acc = Accountant(None, rng=1)
    out = group_by(acc, KEYS, GROUPS, epsilon=1e3)  # almost no noise
    assert [round(out[g]) for g in GROUPS] == [40, 25, 5, 0]
    assert "x" not in out


def test_means_are_one_batch_all_or_nothing() -> None:
    acc = Accountant(Budget(1.0), rng=2)
    acc.release(__import__("dpbudget.mechanisms").mechanisms.Laplace(0.6, sensitivity=1.0), 1.0)
    with pytest.raises(BudgetExceededError):
        group_by(acc, KEYS, GROUPS, values=VALUES, statistic="mean", lower=0, upper=10,
                 epsilon=0.5)
    assert acc.spent() == Budget(0.6)
    out = group_by(Accountant(None, rng=3), KEYS, GROUPS, values=VALUES, statistic="mean",
                   lower=0, upper=10, epsilon=1e4)
    truth = _true("sum", KEYS, VALUES) / np.maximum(_true("count", KEYS, VALUES), 1)
    assert all(abs(out[g] - truth[i]) < 0.05 for i, g in enumerate(GROUPS[:3]))


def test_pandas_columns() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"state": KEYS, "income": VALUES})
    out = group_by(Accountant(None, rng=4), frame["state"], GROUPS, values=frame["income"],
                   statistic="sum", lower=0, upper=10, epsilon=1e3)
    assert abs(out["a"] - _true("sum", KEYS, VALUES)[0]) < 0.1


@pytest.mark.parametrize("kwargs, error, argument", [
    ({"groups": []}, InvalidArgumentError, "groups"),
    ({"groups": {"a", "b"}}, InvalidTypeError, "groups"),
    ({"groups": ["a", "a"]}, InvalidArgumentError, "groups[1]"),
    ({"statistic": "median"}, InvalidArgumentError, "statistic"),
    ({"statistic": "sum"}, InvalidArgumentError, "lower"),
    ({"statistic": "sum", "lower": 0, "upper": 1}, InvalidArgumentError, "values"),
    ({"statistic": "sum", "lower": 0, "upper": 1, "values": [1.0]}, InvalidArgumentError,
     "values"),
    ({"statistic": "sum", "lower": 0, "upper": 1, "values": [math.nan] * len(KEYS)},
     InvalidDataError, "values"),
    ({"epsilon": 0.0}, InvalidArgumentError, "epsilon"),
    ({"keys": 5}, InvalidTypeError, "keys"),
])
def test_bad_input_is_typed_and_debits_nothing(kwargs: dict[str, Any], error: type,
                                               argument: str) -> None:
    acc = Accountant(Budget(1.0), rng=5)
    params: dict[str, Any] = {"keys": KEYS, "groups": GROUPS, "epsilon": 0.5, **kwargs}
    with pytest.raises(error) as caught:
        group_by(acc, params.pop("keys"), params.pop("groups"), **params)
    assert caught.value.argument == argument
    assert acc.spent() == Budget(0.0)


# -- undeclared rows are never read ------------------------------------------------------------
# The attack (measured before this change): every value was validated before undeclared groups
# were dropped, so a NaN in an undeclared group refused the release and named its row — an
# un-noised signal that such a row exists. Now nothing of such a row is read: a NaN, a wrong type
# or a huge value there gives the same answer, for the same seed, as a clean value.

UNDECLARED_BAD = [math.nan, "x", 10**400, None, [1.0, 2.0], complex(1, 1), math.inf]


@pytest.mark.parametrize("bad", UNDECLARED_BAD, ids=repr)
@pytest.mark.parametrize("statistic", ["sum", "mean"])
def test_a_bad_value_in_an_undeclared_group_changes_nothing(bad: Any, statistic: str) -> None:
    row = KEYS.index("x")  # a row of the undeclared group "x"

    def run(values: list[Any]) -> Any:
        acc = Accountant(Budget(1.0), rng=11)
        return group_by(acc, KEYS, GROUPS, values=values, statistic=statistic, lower=0,
                        upper=10, epsilon=1.0), acc.spent()

    dirty = list(VALUES)
    dirty[row] = bad
    assert run(dirty) == run(VALUES)
    # As a numpy column too (one dtype for all rows: only a NaN or inf can hide in it).
    if isinstance(bad, float):
        assert run(np.array(dirty)) == run(np.array(VALUES))  # type: ignore[arg-type]


def test_an_unhashable_key_is_an_undeclared_group() -> None:
    keys: list[Any] = list(KEYS)
    keys[KEYS.index("x")] = ["not", "hashable"]
    same = [group_by(Accountant(Budget(1.0), rng=3), k, GROUPS, epsilon=1.0)
            for k in (keys, KEYS)]
    assert same[0] == same[1]


def test_a_nan_in_a_declared_group_is_still_refused_naming_its_own_row() -> None:
    values = list(VALUES)
    values[3] = math.nan  # row 3 is in group "a"
    values[KEYS.index("x")] = "junk"  # and an undeclared row before it is not read
    acc = Accountant(Budget(1.0), rng=3)
    with pytest.raises(InvalidDataError, match=r"values\[3\] is nan"):
        group_by(acc, KEYS, GROUPS, values=values, statistic="sum", lower=0, upper=10,
                 epsilon=1.0)
    assert acc.spent() == Budget(0.0)


def test_negative_control_validating_before_dropping_names_the_undeclared_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    module = importlib.import_module("dpbudget.mechanisms.group_by")  # (the package's name is the function)
    monkeypatch.setattr(module, "_declared_values", lambda values, kept: values)  # the old order
    values = list(VALUES)
    row = KEYS.index("x")
    values[row] = math.nan
    with pytest.raises(InvalidDataError, match=rf"values\[{row}\] is nan"):
        group_by(Accountant(Budget(1.0), rng=3), KEYS, GROUPS, values=values, statistic="sum",
                 lower=0, upper=10, epsilon=1.0)
