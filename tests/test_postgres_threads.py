"""Threads sharing one PostgreSQL accountant (accountant.ledger.postgres_sync): a commit made while
other threads wait leaves its flush until the object is released, and nothing is drawn on it
before a flush that began after it has completed. Tried as an attacker would: a debit that reports
success before it is on disk, a flush that claims commits made while it ran, a child process that
flushes through its parent's session, a failed flush that still lets the answer out."""

from __future__ import annotations

import inspect
import os
import multiprocessing
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerError
from dpbudget.accountant.audit import audit
from dpbudget.accountant.ledger import postgres_sync
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.accountant.ledger.postgres_sync import Flusher, PgSync, WaitedLock
from dpbudget.mechanisms import Laplace
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
                acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
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
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
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
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
            if unflushed:
                break
    assert unflushed, "a commit that nothing flushed was already on disk every time"
    acc.close()


class _HeldFlusher:
    """A flushing session whose flush waits for ``go`` (after saying it ``started``)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn, self.started, self.go = conn, threading.Event(), threading.Event()
        self.closed = self.broken = False

    @property
    def pgconn(self) -> Any:
        return self.conn.pgconn

    def execute(self, sql: str) -> Any:
        self.started.set()
        assert self.go.wait(30)
        return self.conn.execute(sql)

    def close(self) -> None:
        self.conn.close()


def _flusher(ledger: PostgresLedger) -> Any:
    """The ledger's flushing connection, if one is open."""
    return None if ledger._fl is None else ledger._fl.conn


def _replace_flusher(ledger: PostgresLedger, flusher: Any, server: str) -> None:
    """Install ``flusher`` as the ledger's flushing session (a new one, on ``server``)."""
    if _flusher(ledger) is not None:
        _flusher(ledger).close()
    ledger._numbered += 1
    reached = "" if flusher is None else str(getattr(flusher, "conn", flusher).execute(
        "SELECT " + postgres_sync._REACHED).fetchone()[0])
    ledger._fl = None if flusher is None else Flusher(flusher, server, os.getpid(),
                                                      ledger._numbered, reached)


def _commit_during_a_flush(ledger: PostgresLedger) -> int:
    """Commit A starts its flush; commit B lands while that flush runs; B's sync must not be
    covered by A's flush. Returns the number of flushes it took."""
    acc = Accountant(Budget(10.0), ledger=ledger, rng=None)
    before = ledger.flushes
    conn, server = ledger._open_session()
    held = _HeldFlusher(conn)
    _replace_flusher(ledger, held, server)
    first = threading.Thread(target=acc.release, args=(Laplace(0.1, sensitivity=1.0), 1.0))
    first.start()
    assert held.started.wait(30)  # A committed and is flushing
    held.started.clear()
    second = threading.Thread(target=acc.release, args=(Laplace(0.1, sensitivity=1.0), 1.0))
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
    """A deliberately broken ``_flush`` that reads the commit count after its flush: it claims
    the commit made during it, which the test above then sees (one flush for two commits)."""
    source = textwrap.dedent(inspect.getsource(PgSync._flush))
    broken = source.replace("target = self._commits", "target = 0").replace(
        "self.flushes += 1", "self.flushes += 1\n        target = self._commits")
    assert broken != source
    scope: dict[str, Any] = dict(vars(postgres_sync))
    exec(compile(broken, "<broken _flush>", "exec"), scope)  # noqa: S102 - a test's mutant
    monkeypatch.setattr(PgSync, "_flush", scope["_flush"])
    assert _commit_during_a_flush(PostgresLedger(dsn)) == 1


