"""Small helpers shared by test modules (importable as ``tests.support``)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import numpy as np

from accountant.ledger import GENESIS, Ledger

SEED = 20261121


def snapshot(ledger: Ledger, rng: np.random.Generator | None = None) -> tuple[Any, ...]:
    """Everything a request may not change when it is refused: every committed record, every
    account, the head, and the random generator's state."""
    entries = [(e.seq, e.text, e.hash) for e in ledger.entries()]
    accounts = [(a.key, a.rule, copy.deepcopy(a.config), dict(a.state), a.seq)
                for a in ledger.accounts()]
    state = None if rng is None else copy.deepcopy(rng.bit_generator.state)
    return entries, accounts, ledger.head(), state


def assert_chain(ledger: Ledger) -> int:
    """Check the whole hash chain independently of the library; return the number of records."""
    prev, n = GENESIS, 0
    for n, entry in enumerate(ledger.entries(), start=1):
        assert entry.seq == n
        assert entry.hash == hashlib.sha256(entry.text.encode("utf-8")).hexdigest()
        record = json.loads(entry.text)
        assert record["seq"] == n and record["prev"] == prev
        assert json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False) == entry.text
        prev = entry.hash
    assert ledger.head() == ((n, prev) if n else (0, GENESIS))
    return n
