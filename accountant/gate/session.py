"""``Session``: a sparse-vector session, whose one fixed cost was debited when it opened.

Invariant: a session exists only after ``Accountant.session`` has debited its mechanism's full
declared cost in one ledger record (kind ``"session"``) and only then opened the mechanism's stream
(which draws the threshold noise). Answering a query never touches the ledger. Closing writes one
more record (kind ``"session-close"``, zero cost, no account change) with how many queries were
answered and how many were ⊤ — counts only, never a true value. An abandoned session that is never
closed keeps its cost; only the close record is missing.

Other releases may interleave with an open session: filters stay valid for such concurrent
interactive steps (Haney et al., CCS 2023, "Concurrent Composition for Interactive Differential
Privacy with Adaptive Privacy-Loss Parameters").
"""

from __future__ import annotations

import os
import threading
from typing import Any

from dpbudget.accountant.values.errors import MechanismExhaustedError, WindowEndedError
from dpbudget.accountant.gate.receipt import Receipt

__all__ = ["NumericSession", "Session"]


class Session:
    """An open ``AboveThreshold`` / ``Sparse`` session; use it as a context manager.

    Created by ``Accountant.session`` (never directly). Safe to share between threads: queries are
    answered one at a time, so the cutoff of ``max_positives`` ⊤ answers holds however many
    threads ask at once. Not between processes: it answers only in the process that opened it,
    since a forked child's copy would count its own ⊤ answers (as many again, against the
    threshold noise the session paid for once).

    >>> from dpbudget.accountant import Accountant, Budget
    >>> from dpbudget.mechanisms import AboveThreshold
    >>> acc = Accountant(Budget(1.0), rng=1)
    >>> svt_mechanism = AboveThreshold(epsilon=0.5, threshold=100.0, sensitivity=1.0)
    >>> with acc.session(svt_mechanism, dataset="adult") as svt:
    ...     first = next(b for b in range(0, 1000, 10) if svt.test(float(b)))
    >>> svt.closed, svt.answered == first // 10 + 1, svt.positives, acc.spent("adult")
    (True, True, 1, Budget(epsilon=0.5, delta=0.0))
    """

    def __init__(self, close: Any, stream: Any, receipt: Receipt, ends: float | None = None,
                 clock: Any = None) -> None:
        self._close = close
        self._stream = stream
        self._receipt = receipt
        # Opened in a renewal window: it answers only until that window ends (policies.periods),
        # by the ledger's time (``Ledger.now``; the gate passes it), never the caller's.
        self._ends, self._clock = ends, clock
        # One query at a time: the stream's cutoff counter and its noise generator are not
        # atomic, and threads racing them could pass the cutoff (more ⊤ answers than paid for).
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def test(self, value: Any) -> bool:
        """⊤ (True) when the query's noisy value reaches the noisy threshold, else ⊥ (False).

        No further debit. A NaN or infinite value raises ``InvalidArgumentError`` and the session
        does not advance.

        Raises:
            MechanismExhaustedError: the session already gave its c ⊤ answers, or is closed, or
                was opened in another process (this is a forked child's copy).
            WindowEndedError: the renewal window the session was opened (and paid) in has ended.
            InvalidArgumentError, InvalidTypeError: the value is not a finite real number.
        """
        self._check_process()  # (before the lock: a thread of the parent may have held it)
        with self._lock:
            self._check_window()
            return bool(self._stream.test(value))

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            raise MechanismExhaustedError(
                "this session was opened, and paid for, in another process: a forked child's "
                "copy answers nothing (its ⊤ answers would come on top of those paid for); "
                "nothing was drawn. Open a session in this process",
                int(self._stream.answered), int(self._stream.positives))

    def _check_window(self) -> None:
        if self._ends is not None and self._clock() >= self._ends:
            raise WindowEndedError(
                "this session was opened in a renewal window that has ended; the window paid "
                "for it, so it answers nothing more (nothing was drawn or debited). Open a new "
                "session, charged to the current window", self._ends)

    @property
    def receipt(self) -> Receipt:
        """The receipt of the debit that opened the session."""
        return self._receipt

    @property
    def answered(self) -> int:
        """How many queries the session has answered."""
        return int(self._stream.answered)

    @property
    def positives(self) -> int:
        """How many of those answers were ⊤."""
        return int(self._stream.positives)

    @property
    def closed(self) -> bool:
        return bool(self._stream.closed)

    def close(self) -> None:
        """Stop answering and record the answer counts in the ledger (idempotent). In a forked
        child it does nothing: the session and its record are the opening process's."""
        if self._pid != os.getpid():
            return
        with self._lock:
            if self._stream.closed:
                return
            self._stream.close()
        self._close(self)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NumericSession(Session):
    """An open ``NumericSparse`` session: ``query`` also releases a noisy value for each ⊤."""

    def query(self, value: Any) -> float | None:
        """None for ⊥; for ⊤, the value plus fresh Laplace noise (never the comparison's noise).

        Raises:
            MechanismExhaustedError, InvalidArgumentError, InvalidTypeError: as :meth:`test`.
        """
        self._check_process()  # (before the lock: a thread of the parent may have held it)
        with self._lock:
            self._check_window()
            answer: float | None = self._stream.query(value)
            return answer