def test_a_failed_flush_releases_nothing_and_keeps_the_debit(dsn: str,
                                                             always_contended: None) -> None:
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)

    class Failing(_HeldFlusher):
        def execute(self, sql: str) -> Any:
            raise psycopg.OperationalError("the server went away")

    conn, server = ledger._open_session()
    failing = Failing(conn)
    _replace_flusher(ledger, failing, server)
    answers: list[Any] = []
    with pytest.raises(LedgerError, match="did not confirm that it reached the disk"):
        answers.append(acc.release(Laplace(0.25, sensitivity=1.0), 1.0))
    assert answers == []
    assert acc.spent().epsilon == pytest.approx(0.25)  # the debit stands: no refund
    with pytest.raises(LedgerError, match="the session that was to flush it ended"):
        ledger._sync((ledger._numbered - 1, ledger._commits))  # (a session replaced since)
    _replace_flusher(ledger, None, "")  # its session broke: the next commit flushes alone
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    assert _flusher(ledger) is not None and _flusher(ledger) is not failing  # a new one
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)  # deferred to it
    assert acc.spent().epsilon == pytest.approx(0.75)
    acc.close()


def _child(acc: Accountant, out: Any) -> None:
    try:
        ledger = acc.ledger
        assert isinstance(ledger, PostgresLedger)
        parents = id(_flusher(ledger))  # (kept alive by the child: the id is not reused)
        for _ in range(10):
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
        # (the child's first commit flushes in its round trip, then opens its own session)
        ok = _flusher(ledger) is not None and id(_flusher(ledger)) != parents and ledger.flushes == 9
        out.put("ok" if ok else f"flushes {ledger.flushes}")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_forked_child_flushes_through_its_own_session(dsn: str,
                                                        always_contended: None) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    assert _flusher(ledger) is not None
    before = ledger.flushes
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(acc, out))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert out.get(timeout=5) == "ok"
    for _ in range(5):  # the parent's flushing session was left alone
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
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


@pytest.fixture(scope="module")
def crashable() -> Iterator[str]:
    """A server of its own (crashed and restarted by the tests), whose background writer waits
    10 s between flushes: an asynchronous commit stays off the disk until something flushes."""
    from tests import _postgres

    if _postgres.available() is not None:
        pytest.skip(_postgres.available())
    with _postgres.server("-c wal_writer_delay=10000") as maintenance:
        yield maintenance


@pytest.mark.slow
def test_a_server_restart_between_commit_and_flush_is_never_confirmed(
        crashable: str, always_contended: None) -> None:
    from tests import _postgres

    url = _postgres.fresh_database(crashable)
    ledger = PostgresLedger(url, timeout=5)
    acc = Accountant(Budget(10.0), ledger=ledger, rng=None)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # deferred to the flushing session, and confirmed
    assert ledger.flushes == 1
    sync = ledger._sync

    def crash_first(token: Any) -> None:
        if token is not None:
            _postgres.crash_and_restart(crashable)
        sync(token)

    ledger._sync = crash_first  # type: ignore[method-assign]
    answers: list[Any] = []
    with pytest.raises(LedgerError, match="did not confirm that it reached the disk"):
        answers.append(acc.release(Laplace(0.1, sensitivity=1.0), 1.0))
    assert answers == []
    acc.close()
    again = Accountant.open(url)
    assert again.spent().epsilon in (pytest.approx(0.1), pytest.approx(0.2))  # lost or kept
    assert audit(again.ledger).ok
    again.close()


@pytest.mark.slow
def test_negative_control_a_session_opened_after_the_crash_confirms_a_lost_commit(
        crashable: str, always_contended: None) -> None:
    """Why a flush counts only on a session open before the commit: on a session opened after a
    restart, the flush succeeds while the commit it was to make durable is gone."""
    from tests import _postgres

    url = _postgres.fresh_database(crashable)
    lost = 0
    for _ in range(6):
        ledger = PostgresLedger(url, timeout=5)
        acc = Accountant.open(url) if ledger.entry(1) is not None else Accountant(
            Budget(100.0), ledger=ledger, rng=None)
        if acc.ledger is not ledger:
            ledger.close()
        debited = acc.ledger
        assert isinstance(debited, PostgresLedger)
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # (opens the flushing session)
        seen: list[Any] = []

        def naive(token: Any) -> None:
            _postgres.crash_and_restart(crashable)
            conn, _ = debited._open_session()  # a new session: its flush succeeds
            with conn:
                assert len(conn.execute(postgres_sync.FLUSH).fetchall()) == 1
                seen.append(conn.execute("SELECT max(seq) FROM dpbudget_entries").fetchone())

        debited._sync = naive  # type: ignore[method-assign]
        head = debited.head()[0]
        receipt = acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # "confirmed" by the naive flush
        assert receipt is not None
        lost += seen[0][0] < head + 1  # the debit is not in the restarted server
        try:
            acc.close()
        except LedgerError:
            pass
        if lost:
            break
    assert lost, "the asynchronous commit reached the disk before the crash every time"


