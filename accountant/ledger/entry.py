"""A ledger's two kinds of row: an account's running state and a committed record."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

__all__ = ["Account", "Entry"]


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
