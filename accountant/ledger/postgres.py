"""The PostgreSQL ledger: the scale-out backend, for many processes on many machines.

Same records and account states as the SQLite ledger, but linked per account (record format 2,
``dpbudget.accountant.ledger.lanes``) instead of in one chain, so that debits on different accounts append
in parallel. A debit is one transaction that first locks its accounts' lanes (advisory locks, in
one order: ``postgres_lanes.locks``) and the policy's lane (shared), so that a check made on the
states it read is still true when it commits; its time is the server's (``postgres_time``). The
COMMIT is asynchronous, and the same round trip then waits until it is on disk (``_commit``: group
commit), before anything is drawn on it. A debit is two round trips through libpq itself, or one
when it can start from what this object's last commit left (``_begin``: optimistic, checked by the
server's lane trigger and redone by the gate on fresh reads if another writer moved a lane).

The server guards the tables itself, against clients that bypass dpbudget with raw SQL as well:
triggers keep the records append-only and correctly linked on every lane, and every account's row
equal to what its last record wrote, never decreasing (``dpbudget.accountant.ledger.postgres_schema``). The
tables' owner creates them; processes that run the gate can open the ledger as a role that owns
nothing (docs/postgres-deployment.md).

Needs the optional extra: ``pip install "dpbudget[postgres]"`` (psycopg 3).
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from dpbudget.accountant.errors import LedgerError, LedgerStaleError, LedgerUnconfirmedError
from dpbudget.accountant.ledger.base import Account, Entry
from dpbudget.accountant.ledger.lanes import FORMAT, START
from dpbudget.accountant.ledger.postgres_lanes import locks, reads
from dpbudget.accountant.ledger.postgres_schema import prepare
from dpbudget.accountant.ledger.postgres_reads import PgReads
from dpbudget.accountant.ledger.postgres_session import _INHERITED, PgSession
from dpbudget.accountant.ledger.postgres_sync import FLUSH, PgSync, WaitedLock
from dpbudget.accountant.ledger.postgres_time import PgTime, lane_time
from dpbudget.accountant.ledger.record import float_object
from dpbudget.accountant.ledger.sql import SqlLedger, _account

__all__ = ["PostgresLedger"]

# Makes the asynchronous commit before it durable (``PostgresLedger._commit``, ``postgres_sync``).
# After a debit it returns a number for the next one (``_begin``), which other transactions,
# numbered when they begin, do not take.
_FLUSH = FLUSH.replace("RETURNING 0", "RETURNING nextval('dpbudget_seq')")

# Debits run on fresh reads after an optimistic one found the cache stale (other writers are
# active: optimism would mostly cost a wasted round trip).
_BACKOFF = 16
# Taken while a ledger's tables are created or updated: two openers never run the DDL at once.
_LOCK_KEY = zlib.crc32(b"dpbudget-ledger")
# Every transaction's start: asynchronous commit (``PostgresLedger._commit``).
_BEGIN = "BEGIN; SET LOCAL synchronous_commit = off"


class _Cache(NamedTuple):
    """What this object's last confirmed commit left: the next debit starts from it without a
    read while no other writer interferes."""

    lanes: dict[str, tuple[int, str]]
    read: dict[str, Account | None]
    seq: int  # a number taken for the next record
    micros: int  # the committed record's time: no record on ``lanes`` is later


class PostgresLedger(PgTime, PgReads, PgSync, PgSession, SqlLedger):
    """A ledger in a PostgreSQL database. ``PostgresLedger("postgresql://user@host/db")``.

    Args:
        dsn: a libpq connection string or URL.
        timeout: seconds to wait for another writer's lock, for a connection, or for a server
            that stopped answering, before a typed ``LedgerError`` (nothing is written).
        hmac_key: chain new records with HMAC-SHA256 under this key (default: the environment
            variable ``DPBUDGET_LEDGER_KEY``, if set); see ``dpbudget.accountant.ledger.record``.

    Raises:
        LedgerError: psycopg is not installed, the server cannot be reached, the database holds
            a ledger of another format version, or the ledger's tables or triggers are missing or
            outdated and this role is not allowed to create them (only their owner is).
    """

    _P = "%s"
    _T = "dpbudget_"
    lanes = True
    _format = FORMAT  # (a version of dpbudget before lanes refuses to open it)

    def __init__(self, dsn: str, *, timeout: float = 30.0,
                 hmac_key: bytes | str | None = None) -> None:
        super().__init__(hmac_key=hmac_key)
        self._lock = WaitedLock()  # (whether other threads wait: ``_commit`` defers the flush)
        self._init_sync()
        self._tx_read: dict[str, Account | None] | None = None  # inside a transaction
        self._tx_lanes: dict[str, tuple[int, str]] = {}
        self._tx_seq: int | None = None  # the number the next record gets
        self._tx_first: int | None = None  # the first number this transaction took
        self._tx_cached = False  # begun by a debit (``cached``): its flush numbers the next
        self._tx_head: tuple[int, str] | None = None  # the last record (read when asked)
        self._tx_entry: Entry | None = None  # the record this transaction wrote
        self._pending: list[str] = []  # the transaction's statements, as SQL with literals
        self._writes = 0
        self._cache: _Cache | None = None
        self._spare: int | None = None  # a number taken after the last commit, still unused
        self._backoff = 0  # debits to run pessimistically after a stale optimistic one
        self._audited: list[Account] | None = None  # read with the last full entries()
        self._init_time()
        try:
            import psycopg
        except ImportError:
            raise LedgerError("the PostgreSQL ledger needs psycopg 3: "
                              'pip install "dpbudget[postgres]"') from None
        if not (isinstance(timeout, (int, float)) and 0.0 < timeout < math.inf):
            raise LedgerError(f"timeout must be a finite number of seconds > 0; got {timeout!r}")
        self._psycopg = psycopg
        self.dsn = dsn
        self.url = dsn
        self.timeout = float(timeout)
        try:
            self._connect()
            try:
                with self._conn.transaction():
                    self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                    prepare(self._conn, self._psycopg)
                    self._check_format()
            except BaseException:
                self._conn.close()  # the caller never gets a handle that could close it
                raise
        except psycopg.Error as exc:
            raise LedgerError(f"cannot open PostgreSQL ledger: {exc}") from exc
        self._salt: str | None = None  # read on the first transaction (only writers may)

    def _forked(self) -> None:
        # The parent's cache and spare number are the parent's: used here too, both processes
        # would give two records one number (refused, but a failed debit).
        self._cache, self._spare, self._backoff = None, None, 0
        self._sync_forked(_INHERITED)
        self._lock.forget_waiters()

    def _writer_key(self) -> str | None:
        """None: each object is a writer of its own (``dpbudget.accountant.ledger.writer``). A writer's
        count moves one transaction at a time, and two objects' transactions on other lanes run
        at once here: sharing one count, they could give two records the same number."""
        return None

    def _begin(self, prefetch: Sequence[str] = (), shared: Sequence[str] = (),
               cached: bool = False) -> None:
        self._usable()
        if self._salt is None:
            self._salt = self._read_salt()
        if self._conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
            self._rollback()  # a transaction an interrupt left open: it never committed
        read_only = list(dict.fromkeys(k for k in shared if k in prefetch))
        written = list(dict.fromkeys(k for k in prefetch if k not in read_only))
        cache = self._cache
        self.optimistic, self._tx_shared, self._tx_cached = False, read_only, cached
        self._writes, self._tx_entry = 0, None
        if self._backoff:
            self._backoff -= 1
        elif (cached and cache is not None and not self._tx_timed and prefetch
              and all(k in cache.read for k in prefetch)
              and all(k in cache.lanes for k in prefetch) and not self._pending_input()):
            # Optimistic: this object knows every account and lane the debit reads, as its last
            # commit left them. Nothing is sent now: the begin, the locks, the writes and the
            # commit go in one round trip (``_commit``), where the server refuses the record if
            # any other writer moved one of its lanes, or the policy's, meanwhile.
            self.optimistic = True
            self._tx_lanes, self._tx_read = dict(cache.lanes), dict(cache.read)
            self._tx_seq, self._tx_head, self._spare = cache.seq, None, None
            self._tx_first = cache.seq
            self._carry_time(cache.micros)  # (never ``timed``: accountant.ledger.postgres_time)
            # (The policy's lane is checked by the server through the record's ``reads``.)
            self._pending = [locks(self._salt, written, read_only)]
            return
        # One round trip: begin, lock the lanes, then (statements of their own: a statement reads
        # from the snapshot it began with, older than a lock it waited for) read them, the
        # accounts and the server's clock, and take a number for the record: the spare one while
        # it is above every locked lane's last, read ones included (numbers need only grow along
        # each lane, and a record must come after what it read), so that a lone writer's records
        # are numbered without gaps. Commits are asynchronous (the locks are released without
        # waiting for the disk); ``_commit`` makes each one durable before it returns.
        every = self._array([*written, *read_only])
        # (Only a debit uses a spare number: whatever writes a lane others read — a policy change —
        # must come after every record that read it, so takes a new number once it is locked.)
        spare = "NULL" if self._spare is None or not cached else str(int(self._spare))
        sql = f"{_BEGIN}; {locks(self._salt, written, read_only)}; {reads(every, spare)}"
        try:
            rows = self._raw(sql)
        except LedgerError:
            if not self._conn.broken:
                raise
            # The session died unseen since its last use: nothing has run in this transaction,
            # so a new session can start it afresh.
            self._reconnect()
            rows = self._raw(sql)
        read: dict[str, Account | None] = dict.fromkeys(prefetch)
        lanes: dict[str, tuple[int, str]] = dict.fromkeys((*written, *read_only), START)
        self._tx_head, self._tx_seq, floor, server = None, None, 0, None  # (head: when asked)
        for kind, key, seq, a, b, c in rows:
            if kind == "l":
                lanes[key] = (int(seq), a)
                floor = max(floor, lane_time(key, b))
            elif kind == "a":
                read[key] = _account((key, a, b, c, int(seq)))
            else:
                self._tx_seq, server = int(seq), a
        self._read_time(server, floor)
        self._spare, self._tx_first = None, self._tx_seq
        self._tx_read, self._tx_lanes, self._pending = read, lanes, []

    def _read_salt(self) -> str:
        """The ledger's lock salt (``postgres_lanes.locks``). Without it this object's locks
        would not be the other writers' (a policy change would not wait for its debits).

        Raises:
            LedgerError: this role cannot read it (grants from before it existed: the owner
                must run ``grant_statements`` again), or it is missing; nothing was written.
        """
        try:
            row = self._conn.execute("SELECT salt FROM dpbudget_salt").fetchone()
        except self._psycopg.Error as exc:
            row = None
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        else:
            why = "it is missing"
        if row is None or not row[0]:
            raise LedgerError(f"PostgreSQL ledger: cannot read the ledger's lock salt "
                              f"(dpbudget_salt: {why}); a writer needs SELECT on it: the owner "
                              "runs grant_statements again after an upgrade. Nothing was written")
        return str(row[0])

    def _array(self, keys: Sequence[str]) -> str:
        return f"ARRAY[{', '.join(self._literal(k) for k in keys)}]::text[]"

    def _head(self) -> tuple[int, str]:
        if self._tx_read is not None and self._tx_head is not None:
            return self._tx_head
        head = super()._head()
        if self._tx_read is not None:
            self._tx_head = head
        return head

    def _read_account(self, key: str) -> Account | None:
        read = self._tx_read
        if read is None:
            return super()._read_account(key)
        if key not in read:
            # Not locked by this transaction: its lane is read in the same statement, so that
            # the link the record will carry is the one this state is from (the server refuses
            # the record if the lane moved since; a lane read later could pass with this state
            # stale).
            row = self._execute(
                "SELECT a.key, a.rule, a.config, a.state, a.seq, l.seq, l.hash FROM (SELECT "
                "%s::text AS key) k LEFT JOIN dpbudget_accounts a ON a.key = k.key LEFT JOIN "
                "dpbudget_lanes l ON l.key = k.key", (key,)).fetchone()
            read[key] = None if row is None or row[0] is None else _account(row[:5])
            if key not in self._tx_lanes:
                lane = None if row is None or row[5] is None else (int(row[5]), row[6])
                self._tx_lanes[key] = START if lane is None else lane
        return read[key]

    def _lane(self, key: str) -> tuple[int, str]:
        lane = self._tx_lanes.get(key)
        if lane is None:  # not locked by this transaction: the server checks it at the insert
            row = self._execute("SELECT seq, hash FROM dpbudget_lanes WHERE key = %s",
                                (key,)).fetchone()
            lane = self._tx_lanes[key] = START if row is None else (int(row[0]), row[1])
        return lane

    def _next_seq(self) -> int:
        if self._tx_seq is None:
            row = self._execute("SELECT nextval('dpbudget_seq')").fetchone()
            self._tx_seq = int(row[0])
            if self._tx_first is None:
                self._tx_first = self._tx_seq
        return self._tx_seq

    def _advance(self, keys: list[str], entry: Entry) -> None:
        for key in keys:
            self._tx_lanes[key] = (entry.seq, entry.hash)
        self._tx_seq = None
        if self._tx_head is None or entry.seq > self._tx_head[0]:
            self._tx_head = (entry.seq, entry.hash)

    def _write_entry(self, entry: Entry) -> None:
        self._pending.append(f"INSERT INTO dpbudget_entries (seq, hash, record) VALUES "
                             f"({int(entry.seq)}, {self._literal(entry.hash)}, "
                             f"{self._literal(entry.text)})")
        self._tx_entry = entry
        self._writes += 1

    def _write_accounts(self, accounts: list[Account]) -> None:
        read = self._tx_read
        assert read is not None  # only inside a transaction
        for a in accounts:
            rule, config, state, key = (self._literal(v) for v in (
                a.rule, self._config_text(a.config), float_object(a.state), a.key))
            if self._read_account(a.key) is None:  # (read under its lane's lock)
                sql = (f"INSERT INTO dpbudget_accounts (rule, config, state, seq, key) VALUES "
                       f"({rule}, {config}, {state}, {int(a.seq)}, {key})")
            else:
                sql = (f"UPDATE dpbudget_accounts SET rule = {rule}, config = {config}, state = "
                       f"{state}, seq = {int(a.seq)} WHERE key = {key}")
            self._pending.append(sql)
            self._writes += 1
            read[a.key] = a

    def _commit(self) -> tuple[int, int] | None:
        """Write what the transaction staged, commit, and wait until the commit is on disk — in
        one round trip, with the lanes' locks held only until the commit, not through the disk
        write: group commit across processes. While other threads wait for this object, the
        wait for the disk is left to ``_sync`` (the token returned), after the object is
        released: group commit across threads (``dpbudget.accountant.ledger.postgres_sync``).

        The transaction commits asynchronously, which releases its locks as soon as its commit
        record is in the write-ahead log; the statement after it (one row of ``dpbudget_flush``
        written, with ``synchronous_commit`` on) returns only once the log is on disk up to its
        own commit record, which comes after ours. Any writer that reads our record before it is
        on disk commits after it in the log, so it cannot outlive ours in a crash; and no answer
        is released before this returns.

        Raises:
            LedgerError: nothing was committed.
            LedgerUnconfirmedError: the commit happened (or may have) but the server did not
                confirm that it is on disk: the debit may stand, and nothing may be drawn on it.
        """
        if self._pid != os.getpid():  # (forked inside the transaction: it is the parent's)
            raise LedgerError("PostgreSQL ledger: this transaction was begun in the process "
                              "that forked this one; nothing was sent from here")
        statements, writes = self._pending, self._writes
        staged, self._tx_entry = self._tx_entry, None
        read, self._tx_read = self._tx_read, None
        lanes = self._tx_lanes
        self._pending, self._tx_lanes, self._writes, self._cache = [], {}, 0, None
        self._tx_first = None  # (sent: never reused, even if the commit's fate is unknown)
        status = self._psycopg.pq.TransactionStatus
        if self.optimistic:
            statements = [_BEGIN] + statements
        elif self._conn.info.transaction_status != status.INTRANS:
            raise LedgerError("PostgreSQL ledger: the transaction was lost (its session ended) "
                              "before it committed; nothing was written")
        if not writes:  # (nothing written: nothing to make durable)
            if not self.optimistic:
                self._raw("COMMIT")
            return None
        defer, cached = self._defer_to(), self._tx_cached
        if defer is not None:  # (a debit still takes the next one's number: the one after it may be cached)
            tail = ["COMMIT", "SELECT nextval('dpbudget_seq')"] if cached else ["COMMIT"]
        else:
            tail = ["COMMIT", _FLUSH if cached else FLUSH]
        try:
            rows = self._raw("; ".join(statements + tail))
        except LedgerError as exc:
            if self.optimistic and self._conn.info.transaction_status == status.INERROR:
                # Refused before the commit (most likely: another writer moved a lane since the
                # cache): nothing was written; the gate redoes the debit on fresh reads.
                self._backoff = _BACKOFF
                raise LedgerStaleError(f"{exc} (an optimistic debit; redone)") from exc
            landed = self._landed_after(staged, exc)
            if landed is False:
                raise
            raise LedgerUnconfirmedError(
                f"PostgreSQL ledger: the debit {'was' if landed else 'may have been'} committed "
                f"but the server did not confirm that it reached the disk ({exc}); nothing was "
                "drawn on it, and its budget stays spent") from exc
        if defer is None and (len(rows) != 1 or rows[0][0] is None):
            raise LedgerUnconfirmedError(
                "PostgreSQL ledger: the debit was committed but the server did not confirm that "
                "it reached the disk (the flush wrote no row: dpbudget_flush is hidden or "
                "refused); nothing was drawn on it, and its budget stays spent")
        self._spare = (int(rows[0][0]) or None) if cached and rows and rows[0][0] else None
        if staged is not None and read is not None and self._spare is not None:
            self._cache = _Cache(lanes, read, self._spare, self._tx_time)
        return None if defer is None else self._deferred(defer)

    def _landed_after(self, staged: Entry | None, error: LedgerError) -> bool | None:
        """After a failed commit round trip: whether the transaction's record is in the ledger
        (True), is not (False: the failure came before or at the COMMIT), or cannot be known."""
        status = self._conn.info.transaction_status
        if status == self._psycopg.pq.TransactionStatus.INERROR:
            return False  # a statement before the COMMIT failed; the rest was skipped
        if status != self._psycopg.pq.TransactionStatus.IDLE or staged is None:
            return None  # the session broke: the COMMIT may or may not have run
        try:
            return self._landed(staged)
        except LedgerError:
            return None

    def _rollback(self) -> None:
        if self._tx_first is not None:
            self._spare = self._tx_first  # never sent: a refused debit leaves no gap
        self._tx_first = None
        self._pending, self._tx_read, self._cache, self._tx_lanes = [], None, None, {}
        if self._pid != os.getpid():
            return  # a forked child: the session is the parent's, never touched from here
        try:
            self._conn.execute("ROLLBACK")
        except self._psycopg.Error:
            pass  # the connection is broken; nothing was committed

