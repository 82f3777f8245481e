"""The PostgreSQL ledger's debits are on disk before anything is drawn on them: each COMMIT runs
with ``synchronous_commit = on`` (whatever the role or database says), so it returns only once the
server's write-ahead log holds it; threads sharing one accountant, and a forked child, still spend
exactly the limit. Tried as an attacker would: the log's flush position read at the moment the
debit returns, a server crashed right after a run of releases; each with its negative control (the
session's commits made asynchronous, as the ledger did before: seen off the disk, and lost)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.accountant.ledger.postgres.schema import _current
from dpbudget.accountant.ledger.postgres.session import Session
from dpbudget.mechanisms import Laplace
from tests.conftest import _fresh_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn(postgres_database: str) -> str:
    return _fresh_schema(postgres_database)


@pytest.fixture
def asynchronous(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant: every session's commits asynchronous (the role's or database's
    setting, or the ledger's before this one), i.e. the COMMIT returns before the disk write."""
    connect = Session.connect

    def connect_async(self: Session) -> None:
        connect(self)
        self.conn.execute("SET synchronous_commit = off")

    monkeypatch.setattr(Session, "connect", connect_async)


def _lsn(conn: psycopg.Connection[Any], what: str) -> int:
    row = conn.execute(f"SELECT pg_current_wal_{what}_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _unflushed_commits(ledger: PostgresLedger, acc: Accountant, probe: Any, n: int) -> int:
    """How many of ``n`` debits returned from their commit before the log was on disk up to
    what had been written when it returned."""
    commit, unflushed = ledger._commit, 0

    def checked() -> None:
        nonlocal unflushed
        commit()
        unflushed += _lsn(probe, "flush") < _lsn(probe, "insert")

    ledger._commit = checked  # type: ignore[method-assign]
    for _ in range(n):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
        if unflushed:
            break
    return unflushed


def test_each_commit_is_on_disk_before_release_returns(dsn: str, postgres_database: str) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    assert isinstance(acc.ledger, PostgresLedger)
    with psycopg.connect(postgres_database, autocommit=True) as probe:
        assert _unflushed_commits(acc.ledger, acc, probe, 20) == 0
    acc.close()


def test_negative_control_an_asynchronous_commit_is_seen_off_the_disk(
        dsn: str, postgres_database: str, asynchronous: None) -> None:
    """The check above can fail: asynchronous, a commit is (at least once, before the server's
    background writer gets to it) not yet on disk when it returns."""
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    assert isinstance(acc.ledger, PostgresLedger)
    with psycopg.connect(postgres_database, autocommit=True) as probe:
        assert _unflushed_commits(acc.ledger, acc, probe, 20) > 0
    acc.close()


@pytest.fixture(scope="module")
def crashable() -> Iterator[str]:
    """A server of its own (crashed and restarted by the tests), whose background writer waits
    10 s between flushes: an asynchronous commit stays off the disk until something flushes."""
    from tests import _postgres

    if _postgres.available() is not None:
        pytest.skip(_postgres.available())
    with _postgres.server("-c wal_writer_delay=10000") as maintenance:
        yield maintenance


def _answers_lost_in_a_crash(server: str, tries: int) -> int:
    """Releases answered, then the server crashed at once: how many answers' debits are gone
    after the restart (at the first try that lost any)."""
    from tests import _postgres

    for _ in range(tries):
        url = _postgres.fresh_database(server)
        acc = Accountant(Budget(100.0), ledger=PostgresLedger(url, timeout=5), rng=None)
        answers = [acc.release(Laplace(0.1, sensitivity=1.0), 1.0) for _ in range(5)]
        _postgres.crash_and_restart(server)
        try:
            acc.close()
        except psycopg.Error:
            pass
        again = Accountant.open(url)
        kept = again.spent().epsilon
        assert audit(again.ledger).ok
        again.close()
        lost = len(answers) - round(kept / 0.1)
        if lost:
            return lost
    return 0


@pytest.mark.slow
def test_no_answer_outlives_its_debit_in_a_server_crash(crashable: str) -> None:
    assert _answers_lost_in_a_crash(crashable, 3) == 0


@pytest.mark.slow
def test_negative_control_asynchronous_commits_are_lost_in_a_crash(
        crashable: str, asynchronous: None) -> None:
    assert _answers_lost_in_a_crash(crashable, 6) > 0


def test_threads_sharing_one_accountant_spend_exactly_the_limit(dsn: str) -> None:
    acc = Accountant(Budget(0.5), ledger=PostgresLedger(dsn), rng=None)
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
    report = audit(acc.ledger)
    assert report.ok, [p.message for p in report.problems]
    acc.close()


def _child(acc: Accountant, out: Any) -> None:
    try:
        ledger = acc.ledger
        assert isinstance(ledger, PostgresLedger)
        parents = ledger._s.conn
        for _ in range(10):
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
        out.put("ok" if ledger._s.conn is not parents else "the parent's session")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_forked_child_debits_through_its_own_session(dsn: str) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    parents = ledger._s.conn
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(acc, out))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert out.get(timeout=5) == "ok"
    for _ in range(5):  # the parent's session was left alone
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    assert ledger._s.conn is parents
    assert acc.spent().epsilon == pytest.approx(0.16)
    assert audit(ledger).ok
    acc.close()


def test_an_unlogged_ledger_table_is_set_logged_again_by_its_owner(dsn: str) -> None:
    """An unlogged table loses its rows in a crash (and a commit that wrote only such tables
    does not wait for the disk): the ledger is not current until its owner's next open makes it
    logged again."""
    PostgresLedger(dsn).close()
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("ALTER TABLE dpbudget_accounts SET UNLOGGED")
        assert not _current(owner)
        PostgresLedger(dsn).close()
        assert _current(owner)
        row = owner.execute("SELECT relpersistence FROM pg_class WHERE oid = "
                            "to_regclass('dpbudget_accounts')").fetchone()
        assert row is not None and row[0] == "p"


def test_a_schema_whose_name_has_quotes_is_created_and_set_logged(
        postgres_database: str) -> None:
    """The DDL names the ledger's schema inside SQL strings too (the sequence's): quoted there."""
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
