"""A ledger's two kinds of row: an account's running state and a committed record."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from dpbudget.accountant.values.errors import LedgerCorruptedError

__all__ = ["Account", "Entry", "account_row", "parse_config"]


class Account(NamedTuple):
    """One limit's running state: ``key`` (e.g. ``"dataset:adult"``), the ``rule`` it is composed
    under, the rule's configuration when last written, the ``state``, and the last record's ``seq``."""

    key: str
    rule: str
    config: dict[str, Any]
    state: dict[str, float]
    seq: int


class Entry(NamedTuple):
    """One committed record: its ``seq``, canonical ``text`` and ``hash``."""

    seq: int
    text: str
    hash: str

    @property
    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(self.text)
        return record


@functools.lru_cache(maxsize=256)
@functools.lru_cache(maxsize=256)
def parse_config(text: str) -> dict[str, Any]:
    # A rule's configuration text repeats on every read of its account; parse it once. Callers
    # treat Account.config as read-only.
    config: dict[str, Any] = json.loads(text)
    return config


_STATE = json.JSONDecoder(parse_int=float)  # (one decoder: json.loads(parse_int=) builds one a call)


def account_row(row: Sequence[Any]) -> Account:
    """An account from its row's columns ``(key, rule, config, state, seq)``, either backend's.
    Each state component is read as a float, the nearest one to the stored decimal: PostgreSQL's
    server writes a row's state from the record as a JSON numeric (``1.7976931348623157e308``
    comes back as its 309 digits), and a number above the largest (damage: the trigger refuses
    one) reads as infinity, which the gate refuses and the audit flags.

    Raises:
        LedgerCorruptedError: the row holds a NULL, a value of another type or unreadable JSON
            (a damaged table); nothing was written.
    """
    key, rule, config, state, seq = row
    try:
        if type(key) is not str or type(rule) is not str or type(seq) is not int:
            raise TypeError("a column of another type")
        return Account(key, rule, parse_config(config),
                       {k: float(v) for k, v in _STATE.decode(state).items()}, seq)
    except (TypeError, ValueError, AttributeError, RecursionError):
        raise LedgerCorruptedError("the accounts table is damaged: a row holds a NULL, a value "
                                   "of another type or unreadable JSON; run `dpbudget audit` on "
                                   "it (nothing was written)") from None
