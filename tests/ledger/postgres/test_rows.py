"""The PostgreSQL ledger's rows as values (``accountant.ledger.postgres.rows``): what a debit's
begin reads, parsed into the open transaction without a server. Its time is the server's clock,
never earlier than the last record on any lane it locked (the audit checks each lane's times),
and nothing of the caller's decides it."""

from __future__ import annotations

import pytest

from dpbudget.accountant import LedgerError
from dpbudget.accountant.ledger.entry import Account
from dpbudget.accountant.ledger.lanes import START
from dpbudget.accountant.ledger.postgres.rows import Tx
from dpbudget.accountant.ledger.record import utc_time

LAST = 1_795_255_200_000_000  # the last record's time on the lane, µs
LAST_TEXT = utc_time(LAST).strip('"')  # as the server reads it (``->> 'time'``: no quotes)


def _rows(server: int, lane_time: str | None) -> list[tuple[object, ...]]:
    return [("l", "dataset:a", 7, "h7", lane_time, None),
            ("s", None, 9, str(server), None, None),
            ("a", "dataset:a", 7, "basic", '{"rule":"basic"}', '{"epsilon":0.5,"delta":0.0}')]


def test_the_time_never_runs_backwards_on_a_locked_lane() -> None:
    """A server clock set back below the lane's last record: the transaction takes the lane's
    time (the negative control: the clock alone is earlier); a clock ahead is taken as it is."""
    behind = LAST - 5_000_000
    tx = Tx(["dataset:a", "dataset:b"], ["dataset:a", "dataset:c"], _rows(behind, LAST_TEXT))
    assert tx.server == behind < LAST == tx.micros
    assert tx.seq == 9 and tx.lanes == {"dataset:a": (7, "h7"), "dataset:c": START}
    assert tx.read == {"dataset:b": None, "dataset:a": Account(
        "dataset:a", "basic", {"rule": "basic"}, {"epsilon": 0.5, "delta": 0.0}, 7)}
    ahead = LAST + 1
    assert Tx(["dataset:a"], ["dataset:a"], _rows(ahead, LAST_TEXT)).micros == ahead
    assert Tx(["dataset:a"], ["dataset:a"], _rows(behind, None)).micros == behind  # a new lane


def test_an_unreadable_time_on_a_locked_lane_is_refused() -> None:
    """A last record whose time was edited outside dpbudget: refused, naming the lane and what to
    run, never taken as time zero."""
    with pytest.raises(LedgerError, match="'dataset:a' has an unreadable time.*dpbudget audit"):
        Tx(["dataset:a"], ["dataset:a"], _rows(LAST, "yesterday"))
