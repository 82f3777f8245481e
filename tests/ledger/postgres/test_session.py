"""The PostgreSQL ledger's session (``accountant.ledger.postgres.session``): durable commits, a
session lost or killed replaced, a bound on every wait, a forked child's own session, and values
sent as bound parameters.

Group commit keeps "on disk before the draw": the PostgreSQL ledger releases its locks before
the disk write (so that other writers go on meanwhile), and every release still waits until its own
commit is durable before any noise is drawn.

PostgreSQL commits asynchronously and then waits for the log to reach the disk through a
synchronous write. Each check has a negative control: with the sync switched off, the same test
sees the missing syncs. (SQLite syncs inside each commit itself, ``synchronous=FULL``:
tests/ledger/test_sqlite.py.)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.accountant.ledger.postgres.schema import _current
from dpbudget.accountant.ledger.postgres.session import Session
from dpbudget.mechanisms import Laplace
from tests.conftest import _fresh_schema

RELEASES = 40


class _Watched:
    """The accountant's sampler, noting in ``events`` each time noise is drawn."""

    def __init__(self, sampler: Any, events: list[str]) -> None:
        self._sampler, self._events = sampler, events

    def __getattr__(self, name: str) -> Any:
        if name not in ("source", "is_cryptographic"):  # (read to describe the noise)
            self._events.append("draw")
        return getattr(self._sampler, name)


# -- PostgreSQL ------------------------------------------------------------------------------


