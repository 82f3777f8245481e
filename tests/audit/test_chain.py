"""The audit's chain check (``dpbudget.accountant.audit.chain``), fed a real ledger's records one at
a time: an untouched chain verifies; an edit, a deletion, a reordering or a duplicated line is a
``chain`` problem at the record it touches; a log reads a duplicated line once."""

from __future__ import annotations

from typing import Any

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.chain import ChainCheck
from dpbudget.accountant.audit.sources import Item
from dpbudget.mechanisms import Laplace


def _items(n: int = 5) -> list[Item]:
    acc = Accountant(Budget(10.0), rng=0)
    for i in range(n):
        acc.release(Laplace(0.1, sensitivity=1.0), float(i), label=f"q{i}")
    return [Item(e.seq, e.hash, e.text) for e in acc.ledger.entries()]


def _check(items: list[Item], *, ledger: bool = True) -> tuple[ChainCheck, list[tuple[Any, ...]]]:
    found: list[tuple[Any, ...]] = []
    check = ChainCheck(None, lambda kind, message, seq, position: found.append((kind, seq)),
                       ledger=ledger, complete=False)
    for item in items:
        check.check(item)
    return check, found


def test_an_untouched_chain_verifies_every_record() -> None:
    items = _items()
    check, found = _check(items)
    assert found == [] and check.verified == len(items) == 5
    assert check.head == (5, items[-1].hash) and check.absent == 0


def test_an_edited_record_is_caught_at_its_seq() -> None:
    items = _items()
    edited = items[2]._replace(text=items[2].text.replace('"q2"', '"qX"'))
    assert edited.text != items[2].text
    _, found = _check([*items[:2], edited, *items[3:]])
    assert ("chain", 3) in found and all(seq == 3 for _, seq in found)


@pytest.mark.parametrize("order", [[0, 1, 3, 4], [0, 2, 1, 3, 4]], ids=["deleted", "reordered"])
def test_a_deleted_or_reordered_record_is_caught_in_a_ledger(order: list[int]) -> None:
    items = _items()
    _, found = _check([items[i] for i in order])
    assert found and {kind for kind, _ in found} == {"chain"}


def test_a_duplicated_line_is_a_problem_in_a_ledger_and_read_once_in_a_log() -> None:
    items = _items()
    twice = [*items[:3], items[2], *items[3:]]
    _, found = _check(twice)
    assert found == [("chain", 3)]
    log, found = _check(twice, ledger=False)
    assert found == [] and log.duplicates == 1 and log.verified == 5


def test_a_log_missing_its_own_writers_records_is_caught_by_the_writers_count() -> None:
    """A process's log may skip other writers' records (counted absent), but each record names its
    writer and that writer's count: a gap in one writer's own records is a deletion even in a log."""
    items = _items()
    log, found = _check([items[0], items[1], items[4]], ledger=False)
    assert found == [("chain", 5)] and log.absent == 2 and log.absent_ranges == [(3, 4)]


def test_an_unreadable_line_is_malformed_not_raised() -> None:
    items = _items()
    _, found = _check([items[0], Item(2, None, None, error="not JSON"), *items[2:]])
    assert ("malformed", None) in found


def test_a_record_with_a_made_up_hmac_is_an_auth_problem() -> None:
    """What a writer without the key appends (issue 32): a record whose HMAC is not the key's.
    It is an ``auth`` problem at its seq, not a ``chain`` one (its successors, on PostgreSQL, link
    to its stored hash and verify: tests/ledger/postgres/test_roles.py). The same chain as
    written verifies whole under its key (the check is not vacuous)."""
    from dpbudget.accountant.ledger import MemoryLedger
    from dpbudget.accountant.ledger.record import record_hash

    acc = Accountant(Budget(10.0), ledger=MemoryLedger(hmac_key=b"the key"), rng=0)
    for i in range(5):
        acc.release(Laplace(0.1, sensitivity=1.0), float(i))
    items = [Item(e.seq, e.hash, e.text) for e in acc.ledger.entries()]
    found: list[tuple[Any, ...]] = []
    check = ChainCheck(b"the key", lambda kind, message, seq, position: found.append(
        (kind, seq)), ledger=True, complete=False)
    for item in items:
        check.check(item)
    assert found == [] and check.verified == 5
    faked = items[4]._replace(hash=record_hash(items[4].text or "", b"not the key"))
    items = [*items[:4], faked]
    check = ChainCheck(b"the key", lambda kind, message, seq, position: found.append(
        (kind, seq)), ledger=True, complete=False)
    for item in items:
        check.check(item)
    assert found == [("auth", 5)] and check.verified == 4
