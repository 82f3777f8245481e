"""A ledger's two kinds of row: an account's running state and a committed record."""

from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

__all__ = ["Account", "Entry", "parse_config"]


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
def parse_config(text: str) -> dict[str, Any]:
    # A rule's configuration text repeats on every read of its account; parse it once. Callers
    # treat Account.config as read-only.
    config: dict[str, Any] = json.loads(text)
    return config