def _wal_syncs(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")  # (the statistics are flushed at the end of a statement)
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.postgres
@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "negative-control"])
def test_postgres_waits_for_the_disk_before_each_draw(postgres_database: str, synchronous: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each release forces a write-ahead-log sync (``pg_stat_wal.wal_sync``): its session commits
    with ``synchronous_commit = on``. The control sets it off for the session (as a role's or
    database's setting would, which the ledger overrides): the syncs are left to the WAL writer."""
    dsn = _fresh_schema(postgres_database)
    if not synchronous:
        connect = Session.connect

        def asynchronous(self: Session) -> None:
            connect(self)
            self.conn.execute("SET synchronous_commit = off")

        monkeypatch.setattr(Session, "connect", asynchronous)
    acc = Accountant(Budget(10.0), ledger=dsn, rng=0, simulation=True)
    before = _wal_syncs(postgres_database)
    for _ in range(RELEASES):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.close()  # (a session reports its statistics when it ends)
    time.sleep(0.2)
    synced = _wal_syncs(postgres_database) - before
    if synchronous:
        assert synced >= RELEASES
    else:
        assert synced < RELEASES // 2


@pytest.mark.postgres
def test_postgres_a_failed_commit_is_not_reported_as_committed(postgres_database: str) -> None:
    """A COMMIT that fails (a deferred constraint trigger) on a live session committed nothing:
    a plain LedgerError, never one that says the debit may stand."""
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$")
        conn.execute("CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON dpbudget_entries "
                     "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()")
        with pytest.raises(LedgerError, match="refused at commit") as caught:
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
        assert "committed" not in str(caught.value)
        conn.execute("DROP TRIGGER refuse ON dpbudget_entries")
    assert acc.spent().epsilon == 0.0
    acc.close()


# -- the connection fails: a session killed by the server is replaced on the next call (never a
# release without its debit), a writer holding the lock too long ends in a typed error, and a
# process forked with an open ledger never uses its parent's session

@pytest.fixture
def dsn(postgres_database: str) -> str:
    return _fresh_schema(postgres_database)


def _kill_sessions(database: str) -> int:
    with psycopg.connect(database, autocommit=True) as conn:
        return len(conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
            "pg_backend_pid() AND datname = current_database()").fetchall())


@contextlib.contextmanager
def sessions_killed_before_each_write(ledger: Any, database: str) -> Iterator[None]:
    """Every record ``ledger`` writes meanwhile is written after the server ended its sessions
    (what a restart does to clients, in the middle of a debit's transaction)."""
    original = ledger._write_entry

    def dying(entry: Any) -> None:
        _kill_sessions(database)
        time.sleep(0.05)
        original(entry)

    ledger._write_entry = dying
    try:
        yield
    finally:
        ledger._write_entry = original


@pytest.mark.postgres
def test_a_killed_session_is_replaced_on_the_next_call(dsn: str, postgres_database: str) -> None:
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    for _ in range(3):
        assert _kill_sessions(postgres_database) >= 1  # what a server restart does to clients
        time.sleep(0.05)
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # no error: BEGIN found the session dead, nothing ran
    assert acc.spent().epsilon == pytest.approx(0.4)
    report = audit(acc.ledger)
    assert report.ok and report.records == 5  # record 1 states the ledger's policy
    acc.close()


@pytest.mark.postgres
def test_a_session_killed_mid_debit_loses_nothing(dsn: str, postgres_database: str) -> None:
    """A session that dies inside the transaction fails that release with a typed error and
    nothing drawn; the next release reconnects, and every answer has its debit."""
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    ledger = acc.ledger
    assert isinstance(ledger, PostgresLedger)
    with sessions_killed_before_each_write(ledger, postgres_database), \
            pytest.raises(LedgerError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert audit(acc.ledger).ok
    assert acc.spent().epsilon == pytest.approx(0.2)
    acc.close()


@pytest.mark.postgres
def test_a_held_lock_ends_in_a_typed_error_not_a_hang(dsn: str) -> None:
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(dsn, timeout=0.5), rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with psycopg.connect(dsn) as holder:  # a transaction holding every lane's lock
        holder.execute("SELECT key FROM dpbudget_lanes FOR UPDATE")
        start = time.monotonic()
        with pytest.raises(LedgerError, match="lock timeout"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
        assert time.monotonic() - start < 10
        holder.rollback()
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # and goes on once the lock is free
    assert acc.spent().epsilon == pytest.approx(0.2)
    acc.close()


def _child_release(acc: Accountant, n: int, out: Any) -> None:
    """Refused the parent's accountant; then ``n`` releases through one of its own."""
    try:
        try:
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
            out.put("released on the parent's ledger")
            return
        except LedgerError:
            pass
        with Accountant.open(acc.ledger.url) as own:
            for _ in range(n):
                own.release(Laplace(0.01, sensitivity=1.0), 1.0)
        out.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.postgres
def test_forked_children_open_their_own_and_spend_in_the_same_limits(dsn: str) -> None:
    acc = Accountant(Budget(10.0), ledger=dsn, rng=None)
    acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [ctx.Process(target=_child_release, args=(acc, 50, out)) for _ in range(4)]
    for c in children:
        c.start()
    for _ in range(50):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)  # the parent keeps using its own session meanwhile
    for c in children:
        c.join(60)
        assert c.exitcode == 0
    assert sorted(out.get(timeout=5) for _ in children) == ["ok"] * 4
    assert acc.spent().epsilon == pytest.approx(0.01 * 251, rel=1e-6)
    report = audit(acc.ledger)
    assert report.ok, [p.message for p in report.problems]
    acc.close()


@pytest.mark.postgres
@pytest.mark.postgres
def test_a_plan_made_stale_by_ddl_fails_one_debit_and_the_next_prepares_anew(
        postgres_database: str) -> None:
    """A column's type changed under a prepared read ("cached plan must not change result
    type"): the object refused every later debit until reopened, since only the statements of the
    failed round trip were forgotten (review of the one-package ledger). Now that debit fails,
    debiting nothing, and the next one prepares everything anew."""
    dsn = _fresh_schema(postgres_database)
    ledger = PostgresLedger(dsn)
    acc = Accountant(Budget(10.0), ledger=ledger, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="d")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE dpbudget_lanes ALTER COLUMN hash TYPE varchar(64)")
    outcomes = []
    for _ in range(3):
        try:
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="d")
            outcomes.append("answered")
        except LedgerError:
            outcomes.append("refused")
    assert outcomes[1:] == ["answered", "answered"]
    assert acc.spent("d").epsilon == pytest.approx(0.1 * (1 + outcomes.count("answered")))
    acc.close()


# -- each COMMIT with synchronous_commit = on (whatever the role or database says): on disk before
# it returns; threads and a forked child still spend exactly the limit; each attack with its
# negative control (commits made asynchronous: seen off the disk, and lost)

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


@pytest.mark.postgres
def test_each_commit_is_on_disk_before_release_returns(dsn: str, postgres_database: str) -> None:
    acc = Accountant(Budget(10.0), ledger=PostgresLedger(dsn), rng=None)
    assert isinstance(acc.ledger, PostgresLedger)
    with psycopg.connect(postgres_database, autocommit=True) as probe:
        assert _unflushed_commits(acc.ledger, acc, probe, 20) == 0
    acc.close()


@pytest.mark.postgres
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
        with PostgresLedger(url) as again:  # (a crash may take the policy record too)
            kinds = [e.record["kind"] for e in again.entries()]
            assert not kinds or audit(again).ok
        lost = len(answers) - kinds.count("release")
        if lost:
            return lost
    return 0


@pytest.mark.postgres
@pytest.mark.slow
def test_no_answer_outlives_its_debit_in_a_server_crash(crashable: str) -> None:
    assert _answers_lost_in_a_crash(crashable, 3) == 0


@pytest.mark.postgres
@pytest.mark.slow
def test_negative_control_asynchronous_commits_are_lost_in_a_crash(
        crashable: str, asynchronous: None) -> None:
    assert _answers_lost_in_a_crash(crashable, 6) > 0


@pytest.mark.postgres
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
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
        out.put("released on the parent's ledger")
    except LedgerError as exc:
        out.put("refused" if "belongs to the process" in str(exc) else str(exc))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.postgres
def test_a_forked_child_is_refused_its_parents_ledger(dsn: str) -> None:
    """One process rule: a child using its parent's PostgreSQL ledger is refused, typed, before
    anything is read or sent; nothing is debited, and the parent's session goes on untouched."""
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
    assert out.get(timeout=5) == "refused"
    for _ in range(5):  # the parent's session was left alone
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0)
    assert ledger._s.conn is parents
    assert acc.spent().epsilon == pytest.approx(0.06)
    assert audit(ledger).ok
    acc.close()


