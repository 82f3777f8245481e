"""The PostgreSQL ledger's time (``PostgresLedger``'s part): the server's clock, never the client's.

A transaction's time (``Transaction.time``, every record's ``time``) is read by the statement its
begin already sends (no round trip of its own): the server's ``clock_timestamp()`` once the
transaction's locks are held, and never earlier than the last record on any lane it locked, so the
records of each lane have times that never run backwards (writers on other lanes commit in any
order: the audit checks times per lane). A debit whose accounts depend on the time (windows,
blocks) always reads it so; an optimistic debit (which sends nothing before its commit, and
depends on no time) carries the last reading on with the local monotonic clock.

Invariant: nothing of the caller's — its wall clock, a clock it passes — decides a window here.
"""

from __future__ import annotations

import time
from typing import Any

from dpbudget.accountant.errors import LedgerError
from dpbudget.accountant.ledger.record import time_micros

__all__ = ["PgTime", "lane_time"]


class PgTime:
    """The time of a ``PostgresLedger``'s transactions."""

    _tx_time: int
    _anchor: tuple[int, int] | None

    def _init_time(self) -> None:
        self._tx_time = 0  # the transaction's time, in microseconds (``_tx_micros``)
        # (server clock, local monotonic clock), in microseconds, when the last begin read the
        # server's: the server's time now, estimated without a round trip (``now``).
        self._anchor = None

    def _read_time(self, server: Any, floor: int) -> None:
        """A begin read the server's clock (``server``) and its lanes' last times (``floor``)."""
        micros = int(server)
        self._anchor = (micros, time.monotonic_ns() // 1000)
        self._tx_time = max(micros, floor)

    def _carry_time(self, floor: int) -> None:
        """An optimistic begin, which reads nothing: the last reading carried on, never earlier
        than ``floor`` (the record this object last committed on the lanes it locks)."""
        self._tx_time = max(floor, self._estimate())

    def now(self) -> float:
        """The server's time, estimated from the last begin that read it (without a round
        trip); this process's wall clock before any has."""
        return self._estimate() / 1e6 if self._anchor is not None else time.time()

    def _estimate(self) -> int:
        anchor = self._anchor
        if anchor is None:
            return time.time_ns() // 1000
        return anchor[0] + time.monotonic_ns() // 1000 - anchor[1]

    def _tx_micros(self, head: tuple[int, str] | None) -> int:
        """The transaction's time as its begin read it (module docstring)."""
        return self._tx_time


def lane_time(key: str, text: str | None) -> int:
    """A lane's last record's time, in microseconds (0: a lane without a record).

    Raises:
        LedgerError: the time is unreadable (a record edited outside dpbudget).
    """
    if text is None:
        return 0
    try:
        return time_micros(text)
    except ValueError:
        raise LedgerError(f"PostgreSQL ledger: the last record on lane {key!r} has an unreadable "
                          "time (edited outside dpbudget); nothing was written. Run `dpbudget "
                          "audit` on it") from None
