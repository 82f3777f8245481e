"""Shared helpers for the policy tests: policy files, an injected clock, untouched-state checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from dpbudget.accountant import Accountant
from dpbudget.accountant.composition import RULES, BasicComposition
from dpbudget.accountant.ledger import MemoryLedger
from tests.support import set_ledger_clock

# 2026-11-21T10:00:00Z, a fixed instant: no test depends on wall time.
T0 = 1_795_255_200.0
DAY = 86_400.0

# The seeded generator each accountant made by ``make`` draws from (to check it was not used).
RNGS: dict[int, np.random.Generator] = {}


class Clock:
    """A settable clock (seconds since the epoch) for renewal windows."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger_clock(monkeypatch, clock) -> Clock:
    """``clock``, read by SQLite ledgers as their wall clock (a durable ledger takes no clock:
    its records' times are the ones a test needs only this way, which is not a public API)."""
    set_ledger_clock(clock, monkeypatch)
    return clock


@pytest.fixture
def make(write, clock, monkeypatch):
    """``make(policy_text, **kw)`` -> an Accountant from that policy, seeded, with the clock
    (passed for an in-memory ledger; read by a durable one as its wall clock)."""

    def _make(text: str, **kw) -> Accountant:
        kw.setdefault("rng", np.random.default_rng(7))
        ledger = kw.get("ledger")
        if ledger is None or ledger == "memory://" or isinstance(ledger, MemoryLedger):
            kw.setdefault("clock", clock)
        else:
            set_ledger_clock(clock, monkeypatch)
        acc = Accountant.from_policy(write(text), **kw)
        RNGS[id(acc)] = kw["rng"]
        return acc
    return _make


class Untouched:
    """Context manager: the ledger's records and accounts and the RNG's state are unchanged."""

    def __init__(self, acc: Accountant) -> None:
        self.acc = acc

    def __enter__(self) -> "Untouched":
        self.entries = list(self.acc.ledger.entries())
        self.accounts = self.acc.ledger.accounts()
        self.rng = copy.deepcopy(RNGS[id(self.acc)].bit_generator.state)
        return self

    def __exit__(self, *exc: object) -> None:
        assert list(self.acc.ledger.entries()) == self.entries
        assert self.acc.ledger.accounts() == self.accounts
        assert RNGS[id(self.acc)].bit_generator.state == self.rng


@pytest.fixture
def untouched():
    return Untouched


class OtherRule(BasicComposition):
    """Basic composition under another name: to change a ledger's rule in conflict tests."""

    name = "other"


@pytest.fixture
def other_rule(monkeypatch):
    monkeypatch.setitem(RULES, "other", OtherRule)
    return "other"
