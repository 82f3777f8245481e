"""Running a caller's function on private data (sample-and-aggregate's function, a PTR
statistic's methods) after the debit, so that nothing it raises tells anything.

Whether such a function raises, and what, may depend on the data: an exception that escaped the
mechanism would be a release without noise (membership guessed from "the release raised").
``call`` therefore returns ``FAILED`` for *anything* the function raises — ``BaseException``
included: ``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``, a subclass of its own — and
the mechanism answers as it does for any failure (a data-independent fallback).

A real Ctrl-C must still be honoured, but not by an exception that could come out of the function.
``interrupts_deferred`` (in the main thread, where Python delivers SIGINT) replaces the SIGINT
handler for the duration of the draw by one that only records the signal; on leaving, it restores
the handler and delivers the recorded signal to it, once the noisy answer has been drawn (that
answer is then lost to the ``KeyboardInterrupt``). So a ``KeyboardInterrupt`` coming out of the
function is always the function's own, and whether a release ends in an interrupt depends on the
signal, never on the data. Other threads receive no SIGINT and need no handler.

Out of reach, as for any code run in the process: a function that ends the process
(``os._exit``), sends signals, writes to files or keeps state between calls. It must be pure.

Invariant: nothing raised inside ``call`` leaves it; a SIGINT during ``interrupts_deferred`` is
delivered when it ends, never dropped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["FAILED", "call", "interrupts_deferred"]

FAILED: Any = object()
"""What ``call`` returns when the function raised (anything)."""


def call(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, or ``FAILED`` if it raised anything at all.

    >>> call(float, "1.5"), call(float, "x") is FAILED
    (1.5, True)
    >>> def stop(rows): raise KeyboardInterrupt
    >>> call(stop, [1]) is FAILED
    True
    """
    try:
        return function(*args)
    except BaseException:  # noqa: BLE001 — raising is itself a release (module docstring)
        return FAILED


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A SIGINT received inside is recorded and delivered to the previous handler on leaving.

    Does nothing outside the main thread, or where the SIGINT handler is not Python's to change
    (ignored, or set by C code).
    """
    previous = _sigint_handler()
    if previous is None:
        yield
        return
    received: list[int] = []

    def record(signum: int, frame: Any) -> None:
        received.append(signum)

    signal.signal(signal.SIGINT, record)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:  # the previous handler runs here (Python checks signals in raise_signal)
            signal.raise_signal(signal.SIGINT)


def _sigint_handler() -> Any:
    """The SIGINT handler in force, where a deferring one may replace it; else None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    return None if handler is None or handler is signal.SIG_IGN else handler
