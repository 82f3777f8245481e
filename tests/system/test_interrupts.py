"""Interrupts (Ctrl-C) landing anywhere in a debit leave the ledger usable and never overspent.

A notebook or a service catches ``KeyboardInterrupt`` and goes on using the same accountant; an
interrupt that lands right after BEGIN used to leave the transaction open, wedging the ledger for
this process ("cannot start a transaction within a transaction") and holding SQLite's write lock
against every other process. Here a tracer raises ``KeyboardInterrupt`` at every line the gate and
the ledger execute during a release, one position per run, and after each interrupted release:

* the same accountant releases again at once;
* another connection to the same file can write at once (no write lock left held);
* what the ledger stores agrees with its records (the audit replays clean) and the limit holds.

A second test sends real SIGINTs at random moments to a process that catches them and keeps
releasing, while another process releases on the same ledger.
"""

from __future__ import annotations

import linecache
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger import SqliteLedger
from dpbudget.mechanisms import Laplace

ROOT = Path(__file__).resolve().parents[2]
_TRACED = ("accountant/gate/gate.py", "accountant/ledger/")


class _InterruptAt:
    """A tracer that raises KeyboardInterrupt at the ``n``-th line executed in the traced files."""

    def __init__(self, n: int) -> None:
        self.n, self.count, self.fired = n, 0, False

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if not any(t in path for t in _TRACED):
            return None
        return self._local

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and not self.fired:
            self.count += 1
            if self.count == self.n:
                self.fired = True
                self.where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
                raise KeyboardInterrupt
        return self._local


def _lines_in_one_release(acc: Accountant) -> int:
    """Lines the traced files run in one steady-state release (after a first, which also
    creates the account)."""
    acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
    counter = _InterruptAt(-1)
    sys.settrace(counter)
    try:
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
    finally:
        sys.settrace(None)
    return counter.count


LAST: list[str] = [""]


def _release_interrupted_at(acc: Accountant, n: int) -> bool:
    tracer = _InterruptAt(n)
    LAST[0] = ""
    sys.settrace(tracer)
    try:
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
        LAST[0] = getattr(tracer, "where", "")
    return tracer.fired


def _assert_consistent(acc: Accountant, limit: float) -> None:
    report = audit(acc.ledger)
    assert report.ok, [p.message for p in report.problems]
    assert acc.spent("d").epsilon <= limit * (1 + 1e-9)


