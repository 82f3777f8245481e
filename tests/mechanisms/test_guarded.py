"""A caller's function cannot leak by raising: sample-and-aggregate's function and a PTR
statistic run on private data after the debit, and nothing they raise escapes.

The attack (measured on the code before this change, which caught ``Exception`` only): a function
that raises ``KeyboardInterrupt`` (or ``SystemExit``, ``GeneratorExit``, a ``BaseException`` of
its own) when the target's row is in its chunk makes the release raise after the debit exactly
when the target is in the data: membership guessed with accuracy 1.00 at ε = 0.1. Here the
outcome on the two neighbouring datasets is identical for every seed (accuracy 0.5, chance); the
old ``except Exception``, re-created with monkeypatch, lets the attack through (the negative
control). A real Ctrl-C (SIGINT) during the draw is delivered once the noisy answer is drawn.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms import Laplace, PTRMedian, ProposeTestRelease, SampleAndAggregate, guarded

TARGET = 999.0
BASE = list(np.random.default_rng(5).uniform(0.0, 100.0, size=200))
WITHOUT, WITH = BASE, BASE[:-1] + [TARGET]  # neighbours: one row replaced by the target's


class OwnBaseException(BaseException):
    """A user's subclass of BaseException."""


RAISED = [KeyboardInterrupt, SystemExit, GeneratorExit, OwnBaseException, ValueError]


def _sample_and_aggregate(exc: type[BaseException]) -> SampleAndAggregate:
    def function(rows: Any) -> float:
        if TARGET in list(rows):
            raise exc()
        return 50.0  # the midpoint: what a failing chunk counts as

    return SampleAndAggregate(0.1, function=function, chunks=10, lower=0.0, upper=100.0)


def _ptr(exc: type[BaseException]) -> ProposeTestRelease:
    class Spy(PTRMedian):
        def distance(self, ordered: np.ndarray, bound: float, cap: int) -> int:
            if ordered[-1] >= 100.0:  # the target's row (clamped to the range's top)
                raise exc()
            return 0  # what a raising distance counts as

        def value(self, ordered: np.ndarray) -> float:
            if ordered[-1] >= 100.0:
                raise exc()
            return 50.0

    # A large δ: the test passes often, so the value is computed too.
    return ProposeTestRelease(0.1, delta=0.4, bound=1.0, statistic=Spy(lower=0.0, upper=100.0))


def _outcome(mechanism: Any, data: list[float], seed: int) -> tuple[str, Any]:
    acc = Accountant(Budget(1.0, 0.5), rng=seed)
    try:
        return "answer", repr(acc.release(mechanism, data))
    except BaseException as exc:  # (what an attacker's harness would catch)
        return "raised", type(exc).__name__


def _attack(make: Any, exc: type[BaseException], seeds: range) -> float:
    """The attacker's accuracy guessing "the target is in" iff the release raised, over the
    same seeds on both neighbours; and the outcomes must be identical seed by seed."""
    right = 0
    for seed in seeds:
        out, inn = _outcome(make(exc), WITHOUT, seed), _outcome(make(exc), WITH, seed)
        right += (out[0] != "raised") + (inn[0] == "raised")
    return right / (2 * len(seeds))


@pytest.mark.parametrize("make", [_sample_and_aggregate, _ptr], ids=["sample-aggregate", "ptr"])
@pytest.mark.parametrize("exc", RAISED, ids=lambda e: e.__name__)
def test_the_outcome_is_the_same_on_neighbours_whatever_is_raised(make: Any,
                                                                  exc: type[BaseException]) -> None:
    for seed in range(20):
        assert _outcome(make(exc), WITHOUT, seed) == _outcome(make(exc), WITH, seed)
    assert _attack(make, exc, range(20)) == 0.5  # chance


def _old_call(function: Any, *args: Any) -> Any:
    """The code before this change: ``except Exception`` only."""
    try:
        return function(*args)
    except Exception:
        return guarded.FAILED


@pytest.mark.parametrize("make", [_sample_and_aggregate, _ptr], ids=["sample-aggregate", "ptr"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, OwnBaseException],
                         ids=lambda e: e.__name__)
def test_negative_control_catching_exception_only_leaks_membership(
        make: Any, exc: type[BaseException], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guarded, "call", _old_call)
    assert _attack(make, exc, range(20)) == 1.0


