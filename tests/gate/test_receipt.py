"""``Receipt`` (``dpbudget.accountant.gate.receipt``): read-only, and sharing nothing with the gate."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.gate.receipt import Receipt
from dpbudget.mechanisms import Laplace


def test_a_receipt_cannot_reach_the_gates_state_or_rule() -> None:
    acc = Accountant(Budget(1.0), rng=0)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0)
    receipt = acc.last_receipt
    assert receipt is not None and receipt.remaining == Budget(0.0)
    with pytest.raises(AttributeError):
        receipt.cost = Budget(0.0)  # type: ignore[misc]
    assert not hasattr(receipt, "state") and not hasattr(receipt, "rule")
    object.__getattribute__(receipt, "_state")["epsilon"] = 0.0  # even its private copy
    assert acc.remaining() == Budget(0.0) and not acc.can_afford(Laplace(0.1, sensitivity=1.0))


CANARY = 7_351_911.25  # a "true value": must never appear in what a receipt shows


def _made() -> tuple[Accountant, Receipt]:
    acc = Accountant(Budget(1.0), rng=0)
    acc.release(Laplace(0.25, sensitivity=1.0), CANARY, dataset="people", label="count")
    receipt = acc.last_receipt
    assert isinstance(receipt, Receipt)
    return acc, receipt


def test_a_receipt_copies_the_state_it_is_given() -> None:
    """The mapping a receipt is built from stays the caller's: changing it afterwards changes
    neither the receipt's spend nor what it says remains."""
    _, made = _made()
    rule = object.__getattribute__(made, "_rule")
    state = dict(object.__getattribute__(made, "_state"))
    receipt = Receipt(1, "h" * 64, "people", None, None, "Laplace", Budget(0.25), rule, state)
    spent, remaining = receipt.spent, receipt.remaining
    state["epsilon"] = 0.0
    assert (receipt.spent, receipt.remaining) == (spent, remaining) == (Budget(0.25), Budget(0.75))


def test_negative_control_a_receipt_holding_the_callers_mapping_changes_with_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a receipt that kept the mapping itself (the broken behaviour, re-created)
    reports a spend the caller rewrote afterwards, which the test above would catch."""
    _, made = _made()
    rule = object.__getattribute__(made, "_rule")
    state = dict(object.__getattribute__(made, "_state"))
    real = Receipt.__init__

    def aliasing(self: Receipt, *args: Any) -> None:
        real(self, *args)
        object.__setattr__(self, "_state", args[-1])

    monkeypatch.setattr(Receipt, "__init__", aliasing)
    receipt = Receipt(1, "h" * 64, "people", None, None, "Laplace", Budget(0.25), rule, state)
    state["epsilon"] = 0.0
    assert receipt.spent != Budget(0.25)


def test_what_a_receipt_shows_holds_parameters_never_the_value() -> None:
    _, receipt = _made()
    shown = json.dumps(receipt.as_dict()) + repr(receipt) + receipt._repr_html_()
    assert receipt.as_dict()["cost"] == {"epsilon": 0.25, "delta": 0.0}
    assert "people" in shown and str(CANARY) not in shown and "7351911" not in shown


def test_receipts_are_equal_by_their_record() -> None:
    acc, first = _made()
    acc.release(Laplace(0.25, sensitivity=1.0), CANARY, dataset="people")
    second = acc.last_receipt
    assert first == first and second is not None and first != second
    assert len({first, first, second}) == 2
    assert second.seq == first.seq + 1 and second.spent == Budget(0.5)
