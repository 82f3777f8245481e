"""Small helpers shared by test modules (importable as ``tests.support``)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import numpy as np

from accountant.ledger import GENESIS, Ledger
from accountant.ledger.record import AccountLayout, assemble, canonical, step_fragments

SEED = 20261121


def snapshot(ledger: Ledger, rng: np.random.Generator | None = None) -> tuple[Any, ...]:
    """Everything a request may not change when it is refused: every committed record, every
    account, the head, and the random generator's state."""
    entries = [(e.seq, e.text, e.hash) for e in ledger.entries()]
    accounts = [(a.key, a.rule, copy.deepcopy(a.config), dict(a.state), a.seq)
                for a in ledger.accounts()]
    state = None if rng is None else copy.deepcopy(rng.bit_generator.state)
    return entries, accounts, ledger.head(), state


def charged_accounts(acc: Any, dataset: Any = "default", analyst: str | None = None) -> list[str]:
    """The account keys a release on ``dataset`` by ``analyst`` is charged to, read back from the
    ledger record of a tiny release (it spends ε = 1e-9 of each)."""
    from mechanisms import Laplace

    acc.release(Laplace(1e-9), 0.0, dataset=dataset, analyst=analyst)
    return sorted(json.loads(list(acc.ledger.entries())[-1].text)["accounts"])


def release_fields(mechanism: Any, dataset: str, accounts: list[tuple[Any, Any]]) -> dict[str, str]:
    """A release record's members, as ``Transaction.append`` takes them, for ``(rule, Account)``
    pairs: for tests that forge ledgers (the format is documented in ``ledger/record.py``)."""
    return {"kind": '"release"', "analyst": "null", "label": "null",
            **step_fragments(mechanism.name, mechanism.params(), mechanism.charge),
            "accounts": assemble({a.key: AccountLayout(rule.describe()).text(a.state)
                                  for rule, a in accounts}),
            "dataset": canonical(dataset)}


def assert_chain(ledger: Ledger) -> int:
    """Check the whole hash chain independently of the library; return the number of records
    other than policy records (a durable ledger's first record states its policy)."""
    prev, n, policies = GENESIS, 0, 0
    for n, entry in enumerate(ledger.entries(), start=1):
        assert entry.seq == n
        assert entry.hash == hashlib.sha256(entry.text.encode("utf-8")).hexdigest()
        record = json.loads(entry.text)
        assert record["seq"] == n and record["prev"] == prev
        assert json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False) == entry.text
        prev = entry.hash
        policies += record.get("kind") == "policy"
    assert ledger.head() == ((n, prev) if n else (0, GENESIS))
    return n - policies


def release_entries(ledger: Ledger) -> list[Any]:
    """The ledger's entries other than policy records."""
    return [e for e in ledger.entries() if json.loads(e.text).get("kind") != "policy"]