def test_a_real_ctrl_c_is_delivered_after_the_noisy_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT arriving while the function runs: every chunk still runs, the noise is drawn, then
    the interrupt is raised; the handler in force before is back afterwards."""
    calls: list[int] = []

    def function(rows: Any) -> float:
        calls.append(len(rows))
        if len(calls) == 3:
            signal.raise_signal(signal.SIGINT)  # a Ctrl-C, arriving mid-function
        return 50.0

    before = signal.getsignal(signal.SIGINT)
    mechanism = SampleAndAggregate(0.1, function=function, chunks=10, lower=0.0, upper=100.0)
    drawn: list[int] = []
    noise = Laplace.draw
    monkeypatch.setattr(Laplace, "draw",
                        lambda self, value, sampler: drawn.append(1) or noise(self, value, sampler))
    acc = Accountant(Budget(1.0), rng=0)
    with pytest.raises(KeyboardInterrupt):
        acc.release(mechanism, BASE)
    assert len(calls) == 10 and drawn == [1]  # all chunks ran and the noise was drawn first
    assert acc.spent() == Budget(0.1)  # the release was debited: its budget stays spent
    assert signal.getsignal(signal.SIGINT) is before


def test_negative_control_without_deferring_a_ctrl_c_is_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the deferring handler a real Ctrl-C lands inside the function, where it cannot be
    told from the function's own KeyboardInterrupt: swallowed as a failure, never honoured."""
    monkeypatch.setattr(guarded, "interrupts_deferred", contextlib.nullcontext)
    calls: list[int] = []

    def function(rows: Any) -> float:
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGINT)
        return 50.0

    answer = Accountant(Budget(1.0), rng=0).release(
        SampleAndAggregate(0.1, function=function, chunks=10, lower=0.0, upper=100.0), BASE)
    assert isinstance(answer, float)  # no interrupt: it was swallowed


def test_a_function_raising_keyboard_interrupt_itself_is_a_failure_not_an_interrupt() -> None:
    def function(rows: Any) -> float:
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)
    answer = Accountant(Budget(1.0), rng=0).release(
        SampleAndAggregate(1.0, function=function, chunks=5, lower=0.0, upper=100.0), BASE)
    assert 0.0 <= answer <= 100.0
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_nothing_escapes_and_no_handler_is_touched() -> None:
    outcomes: list[tuple[str, Any]] = []
    handlers: list[Any] = []

    def work() -> None:
        for data in (WITHOUT, WITH):
            outcomes.append(_outcome(_sample_and_aggregate(SystemExit), data, 7))
        handlers.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == "answer"
    assert handlers == [before]


def test_a_returned_object_whose_conversion_raises_is_a_failure() -> None:
    class Evil:
        def __float__(self) -> float:
            raise SystemExit

    answer = Accountant(Budget(1.0), rng=0).release(
        SampleAndAggregate(1.0, function=lambda rows: Evil(), chunks=5, lower=0.0, upper=100.0), BASE)
    assert 0.0 <= answer <= 100.0


class _Remembers(PTRMedian):
    """Found by review: ``distance`` remembers whether the target's row is there, and the
    statistic's ``lower``/``upper`` then raise — a member the mechanism read after the debit
    would leak the bit."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.exc, self.seen = exc, False
        super().__init__(lower=0.0, upper=100.0)

    def _member(self, value: float) -> float:
        if self.seen:
            raise self.exc()
        return value

    lower = property(lambda self: self._member(self._lower),
                     lambda self, v: setattr(self, "_lower", v))
    upper = property(lambda self: self._member(self._upper),
                     lambda self, v: setattr(self, "_upper", v))

    def distance(self, ordered: np.ndarray, bound: float, cap: int) -> int:
        self.seen = bool(ordered[-1] >= 100.0)
        return cap  # far from any dataset of high sensitivity: the test passes

    def value(self, ordered: np.ndarray) -> float:
        return 50.0


def _ptr_members(exc: type[BaseException]) -> ProposeTestRelease:
    return ProposeTestRelease(0.1, delta=0.4, bound=1.0, statistic=_Remembers(exc))


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_a_statistics_members_are_read_once_before_the_debit(
        exc: type[BaseException], monkeypatch: pytest.MonkeyPatch) -> None:
    assert _attack(_ptr_members, exc, range(20)) == 0.5  # chance
    # Negative control: the mechanism reading the statistic's range after the debit, as before.
    for member in ("lower", "upper"):
        monkeypatch.setattr(ProposeTestRelease, member, property(
            lambda self, m=member: getattr(self.statistic, m), lambda self, v: None),
            raising=False)
    assert _attack(_ptr_members, exc, range(20)) == 1.0