@pytest.mark.postgres
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


@pytest.mark.postgres
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


# -- each debit's values as bound parameters: names, labels and record texts that look like SQL
# are stored verbatim; a NUL is refused before anything is written; the session speaks UTF-8

HOSTILE = ["it's", "'); DROP TABLE dpbudget_entries; --", "back\\slash\\'", "%s %(x)s %%",
           "E'\\x27'", "$$ dollar $$", "émoji ✓ \u2028", "semi;colon", "\"quoted\""]


@pytest.mark.postgres
def test_hostile_labels_and_names_are_stored_verbatim(postgres_database: str) -> None:
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(10.0), ledger=dsn, rng=0, simulation=True)
    for i, text in enumerate(HOSTILE):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=f"d{i}", label=text)
    labels = [e.record.get("label") for e in acc.ledger.entries()
              if e.record["kind"] == "release"]
    assert labels == HOSTILE
    assert audit(acc.ledger).ok
    assert len([a for a in acc.ledger.accounts() if a.key.startswith("dataset:")]) == len(HOSTILE)
    acc.close()


@pytest.mark.postgres
def test_a_nul_character_is_refused_before_anything_is_written(postgres_database: str) -> None:
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(_fresh_schema(postgres_database)),
                     rng=0, simulation=True)
    head = acc.ledger.head()
    with pytest.raises(LedgerError):  # (the server cannot store it in its JSON checks)
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, label="a\0b")
    assert acc.ledger.head() == head and acc.spent().epsilon == 0.0
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)  # nothing left locked or open
    acc.close()


@pytest.mark.postgres
def test_the_session_speaks_utf8_whatever_the_environment_says(
        postgres_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a client encoding in which a UTF-8 byte can swallow the next backslash, a label
    would be stored altered and a keyed ledger would then refuse to open for everyone."""
    monkeypatch.setenv("PGCLIENTENCODING", "SJIS")
    dsn = _fresh_schema(postgres_database)
    acc = Accountant(Budget(1.0), ledger=dsn, rng=0, simulation=True)
    for label in ["語\\u0041", "ünïcödé \\ back", "Ω\\\\"]:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, label=label)
    acc.close()
    again = Accountant.open(dsn, rng=0, simulation=True)  # the stored texts are the hashed ones
    labels = [e.record.get("label") for e in again.ledger.entries()
              if e.record["kind"] == "release"]
    assert labels == ["語\\u0041", "ünïcödé \\ back", "Ω\\\\"]
    assert audit(again.ledger).ok
    again.close()


@pytest.mark.postgres
def test_a_schema_name_is_filled_in_once_never_read_again_for_placeholders() -> None:
    """The DDL template was filled by chained replaces, ``{S_LITERAL}`` before ``{S}``: a schema
    named ``a{S}'); ...`` had its ``{S}`` replaced again inside the string literal, ending it
    early, and ``ledger{V}`` became ``"ledger9"`` (review of the one-package ledger)."""
    from dpbudget.accountant.ledger.postgres.schema import ddl

    text = ddl("ledger{V}")
    assert '"ledger{V}"' in text and '"ledger9"' not in text
    evil = "a{S}'); DROP TABLE victim; --"
    text = ddl(evil)
    assert "'\"a{S}''); DROP TABLE victim; --\"'" in text  # one literal, quotes doubled
    assert text.count("DROP TABLE victim") == text.count('"a{S}\'); DROP TABLE victim; --"') + \
        text.count("'\"a{S}''); DROP TABLE victim; --\"'")


@pytest.mark.postgres
def test_the_ledger_never_shows_a_password() -> None:
    """``url`` appears in errors, ``dpbudget status``, report captions and the writers' logs; a
    DSN's password stayed in it (review of the one-package ledger)."""
    from dpbudget.accountant.ledger.postgres.session import shown

    for dsn in ("postgresql://bob:s3cret@db.example:5432/ledger?sslmode=require",
                "host=db.example user=bob password=s3cret dbname=ledger",
                "host=db.example user=bob sslpassword=s3cret dbname=ledger"):
        assert "s3cret" not in shown(dsn) and "bob" in shown(dsn)
    assert shown("postgresql://bob@db.example/ledger") == "postgresql://bob@db.example/ledger"


@pytest.mark.postgres
def test_a_schema_name_that_could_end_a_dollar_quote_is_refused() -> None:
    """The server functions' bodies are dollar-quoted (``DO $logged$ ... $logged$``): a schema
    named with ``$logged$`` closed one early (review of the one-package ledger)."""
    from dpbudget.accountant.ledger.postgres.schema import ddl
    from dpbudget.accountant.values.errors import LedgerError

    with pytest.raises(LedgerError):
        ddl("a$logged$b")
    assert '"plain"' in ddl("plain")


# -- Issue 32: a server crash under load is not a deletion ------------------------------------


def _crash_load(url: str, worker: int, stop: Any) -> None:
    """A process releasing until told to stop, on a dataset of its own and a shared one, through
    a server crash and after the restart (a debit that failed with the server is tried again)."""
    acc = Accountant(Budget(1e6), ledger=PostgresLedger(url, timeout=5), rng=None)
    n = 0
    while not stop.is_set():
        try:
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0,
                        dataset=f"own{worker}" if n % 2 else "shared")
        except LedgerError:
            stop.wait(0.05)
        n += 1


