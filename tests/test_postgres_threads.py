"""Threads sharing one PostgreSQL accountant (accountant.ledger.postgres_sync): a commit made while
other threads wait leaves its flush until the object is released, and nothing is drawn on it
before a flush that began after it has completed. Tried as an attacker would: a debit that reports
success before it is on disk, a flush that claims commits made while it ran, a child process that
flushes through its parent's session, a failed flush that still lets the answer out."""

from __future__ import annotations

import inspect
import multiprocessing
import textwrap
import threading
from typing import Any

import psycopg
import pytest

from accountant import Accountant, Budget, BudgetExceededError, LedgerError
from accountant.audit import audit
from accountant.ledger import postgres_sync
from accountant.ledger.postgres import PostgresLedger
from accountant.ledger.postgres_sync import PgSync, WaitedLock
from mechanisms import Laplace
from tests.conftest import _fresh_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn(postgres_database: str) -> str:
    return _fresh_schema(postgres_database)


@pytest.fixture
def always_contended(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every commit defers its flush, as when other threads wait for the ledger."""
    monkeypatch.setattr(WaitedLock, "contended", property(lambda self: True))


def _lsn(conn: psycopg.Connection[Any], what: str) -> int:
    row = conn.execute(f"SELECT pg_current_wal_{what}_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def test_threads_sharing_one_accountant_spend_exactly_the_limit(dsn: str) -> None:
    acc = Accountant(Budget(0.5), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    admitted: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        for _ in range(15):
            try:
                acc.release(Laplace(0.01), 1.0)
                admitted.append(1)
            except BudgetExceededError:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert not errors, errors
    assert len(admitted) == 50  # 120 attempts of 0.01 against 0.5
    assert ledger._commits > 0 and ledger.flushes > 0  # the deferred path ran
    report = audit(ledger)
    assert report.ok, [p.message for p in report.problems]
    acc.close()


def test_a_deferred_commit_is_on_disk_before_release_returns(
        dsn: str, postgres_database: str, always_contended: None) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    seen: list[tuple[int, int]] = []
    sync = ledger._sync
    with psycopg.connect(postgres_database, autocommit=True) as probe:
        def checked(token: Any) -> None:
            committed = _lsn(probe, "insert")  # the debit's commit record is before this
            sync(token)
            seen.append((committed, _lsn(probe, "flush")))

        ledger._sync = checked  # type: ignore[method-assign]
        before = ledger.flushes, ledger._commits  # (the policy record's commit)
        for _ in range(5):
            acc.release(Laplace(0.1), 1.0)
    assert (ledger.flushes - before[0], ledger._commits - before[1]) == (5, 5)
    assert all(flushed >= committed for committed, flushed in seen), seen
    acc.close()


def test_negative_control_a_sync_that_skips_the_flush_is_seen_unflushed(
        dsn: str, postgres_database: str, always_contended: None) -> None:
    """The check above can fail: without the flush, the commit is (at least once, before the
    server's background writer gets to it) not yet on disk when ``release`` would return."""
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    unflushed = 0
    with psycopg.connect(postgres_database, autocommit=True) as probe:
        def skipped(token: Any) -> None:
            nonlocal unflushed
            unflushed += _lsn(probe, "flush") < _lsn(probe, "insert")

        ledger._sync = skipped  # type: ignore[method-assign]
        for _ in range(20):
            acc.release(Laplace(0.1), 1.0)
            if unflushed:
                break
    assert unflushed, "a commit that nothing flushed was already on disk every time"
    acc.close()


class _HeldFlusher:
    """A flushing session whose flush waits for ``go`` (after saying it ``started``)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn, self.started, self.go = conn, threading.Event(), threading.Event()
        self.closed = self.broken = False

    def execute(self, sql: str) -> Any:
        self.started.set()
        assert self.go.wait(30)
        return self.conn.execute(sql)

    def close(self) -> None:
        self.conn.close()


def _replace_flusher(ledger: PostgresLedger, flusher: Any) -> None:
    if ledger._flusher is not None:
        ledger._flusher.close()
    ledger._flusher = flusher


def _commit_during_a_flush(ledger: PostgresLedger) -> int:
    """Commit A starts its flush; commit B lands while that flush runs; B's sync must not be
    covered by A's flush. Returns the number of flushes it took."""
    acc = Accountant(Budget(10.0), ledger=ledger, rng=None)
    before = ledger.flushes
    held = _HeldFlusher(ledger._open_session())
    _replace_flusher(ledger, held)
    first = threading.Thread(target=acc.release, args=(Laplace(0.1), 1.0))
    first.start()
    assert held.started.wait(30)  # A committed and is flushing
    held.started.clear()
    second = threading.Thread(target=acc.release, args=(Laplace(0.1), 1.0))
    original = ledger._commit
    committed = threading.Event()

    def commit() -> Any:
        token = original()
        committed.set()
        return token

    ledger._commit = commit  # type: ignore[method-assign]
    second.start()
    assert committed.wait(30)  # B committed while A's flush is still running
    held.go.set()
    first.join(30)
    second.join(30)
    assert acc.spent().epsilon == pytest.approx(0.2)
    acc.close()
    return ledger.flushes - before


def test_a_commit_made_during_a_flush_is_not_covered_by_it(dsn: str,
                                                           always_contended: None) -> None:
    assert _commit_during_a_flush(PostgresLedger(dsn)) == 2


def test_negative_control_a_flush_that_counts_commits_after_it_began(
        dsn: str, always_contended: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately broken ``_sync`` that reads the commit count after its flush: it claims
    the commit made during it, which the test above then sees (one flush for two commits)."""
    source = textwrap.dedent(inspect.getsource(PgSync._sync))
    broken = source.replace("target = self._commits", "target = 0").replace(
        "self.flushes += 1", "self.flushes += 1\n        target = self._commits")
    assert broken != source
    scope: dict[str, Any] = dict(vars(postgres_sync))
    exec(compile(broken, "<broken _sync>", "exec"), scope)  # noqa: S102 - a test's mutant
    monkeypatch.setattr(PgSync, "_sync", scope["_sync"])
    assert _commit_during_a_flush(PostgresLedger(dsn)) == 1


def test_a_failed_flush_releases_nothing_and_keeps_the_debit(dsn: str,
                                                             always_contended: None) -> None:
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)

    class Failing(_HeldFlusher):
        def execute(self, sql: str) -> Any:
            raise psycopg.OperationalError("the server went away")

    failing = Failing(ledger._open_session())
    _replace_flusher(ledger, failing)
    answers: list[Any] = []
    with pytest.raises(LedgerError, match="did not confirm that it reached the disk"):
        answers.append(acc.release(Laplace(0.25), 1.0))
    assert answers == []
    assert acc.spent().epsilon == pytest.approx(0.25)  # the debit stands: no refund
    ledger._flusher = None  # the next flush opens a session of its own again
    failing.close()
    acc.release(Laplace(0.25), 1.0)
    assert acc.spent().epsilon == pytest.approx(0.5)
    acc.close()


def _child(acc: Accountant, out: Any) -> None:
    try:
        ledger = acc.ledger
        assert isinstance(ledger, PostgresLedger)
        parents = id(ledger._flusher)  # (kept alive by the child: the id is not reused)
        for _ in range(10):
            acc.release(Laplace(0.01), 1.0)
        ok = ledger._flusher is not None and id(ledger._flusher) != parents and ledger.flushes == 10
        out.put("ok" if ok else f"flushes {ledger.flushes}")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_forked_child_flushes_through_its_own_session(dsn: str,
                                                        always_contended: None) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    acc.release(Laplace(0.01), 1.0)
    assert ledger._flusher is not None
    before = ledger.flushes
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(acc, out))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert out.get(timeout=5) == "ok"
    for _ in range(5):  # the parent's flushing session was left alone
        acc.release(Laplace(0.01), 1.0)
    assert ledger.flushes == before + 5
    assert acc.spent().epsilon == pytest.approx(0.16)
    assert audit(ledger).ok
    acc.close()


def test_waited_lock_counts_only_waiting_threads() -> None:
    lock = WaitedLock()
    assert lock.acquire() and not lock.contended
    assert lock.acquire()  # re-entrant
    waiting = threading.Thread(target=lambda: (lock.acquire(), lock.release()))
    waiting.start()
    for _ in range(1000):
        if lock.contended:
            break
        threading.Event().wait(0.005)
    assert lock.contended
    lock.release()
    lock.release()
    waiting.join(10)
    assert not lock.contended and not lock._is_owned()
