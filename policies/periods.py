"""Renewal windows (``period = "1d"``): each window of time is an account of its own.

**A weaker guarantee than a lifetime budget.** A windowed limit of (ε, δ) per day bounds what is
released about a dataset *within each day* (sessions and pipelines included: they end with the
window that paid for them). Over n windows the releases compose, so the guarantee
for the whole history is only (n·ε, n·δ) by basic composition (Dwork–Roth 2014, Thm 3.16; under
full adaptivity, Rogers–Roth–Ullman–Vadhan 2016, Thm 3.6): the total privacy loss grows without
bound as time passes. Some production systems renew budgets this way; use it only where that is an
accepted policy decision, and prefer a lifetime limit.

Windows are aligned to the Unix epoch in UTC (a ``"1d"`` window runs from 00:00 to 24:00 UTC; a
``"7d"`` window starts on a Thursday, as 1970-01-01 was). A window's account key is the limit's key
with the suffix ``@<window start>+<period>``, e.g. ``dataset:adult@2026-11-21+1d`` or
``dataset:adult@2026-11-21T13+1h``.

Invariant: the key of the window containing time ``t`` is a pure function of (period, t); the
current window is found in O(1) (one integer division, its key cached until the window changes).
The ``t`` of a debit is its ledger transaction's time, which its record carries (the ledger's
clock, never the caller's), so the audit can recompute every window a record charges.

**Allocations end with their window.** A session or pipeline opened in a window was paid for by
that window; it answers only until the window ends (then ``WindowEndedError``; open a new one,
charged to the new window). So everything released within a window was charged to it: nothing
opened at 23:59:59 goes on releasing on the next day's budget.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["Period", "split_window"]

_SYNTAX = re.compile(r"([1-9][0-9]{0,4})([hd])")
_UNIT_SECONDS = {"h": 3600, "d": 86400}
_UNIT_FORMAT = {"h": "%Y-%m-%dT%H", "d": "%Y-%m-%d"}
_WINDOW_SUFFIX = re.compile(r"@(\d{4}-\d{2}-\d{2}(?:T\d{2})?)\+([1-9][0-9]{0,4}[hd])$")
EXPECTED = 'a renewal window: a whole number of hours or days, such as "1h", "1d", "7d" or "30d"'


class Period:
    """A renewal window length, parsed from text such as ``"1h"``, ``"1d"``, ``"7d"``, ``"30d"``.

    Args:
        text: a whole number from 1 to 99999 followed by ``h`` (hours) or ``d`` (days).

    Raises:
        InvalidArgumentError: anything else (``"1.5d"``, ``"0d"``, ``"1m"``, ``""``).
        InvalidTypeError: not a string.

    >>> p = Period("1d")
    >>> p.seconds
    86400
    >>> p.suffix(1_795_000_000.0)  # 2026-11-18T11:06:40Z
    '@2026-11-18+1d'
    >>> Period("1h").suffix(1_795_000_000.0)
    '@2026-11-18T11+1h'
    """

    __slots__ = ("text", "seconds", "_format", "_cached")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise InvalidTypeError("period", text, "a string such as \"1d\"")
        match = _SYNTAX.fullmatch(text)
        if match is None:
            raise InvalidArgumentError("period", text, EXPECTED)
        self.text = text
        self.seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        self._format = _UNIT_FORMAT[match.group(2)]
        self._cached: tuple[int, str] = (-1, "")  # replaced whole (atomic), never mutated

    def suffix(self, now: float) -> str:
        """The account-key suffix of the window that contains ``now`` (seconds since the epoch)."""
        index = int(now // self.seconds)
        cached = self._cached
        if cached[0] == index:
            return cached[1]
        start = datetime.fromtimestamp(index * self.seconds, timezone.utc)
        text = f"@{start.strftime(self._format)}+{self.text}"
        self._cached = (index, text)
        return text

    def end(self, now: float) -> float:
        """When the window that contains ``now`` ends (seconds since the epoch).

        >>> Period("1d").end(1_795_000_000.0) - 1_795_000_000.0  # 11:06:40 → midnight
        46400.0
        """
        return float((int(now // self.seconds) + 1) * self.seconds)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Period) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Period({self.text!r})"


def split_window(key: str) -> tuple[str, str | None]:
    """``(base key, period text)`` of a windowed account key; ``(key, None)`` for any other.

    >>> split_window("dataset:adult/analyst:alice@2026-11-21+1d")
    ('dataset:adult/analyst:alice', '1d')
    >>> split_window("dataset:adult")
    ('dataset:adult', None)
    """
    match = _WINDOW_SUFFIX.search(key)
    if match is None:
        return key, None
    return key[:match.start()], match.group(2)