def test_a_flushing_session_the_server_ended_is_not_deferred_to(
        dsn: str, postgres_database: str, always_contended: None) -> None:
    """A flushing session ended while idle (idle_session_timeout, an administrator, a restart)
    is noticed before a commit would count on it: that commit flushes in its own round trip."""
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    flusher = _flusher(ledger)
    assert flusher is not None
    with psycopg.connect(postgres_database, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (flusher.info.backend_pid,))
    for _ in range(200):  # until its notice has arrived
        if ledger._defer_to() is None:
            break
        threading.Event().wait(0.01)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # not deferred to the dead session: no error
    assert _flusher(ledger) is not flusher  # replaced after that commit
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # deferred to the new one
    assert acc.spent().epsilon == pytest.approx(0.3)
    acc.close()


def test_a_flush_that_writes_no_row_confirms_nothing(dsn: str, always_contended: None) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)

    class Hidden(_HeldFlusher):  # the flush table hidden by a row-level policy, say
        def execute(self, sql: str) -> Any:
            return self.conn.execute("SELECT 1 WHERE false")

    conn, server = ledger._open_session()
    _replace_flusher(ledger, Hidden(conn), server)
    with pytest.raises(LedgerError, match="the flush wrote no row"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert acc.spent().epsilon == pytest.approx(0.1)
    acc.close()


def test_a_deferred_debit_keeps_the_next_one_to_one_round_trip(
        dsn: str, always_contended: None) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    optimistic = []
    commit = ledger._commit

    def noted() -> Any:
        optimistic.append(ledger.optimistic)
        return commit()

    ledger._commit = noted  # type: ignore[method-assign]
    for _ in range(3):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert optimistic == [True, True, True] and ledger._commits >= 3
    acc.close()


def test_an_unlogged_ledger_table_is_set_logged_again_by_its_owner(dsn: str) -> None:
    """An unlogged table skips the wait for the disk (and loses its rows in a crash): the ledger
    is not current until its owner's next open makes it logged again."""
    from dpbudget.accountant.ledger.postgres_schema import _current

    PostgresLedger(dsn).close()
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("ALTER TABLE dpbudget_flush SET UNLOGGED")
        assert not _current(owner)
        PostgresLedger(dsn).close()
        assert _current(owner)
        row = owner.execute("SELECT relpersistence FROM pg_class WHERE oid = "
                            "to_regclass('dpbudget_flush')").fetchone()
        assert row is not None and row[0] == "p"


def test_a_schema_whose_name_has_quotes_is_created_and_set_logged(
        postgres_database: str) -> None:
    """The DDL names the ledger's schema inside SQL strings too (the sequence's): quoted there."""
    from dpbudget.accountant.ledger.postgres_schema import _current

    with psycopg.connect(postgres_database, autocommit=True) as admin:
        admin.execute('CREATE SCHEMA "we\'ird""x"')
    dsn = f"{postgres_database}?options=-csearch_path%3D%22we%27ird%22%22x%22"
    PostgresLedger(dsn).close()
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("ALTER TABLE dpbudget_entries SET UNLOGGED")
        assert not _current(owner)
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(dsn), rng=None)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.close()
    with psycopg.connect(dsn, autocommit=True) as owner:
        assert _current(owner)
