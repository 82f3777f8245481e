"""The audit's time checks: a record's ``time`` is the time its debit was computed from.

A debit's renewal windows, blocks and unlock shares are those of its transaction's time, which is
its record's ``time`` (``dpbudget.accountant.ledger.transaction``): the ledger's clock, never the caller's.
So the audit checks, from the records alone (problems of kind ``time``, exit bit 1):

- **Windows**: every windowed account a record charges (``…@<start>+<period>``) is the window that
  contains the record's time. A debit charged to another day's window than its own — a clock
  pushed forward to renew the budget — shows here.
- **Blocks**: every time block a record charges had begun at the record's time and, under an
  unlocking schedule, its replayed spend after the record is within the share unlocked at that
  time (``dpbudget.accountant.gate.step.check_unlocked``, the gate's own check). Divisions and schedules are
  those of the policy in force (the ledger's policy records); without one, blocks are not checked
  here.
- **Order**: record times never run backwards. In one chain (SQLite, in memory: format 1) by
  ``seq``: a transaction's time is never earlier than the head record's. In a ledger of lanes
  (PostgreSQL: format 2) per lane: writers on different lanes take their numbers and read the
  server's clock in either order, so two records on different lanes may have times in the
  other order than their numbers, honestly; but each lane is written under its lock, and a
  transaction's time is never earlier than the last record on any lane it locks
  (``dpbudget.accountant.ledger.postgres.rows.Tx``), so along each lane — in ``seq`` order, which each lane
  follows — times never run backwards. A record is compared with the last one seen on each lane
  (absent records of a log are skipped; each step backwards is reported once).
- **Future**: no record is dated after the audit's own clock (plus ``FUTURE_TOLERANCE``). An
  SQLite ledger's time is the writing process's wall clock: code in that process can patch it
  forward (``time.time_ns``) a day per release to renew a daily budget each time, and the windows
  and order still check out. The clock cannot be taken back from the process, but its records
  then lie in the future, which the audit sees: once per run, with the count.

Invariant: pure functions of the records and the policy in force; memory is one entry per lane.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dpbudget.accountant.composition import CompositionRule, Refused, State
from dpbudget.accountant.values.errors import PrivacyError
from dpbudget.accountant.ledger.record import time_micros
from dpbudget.accountant.gate.step import check_unlocked
from dpbudget.policies.accounts import dataset_name
from dpbudget.policies.periods import Period, split_window

__all__ = ["TimeCheck"]

_CHAIN = ""  # the one lane of a ledger of one chain
# How far after the audit's clock a record may be dated: the writer's and the auditor's clocks
# differ honestly by seconds (NTP keeps them closer), and an audit run right after the last write
# must not flag it; a clock pushed forward to renew windows moves by the window (a day), far more.
FUTURE_TOLERANCE = 3600 * 1_000_000  # microseconds: one hour


class TimeCheck:
    """Checks each record's time as the replay reaches it (``problem(kind, message, seq)``)."""

    def __init__(self, problem: Callable[..., None]) -> None:
        self.problem = problem
        self.last: dict[str, tuple[int, int, str]] = {}  # lane -> (seq, micros, time) last seen
        self.periods: dict[str, Period] = {}
        self.latest = time.time_ns() // 1000 + FUTURE_TOLERANCE  # later is in the future
        self.future: list[Any] = []  # [count, first seq, its time] of records dated later

    def record(self, record: dict[str, Any]) -> int:
        """Check ``record``'s time against its lanes and windows; returns it in microseconds.

        Raises:
            KeyError, ValueError: no readable ``time`` (the audit reports a malformed record).
        """
        seq, text = record["seq"], record["time"]
        micros = time_micros(text)
        if micros > self.latest:
            if self.future:
                self.future[0] += 1
            else:
                self.future = [1, seq, text]
        links = record.get("links")
        for lane in links if isinstance(links, dict) and links else (_CHAIN,):
            last = self.last.get(lane)
            if last is not None and micros < last[1]:
                where = "" if lane == _CHAIN else f" on lane {lane}"
                self.problem("time", f"record {seq}: its time {text} is earlier than record "
                             f"{last[0]}'s ({last[2]}){where}: record times never run backwards",
                             seq)
            self.last[lane] = (seq, micros, text)
        for key in record.get("accounts") or ():
            base, period = split_window(key)
            if period is not None:
                window = self.periods.get(period)
                if window is None:
                    window = self.periods[period] = Period(period)
                own = window.suffix(micros / 1e6)
                if key != base + own:
                    self.problem("time", f"record {seq}: charges {key} at {text}, which is in "
                                 f"the window {own[1:]}", seq)
        return micros

    def finish(self) -> None:
        """Report the records dated after the audit's clock, once (``record`` counted them)."""
        if self.future:
            n, seq, text = self.future
            self.problem("time", f"{n} record(s) are dated more than "
                         f"{FUTURE_TOLERANCE // 3_600_000_000} hour(s) after this audit's clock, "
                         f"the first record {seq} at {text}: a writer's clock ran ahead (on "
                         "SQLite, the writing process's clock)", seq)

    def block(self, seq: int, key: str, micros: int, in_force: Any, rule: CompositionRule,
              state: State) -> None:
        """Check that time block ``key``, charged by record ``seq`` at ``micros`` to ``state``,
        had begun and had unlocked that much under the policy in force (``in_force``)."""
        base, sep, name = key.rpartition("/block:")
        dataset = dataset_name(base) if sep else None
        if in_force is None or dataset is None:
            return
        try:
            spec = in_force.planner.limit(dataset).blocks
            if spec is None or spec.by is None:
                return
            start = spec.start(name)
        except PrivacyError:  # a dataset or block the policy refuses: reported as a limit
            return
        now = micros / 1e6
        if now < start:
            self.problem("time", f"record {seq}: charges {key} before the block begins (a block "
                         "that has not begun has no data)", seq)
        elif spec.unlock is not None:
            try:
                check_unlocked(spec.unlock, start, rule, state, now)
            except Refused as refused:
                self.problem("time", f"record {seq}: {key} spent more than it had unlocked at "
                             f"the record's time: {refused.reason}", seq)