def _crash_head(url: str) -> int:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT coalesce(max(seq), 0) FROM dpbudget_entries").fetchone()
            return int(row[0]) if row else 0
    except psycopg.Error:
        return 0


def _crash_until(condition: Any, tries: int = 6000) -> None:
    for _ in range(tries):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("the load made no progress")


@pytest.mark.slow
def test_a_server_crash_under_load_audits_clean_and_a_deletion_still_shows(
        crashable: str) -> None:
    """Issue 32: records a crash lost were reported deleted. Four processes release while the
    server is crashed; one transaction holding a number is in flight at the crash (as a debit's
    is), and later records were committed above it. The audit counts the numbers no record holds
    (``unused``) and finds no problem; a committed record deleted by the owner, triggers off, is
    still a chain problem (the negative control: the same audit can fail)."""
    from tests import _postgres

    url = _postgres.fresh_database(crashable)
    Accountant(Budget(1e6), ledger=PostgresLedger(url), rng=None).close()
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    workers = [ctx.Process(target=_crash_load, args=(url, i, stop)) for i in range(4)]
    for worker in workers:
        worker.start()
    try:
        _crash_until(lambda: _crash_head(url) >= 100)
        in_flight = psycopg.connect(url)  # a debit's transaction: its number taken, uncommitted
        row = in_flight.execute("SELECT nextval('dpbudget_seq')").fetchone()
        assert row is not None
        taken = int(row[0])
        _crash_until(lambda: _crash_head(url) > taken + 20)
        _postgres.crash_and_restart(crashable)
        in_flight.close()  # (its session died with the server)
        after = _crash_head(url)
        _crash_until(lambda: _crash_head(url) > after + 100)  # the processes go on after the restart
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    assert all(worker.exitcode == 0 for worker in workers)
    report = audit(url)
    assert report.exit_status == 0, [p.message for p in report.problems]
    assert report.unused >= 1 and report.unused == report.head_seq - report.records
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM dpbudget_entries WHERE seq = %s",
                            (taken,)).fetchone() is None  # (the hole the in-flight one left)
        row = conn.execute("SELECT min(seq) FROM dpbudget_entries WHERE seq > %s AND record "
                           "LIKE '%%dataset:shared%%'", (taken,)).fetchone()
        assert row is not None
        last = conn.execute("SELECT seq FROM dpbudget_lanes WHERE key = 'dataset:own0'"
                            ).fetchone()  # the last record of a lane: no successor names it
        assert last is not None
        conn.execute("ALTER TABLE dpbudget_entries DISABLE TRIGGER USER")
        conn.execute("DELETE FROM dpbudget_entries WHERE seq = %s", (row[0],))
    report = audit(url)
    assert report.exit_status & 8
    assert any(p.kind == "chain" and f"record {row[0]}" in p.message for p in report.problems)
    with psycopg.connect(url, autocommit=True) as conn:  # (the audit's open set them again)
        conn.execute("ALTER TABLE dpbudget_entries DISABLE TRIGGER USER")
        conn.execute("DELETE FROM dpbudget_entries WHERE seq = %s", (last[0],))
    found = [p for p in audit(url).problems if f"record {last[0]}" in p.message]
    assert found and all(p.kind == "chain" for p in found), found  # (its account row names it)
