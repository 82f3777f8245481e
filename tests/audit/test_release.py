"""Whether a release record can be what it claims (``dpbudget.accountant.audit.release``): seeded
noise only in a simulation ledger, and a record naming a library mechanism one that mechanism,
rebuilt from the record's parameters, could have written with the record's cost and noise."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.release import LibraryRecords
from dpbudget.mechanisms import Laplace


def _record(**kw: Any) -> dict[str, Any]:
    acc = Accountant(Budget(10.0), **kw)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    return json.loads(list(acc.ledger.entries())[-1].text)


def test_an_honest_release_record_passes() -> None:
    record = _record()
    assert record["mechanism"]["name"] == "Laplace" and record["noise"] == "exact-csprng"
    assert LibraryRecords().check(record, seeded_ok=False) is None


def test_seeded_noise_passes_only_where_the_ledger_says_simulation() -> None:
    record = _record(rng=7)
    assert record["noise"].endswith("-seeded")
    assert LibraryRecords().check(record, seeded_ok=True) is None
    why = LibraryRecords().check(record, seeded_ok=False)
    assert why is not None and "seeded noise" in why


@pytest.mark.parametrize("forge", ["cost", "params", "noise"])
def test_a_record_under_a_library_name_that_the_library_could_not_write_is_named(forge: str) -> None:
    """The attack: a custom class (or a hand-written record) takes ``Laplace``'s name with a cost
    its parameters do not give (a cheaper ε), other parameters, or float noise called exact."""
    record = copy.deepcopy(_record())
    if forge == "cost":
        record["cost"]["epsilon"] = 0.05
    elif forge == "params":
        record["mechanism"]["params"]["epsilon"] = 5.0
    else:
        record["noise"] = "float-csprng"
    why = LibraryRecords().check(record, seeded_ok=False)
    assert why is not None and "Laplace" in why


def test_a_custom_mechanisms_name_is_not_checked_against_the_library() -> None:
    record = copy.deepcopy(_record())
    record["mechanism"]["name"] = "my.module.Halver"
    record["cost"]["epsilon"] = 0.05
    assert LibraryRecords().check(record, seeded_ok=False) is None


def test_a_batch_item_is_held_to_its_own_mechanism() -> None:
    acc = Accountant(Budget(10.0))
    acc.release_many([(Laplace(0.5, sensitivity=1.0), 1.0), (Laplace(0.25, sensitivity=1.0), 2.0)])
    record = json.loads(list(acc.ledger.entries())[-1].text)
    assert LibraryRecords().check(record, seeded_ok=False) is None
    record["mechanism"]["params"]["items"][1]["params"]["epsilon"] = 5.0
    why = LibraryRecords().check(record, seeded_ok=False)
    assert why is not None and why.startswith("its item 1")
