"""Which SQLite files a process may use after ``fork()``.

SQLite does not support a connection carried across ``fork`` (https://www.sqlite.org/
howtocorrupt.html, section 2.6), and its locks, and its bookkeeping of them, belong to the whole
process: a child's connection to a file its parent had open — even a new one — takes none of the
locks that keep the parent's close from checkpointing and deleting the WAL file the child writes
(an answer released, its debit lost), or another process from writing at the same time; and a
mutex a thread of the parent held inside SQLite stays held in the child for good.

So every connection the SQLite ledger opens is registered here by its file (device, inode), from
before it is opened until its close has returned. A child forked meanwhile refuses those files,
whoever opens them and however they are named, and keeps the connections it inherited
referenced, so that it never closes or finalises one.
"""

from __future__ import annotations

import os
import sqlite3
import weakref
from pathlib import Path
from typing import Any

from dpbudget.accountant.errors import LedgerError

__all__ = ["Reader", "closed", "forked", "opening", "refusal"]

# token -> file: the connections this process has open (or is opening, or closing).
_OPEN: dict[object, tuple[int, int]] = {}
# What holds each of them (as ``_conn``): weakly, so that a ledger dropped without ``close`` is
# still collected, and its connection closed, as before.
_HOLDERS: "weakref.WeakSet[Any]" = weakref.WeakSet()
# Files open in a process this one was forked from (or one before it): never used here.
_FORKED: set[tuple[int, int]] = set()
# Connections inherited through fork(): referenced for good, never closed here.
_INHERITED: list[Any] = []


def opening(identity: tuple[int, int], holder: Any) -> object:
    """Register a connection about to be opened on the file ``identity``, to be kept as
    ``holder._conn``; its token. Unregistered by ``closed``, or when ``holder`` is collected."""
    token = object()
    _OPEN[token] = identity
    _HOLDERS.add(holder)
    weakref.finalize(holder, closed, token)
    return token


def closed(token: object) -> None:
    """The connection of ``token`` has been closed (or was never opened)."""
    _OPEN.pop(token, None)


def forked(identity: tuple[int, int]) -> bool:
    """Whether ``identity`` was open in a process this one was forked from."""
    return identity in _FORKED


def refusal(path: Path) -> str:
    return (f"SQLite ledger {str(path)!r}: it was open in a process this one was forked from, "
            "and SQLite cannot be used on such a file in a forked child (its locks are kept per "
            "process: https://www.sqlite.org/howtocorrupt.html, section 2.6); nothing was read "
            "or written. Open SQLite ledgers only after forking, or start workers with "
            "multiprocessing's spawn or forkserver method (a PostgreSQL ledger can be shared "
            "with forked children)")


def _after_fork_in_child() -> None:
    _FORKED.update(_OPEN.values())
    for holder in list(_HOLDERS):
        conn = getattr(holder, "_conn", None)
        if conn is not None:
            _INHERITED.append(conn)
    _OPEN.clear()  # (the parent's: closing them is the parent's business)


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to guard against
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Reader:
    """A reading connection of its own (``SqlLedger.entries``): registered while open, and used
    only in the process that opened it (a generator resumed in a forked child is refused)."""

    def __init__(self, path: Path, identity: tuple[int, int]) -> None:
        self._path, self._pid = path, os.getpid()
        try:  # (the file the path names now, which may not be the ledger's any more)
            st = os.stat(path)
            identity = (st.st_dev, st.st_ino)
        except OSError:
            pass
        self._token = opening(identity, self)
        try:
            self._conn = sqlite3.connect(path, isolation_level=None)
        except BaseException:
            closed(self._token)
            raise

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        if self._pid != os.getpid():
            raise LedgerError(refusal(self._path))
        return self._conn.execute(sql, args)

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pid == os.getpid():
            self._conn.close()
            closed(self._token)
