"""Ledger backends and ``open_ledger``, which picks one from a URL.

``None`` or ``"memory://"`` is an in-memory ledger; ``"sqlite:///path/budget.db"`` (or a plain path)
is the embedded SQLite ledger; ``"postgresql://..."`` is the PostgreSQL ledger (optional extra
``dpbudget[postgres]``). A ``Ledger`` instance is used as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.ledger.base import Account, Entry, Ledger, Transaction
from dpbudget.accountant.ledger.memory import MemoryLedger
from dpbudget.accountant.ledger.record import (
    FORMAT_VERSION,
    GENESIS,
    KEY_ENV,
    canonical,
    export_line,
    record_hash,
)
from dpbudget.accountant.ledger.sqlite import SqliteLedger

__all__ = [
    "FORMAT_VERSION", "GENESIS", "KEY_ENV", "Account", "Entry", "Ledger", "MemoryLedger", "SqliteLedger",
    "Transaction", "canonical", "export_line", "open_ledger", "record_hash",
]


def open_ledger(ledger: "Ledger | str | os.PathLike[str] | None", *,
                create: bool = True) -> Ledger:
    """The ledger that ``ledger`` names.

    ``create=False`` (readers: audit, status, export; the service) refuses a SQLite path, or a
    PostgreSQL database, where there is no ledger yet instead of creating an empty one.

    Raises:
        InvalidArgumentError: an unknown URL scheme.
        InvalidTypeError: neither a ``Ledger``, a string, a path nor ``None``.
        LedgerError: the ledger exists but cannot be opened.
    """
    if ledger is None:
        return MemoryLedger()
    if isinstance(ledger, Ledger):
        return ledger
    if isinstance(ledger, Path):
        return SqliteLedger(ledger, create=create)
    if not isinstance(ledger, str):
        raise InvalidTypeError("ledger", ledger, "a Ledger, a URL string, a path or None")
    if ledger == "memory://":
        return MemoryLedger()
    if ledger.startswith("sqlite:///"):
        return SqliteLedger(ledger[len("sqlite:///"):], create=create)
    if ledger.startswith(("postgresql://", "postgres://")):
        from dpbudget.accountant.ledger.postgres import PostgresLedger  # optional extra, imported on use

        return PostgresLedger(ledger, create=create)
    if "://" in ledger or not ledger.strip():
        raise InvalidArgumentError("ledger", ledger, "'memory://', 'sqlite:///PATH', "
                                   "'postgresql://...' or a file path")
    return SqliteLedger(ledger, create=create)
