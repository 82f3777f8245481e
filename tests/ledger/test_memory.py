"""The in-memory ledger (``accountant.ledger.memory``): the same records and chain as the durable
ones, changes staged inside a transaction and applied only on commit, and one ledger per object."""

from __future__ import annotations

from dpbudget.accountant.ledger.entry import Account
from dpbudget.accountant.ledger.memory import MemoryLedger
from dpbudget.accountant.ledger.transaction import Transaction
from tests.contracts import LedgerContract, debit_fields


def _staged(ledger: MemoryLedger) -> Transaction:
    """Begin a transaction on ``ledger`` and append one debit to it, without committing."""
    tx = ledger.transaction().begin()
    accounts = [Account("dataset:a", "basic", {"rule": "basic"}, {"epsilon": 0.5, "delta": 0.0}, 0)]
    tx.append(debit_fields(accounts, kind="release", dataset="dataset:a"), accounts)
    return tx


def test_changes_are_staged_until_the_commit_and_gone_on_abandon() -> None:
    """Inside the transaction the staged record and state are visible to it alone; an abandoned
    transaction leaves nothing, and a committed one lands whole (the control: the same append
    committed is seen)."""
    ledger = MemoryLedger()
    tx = _staged(ledger)
    assert tx.account("dataset:a") is not None  # the transaction reads its own write
    tx.abandon()
    assert list(ledger.entries()) == [] and ledger.accounts() == [] and ledger.head()[0] == 0
    tx = _staged(ledger)
    tx.commit()
    assert [e.seq for e in ledger.entries()] == [1]
    assert ledger.account("dataset:a").state == {"epsilon": 0.5, "delta": 0.0}


def test_each_object_is_a_ledger_of_its_own() -> None:
    """Two in-memory ledgers share nothing, neither records nor the writer that counts them."""
    a, b = MemoryLedger(), MemoryLedger()
    LedgerContract._append(a, 2)
    assert list(b.entries()) == [] and b.account("dataset:a") is None
    LedgerContract._append(b, 1)
    assert a.entry(1).record["writer"] != b.entry(1).record["writer"]