@pytest.mark.slow
def test_an_interrupt_at_any_line_of_a_sqlite_debit_leaves_the_ledger_usable(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    acc = Accountant(Budget(1000.0), ledger=SqliteLedger(path, timeout=30.0))
    positions = _lines_in_one_release(acc)
    assert positions > 20  # the tracer sees the whole debit path
    other = SqliteLedger(path, timeout=0.5)  # another writer, short patience: a held lock fails
    other_acc = Accountant(Budget(1000.0), ledger=other)
    interrupted = 0
    for n in range(1, positions + 1):
        interrupted += _release_interrupted_at(acc, n)
        # Another thread on the same accountant gets the ledger's lock at once (a lock left held
        # by the interrupted thread would block it, though that thread could go on re-entering).
        worker = threading.Thread(target=acc.release, args=(Laplace(0.01, sensitivity=1.0), 1.0),
                                  kwargs={"dataset": "d"})
        worker.start()
        worker.join(5.0)
        assert not worker.is_alive(), f"the ledger's lock was left held after line {n}"
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")  # the same accountant goes on at once
        other_acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")  # and so does another writer
    # Every position but the few that only some releases run (a new second's timestamp) fired.
    assert interrupted >= positions - 3
    _assert_consistent(acc, 1000.0)
    other.close()
    acc.close()


@pytest.mark.slow
def test_an_interrupt_at_any_line_of_a_memory_debit_never_hides_spend() -> None:
    acc = Accountant(Budget(1000.0))
    positions = _lines_in_one_release(acc)
    for n in range(1, positions + 1):
        _release_interrupted_at(acc, n)
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
    # The in-memory ledger commits in two steps (accounts, then records): an interrupt between
    # them may over-state the spend, never under-state it.
    recorded = sum(e.record["cost"]["epsilon"] for e in acc.ledger.entries())
    assert acc.spent("d").epsilon >= recorded - 1e-9


@pytest.mark.postgres
def test_an_interrupt_at_any_line_of_a_postgres_debit_leaves_the_ledger_usable(
        postgres_database: str) -> None:
    """After each interrupted debit no session of the ledger's database sits "idle in
    transaction" (which would hold the ledger's advisory lock against every other writer)."""
    import psycopg

    from tests.conftest import _fresh_schema

    postgres_url = _fresh_schema(postgres_database)
    acc = Accountant(Budget(1000.0), ledger=postgres_url)
    other_acc = Accountant(Budget(1000.0), ledger=postgres_url)
    positions = _lines_in_one_release(acc)
    with psycopg.connect(postgres_database, autocommit=True) as watcher:
        for n in range(1, positions + 1):
            _release_interrupted_at(acc, n)
            stuck = watcher.execute("SELECT pid, state, query FROM pg_stat_activity WHERE state "
                                    "LIKE 'idle in transaction%'").fetchall()
            assert stuck == [], f"a transaction was left open by an interrupt at {LAST[0]}"
            other_acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
    _assert_consistent(acc, 1000.0)
    acc.close()
    other_acc.close()


_CHILD = textwrap.dedent("""
    import signal, sys
    from dpbudget.accountant import Accountant, Budget, BudgetExceededError
    from dpbudget.mechanisms import Laplace
    acc = Accountant(Budget(float(sys.argv[2])), ledger="sqlite:///" + sys.argv[1])
    # Ctrl-C raises KeyboardInterrupt only while a release is under way (armed), as the default
    # handler would there; the handler disarms itself so the except clause itself is never hit.
    state = {"armed": False, "raised": 0}

    def on_sigint(signum, frame):
        if state["armed"]:
            state["armed"] = False
            state["raised"] += 1
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    print("ready", flush=True)
    while True:
        try:
            state["armed"] = True
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
            state["armed"] = False
        except KeyboardInterrupt:
            pass
        except BudgetExceededError:
            state["armed"] = False
            break
    print(state["raised"], flush=True)
    sys.stdin.read()  # exit only when told: a SIGINT during interpreter shutdown would kill us
""")



@pytest.mark.slow
def test_real_sigints_at_random_moments(tmp_path: Path) -> None:
    """A process that catches Ctrl-C and goes on releasing, interrupted 200 times at random
    moments, while this process releases on the same ledger: both finish, nothing overspends."""
    path = tmp_path / "b.db"
    limit = 30.0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(limit)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(child.stdout.readline()), daemon=True)
    reader.start()
    mine = Accountant(Budget(limit), ledger=SqliteLedger(path, timeout=5.0))
    pace = random.Random(20261122)
    sent = 0
    try:
        while not result and child.poll() is None and sent < 200:
            time.sleep(pace.uniform(0.0, 0.004))
            child.send_signal(signal.SIGINT)
            sent += 1
            try:
                mine.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")  # never waits out the timeout
            except BudgetExceededError:
                pass
        reader.join(timeout=120)
        _, err = child.communicate(input="", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, f"the child died instead of catching its interrupts: {err}"
    assert result and int(result[0].strip()) > 0  # interrupts really landed inside releases
    _assert_consistent(mine, limit)
    mine.close()


@pytest.mark.slow
def test_an_interrupt_at_any_line_never_loses_a_record_from_the_process_log(
        tmp_path: Path) -> None:
    """A record committed but kept from the log by an interrupt is logged by the writer's next
    transaction: the process's log audits clean alone and holds every record it committed."""
    import json
    import logging

    from dpbudget.accountant.audit.logs import LOGGER_NAME, log_records_to

    path = tmp_path / "b.db"
    acc = Accountant(Budget(1000.0), ledger=SqliteLedger(path, timeout=30.0))
    positions = _lines_in_one_release(acc)
    log = tmp_path / "log.jsonl"
    handler = log_records_to(log)
    try:
        first = acc.ledger.head()[0] + 1
        for n in range(1, positions + 1):
            _release_interrupted_at(acc, n)
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
    finally:
        handler.close()
        logging.getLogger(LOGGER_NAME).removeHandler(handler)
    report = audit(str(log))
    assert report.ok, [p.message for p in report.problems]
    logged = {json.loads(line)["record"]["seq"] for line in log.read_text().splitlines()}
    assert logged == set(range(first, acc.ledger.head()[0] + 1))
    acc.close()


class _SecondInterrupt:
    """A trace function raising KeyboardInterrupt at the ``k``-th line of the clean-up's work: a
    line of the backend's ``_rollback``, or ``abandon``'s call of it or release of the lock (a
    second Ctrl-C landing in the clean-up of the first; before its ``try`` no code can catch it)."""

    def __init__(self, k: int) -> None:
        self.k, self.count, self.fired = k, 0, False

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        return self._line if frame.f_code.co_name in ("abandon", "_rollback") else None

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and not self.fired and (
                (frame.f_code.co_name == "_rollback" and frame.f_back.f_code.co_name == "abandon")
                or any(call in linecache.getline(frame.f_code.co_filename, frame.f_lineno)
                       for call in ("_rollback()", "release()"))):
            self.count += 1
            if self.count == self.k:
                self.fired = True
                raise KeyboardInterrupt("the second Ctrl-C")
        return self._line


@pytest.mark.parametrize("k", range(1, 6))
def test_a_second_interrupt_in_the_clean_up_frees_the_lock(tmp_path: Path, k: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C inside ``abandon`` (review of the smaller transaction): between the
    rollback and the release of the lock it left the ledger's lock (and SQLite's write lock)
    held, so another thread waited until this one debited again. Now the clean-up finishes
    first: another thread and another writer release at once."""
    from dpbudget.accountant.ledger.transaction import Transaction

    path = tmp_path / "l.db"
    acc = Accountant(Budget(1000.0), ledger=SqliteLedger(path, timeout=30.0))
    acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")

    def first_interrupt(self: Any, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("the first Ctrl-C")

    monkeypatch.setattr(Transaction, "append", first_interrupt)
    tracer = _SecondInterrupt(k)
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")
    finally:
        sys.settrace(None)
    assert tracer.fired, f"the clean-up runs fewer than {k} lines"
    monkeypatch.undo()
    worker = threading.Thread(target=acc.release, args=(Laplace(0.01, sensitivity=1.0), 1.0),
                              kwargs={"dataset": "d"})
    worker.start()
    worker.join(10.0)
    assert not worker.is_alive(), f"the lock stayed held (second interrupt at line {k})"
    other = Accountant(Budget(1000.0), ledger=SqliteLedger(path, timeout=2.0))
    other.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d")  # SQLite's lock is free too
    other.close()
    assert acc.spent("d").epsilon == pytest.approx(0.03)
    acc.close()
