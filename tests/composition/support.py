"""Helpers shared by the composition rules' tests: a limit, a batch of one step, a snapshot."""

from __future__ import annotations

from dpbudget.accountant import Budget


LIMIT = Budget(1.0, 1e-6)


def snapshot(acc, rng):
    return list(acc.ledger.entries()), rng.bit_generator.state


def batch(m, k, value=1.0):
    return [(m, value)] * k
