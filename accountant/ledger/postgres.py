"""The PostgreSQL ledger: the scale-out backend, for many processes on many machines.

Same records, chain and account states as the SQLite ledger. Every check-and-debit is one
transaction that first takes a transaction-level advisory lock dedicated to this ledger, so writers
are serialised exactly as the hash chain requires (each record names the one before it). The lock
is released by the COMMIT, which is asynchronous; the same round trip then waits until the commit
is on disk (``PostgresLedger._commit``: group commit), before anything is drawn on it. A debit is
two round trips through libpq itself, or one when it can start from what this object's last
commit left (``_begin``: optimistic, checked by the server's chain trigger and redone by the gate
on fresh reads if another writer moved on).

The server guards the tables itself, against clients that bypass dpbudget with raw SQL as well:
triggers keep the records an append-only, correctly linked chain and every account's row equal to
what its last record wrote, never decreasing (``accountant.ledger.postgres_schema``). The tables'
owner creates them; processes that run the gate can open the ledger as a role that owns nothing
(docs/postgres-deployment.md).

Needs the optional extra: ``pip install "dpbudget[postgres]"`` (psycopg 3).
"""

from __future__ import annotations

import math
import os
import select
import zlib
from collections.abc import Sequence
from typing import Any

from accountant.errors import LedgerError, LedgerStaleError
from accountant.ledger.base import EMPTY_HEAD, Account, Entry
from accountant.ledger.record import float_object
from accountant.ledger.postgres_schema import prepare
from accountant.ledger.sql import SqlLedger, _account

__all__ = ["PostgresLedger"]

# Makes the asynchronous commit before it durable (``PostgresLedger._commit``): a write, so its
# transaction waits for the disk — an upsert, which writes a row even if someone deleted them all
# (an UPDATE matching no row would write nothing and wait for nothing); a row per backend slot, so
# that writers do not queue on one row.
_FLUSH = ("INSERT INTO dpbudget_flush AS f VALUES (mod(pg_backend_pid(), 64), 1) "
          "ON CONFLICT (slot) DO UPDATE SET n = f.n + 1")

# Debits run on fresh reads after an optimistic one found the cache stale (other writers are
# active: optimism would mostly cost a wasted round trip).
_BACKOFF = 16
# One advisory lock key per ledger kind; per-database, so ledgers in different databases are
# independent.
_LOCK_KEY = zlib.crc32(b"dpbudget-ledger")
# Every transaction's start: asynchronous commit (``PostgresLedger._commit``), the ledger's lock.
_BEGIN = f"BEGIN; SET LOCAL synchronous_commit = off; SELECT pg_advisory_xact_lock({_LOCK_KEY})"


class PostgresLedger(SqlLedger):
    """A ledger in a PostgreSQL database. ``PostgresLedger("postgresql://user@host/db")``.

    Args:
        dsn: a libpq connection string or URL.
        timeout: seconds to wait for another writer's lock, for a connection, or for a server
            that stopped answering, before a typed ``LedgerError`` (nothing is written).
        hmac_key: chain new records with HMAC-SHA256 under this key (default: the environment
            variable ``DPBUDGET_LEDGER_KEY``, if set); see ``accountant.ledger.record``.

    Raises:
        LedgerError: psycopg is not installed, the server cannot be reached, the database holds
            a ledger of another format version, or the ledger's tables or triggers are missing or
            outdated and this role is not allowed to create them (only their owner is).
    """

    _P = "%s"
    _T = "dpbudget_"

    def __init__(self, dsn: str, *, timeout: float = 30.0,
                 hmac_key: bytes | str | None = None) -> None:
        super().__init__(hmac_key=hmac_key)
        self._tx_read: dict[str, Account | None] | None = None  # inside a transaction
        self._tx_head: tuple[int, str] = EMPTY_HEAD
        self._tx_entry: Entry | None = None
        self._pending: list[str] = []  # the transaction's writes, as SQL with literals
        # (head entry, unused, accounts) as this object's last confirmed commit left them; the
        # next debit starts from it without a read while no other writer interferes.
        self._cache: tuple[Entry, None, dict[str, Account | None]] | None = None
        self._backoff = 0  # debits to run pessimistically after a stale optimistic one
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

    def _connect(self) -> None:
        """A new session: durable commits, and no wait without end. ``lock_timeout`` bounds the
        wait for another writer's lock; ``tcp_user_timeout`` and keepalives bound a wait on a
        server that stopped answering (a frozen server), where a server-side timeout cannot."""
        ms = max(1, int(self.timeout * 1000))
        self._conn = self._psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=max(2, math.ceil(self.timeout)),
            keepalives=1, keepalives_idle=max(1, math.ceil(self.timeout / 3)),
            keepalives_interval=max(1, math.ceil(self.timeout / 9)), keepalives_count=3,
            tcp_user_timeout=ms)
        # UTF-8 whatever the environment, role or database says: the debit path encodes its
        # statements as UTF-8 (``_raw``), and the text the server stores must be the text hashed.
        self._conn.execute("SET client_encoding = 'UTF8'")
        self._conn.execute("SET synchronous_commit = on")
        self._conn.execute(f"SET lock_timeout = {ms}")
        if self._conn.info.encoding != "utf-8":  # pragma: no cover - the SET above failed
            raise LedgerError("PostgreSQL ledger: the session does not speak UTF-8")
        self._pid = os.getpid()

    def _usable(self) -> None:
        """Make sure the session is this process's and alive, before a transaction or a read
        outside one (never inside a transaction: a new session would not be in it).

        After ``fork()`` the child never touches its parent's session: the parent's connection
        object is kept (so that its finaliser cannot end the parent's session from here) and the
        child opens its own. A session lost since its last use (a server restart, a dropped
        connection) is replaced; nothing was in flight on it. Inside a transaction nothing is
        replaced: a new session would not hold the transaction or its lock."""
        if self._tx_read is not None:
            if self._pid != os.getpid() or self._conn.closed or self._conn.broken:
                raise LedgerError("PostgreSQL ledger: the session ended inside a transaction; "
                                  "nothing was written")
            return
        if self._pid != os.getpid():
            _INHERITED.append(self._conn)
            self._reconnect()
        elif self._conn.closed or self._conn.broken:
            self._reconnect()

    def _reconnect(self) -> None:
        try:
            self._connect()
        except self._psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger: cannot reconnect: {exc}") from exc

    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        try:
            return self._conn.execute(sql, args)
        except self._psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger: {exc}") from exc

    def _begin(self, prefetch: Sequence[str] = ()) -> None:
        self._usable()
        if self._conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
            self._rollback()  # a transaction an interrupt left open: it never committed
        cache = self._cache
        self.optimistic = False
        if self._backoff:
            self._backoff -= 1
        elif (cache is not None and prefetch and all(k in cache[2] for k in prefetch)
              and not self._pending_input()):
            # Optimistic: this object wrote the last record it knows of, and it knows every
            # account the debit reads as that record left them. Nothing is sent now: the begin,
            # the lock, the writes and the commit go in one round trip (``_commit``), where the
            # server's chain check refuses the record if any other writer appended meanwhile.
            self.optimistic = True
            self._tx_entry, self._tx_head = cache[0], (cache[0].seq, cache[0].hash)
            self._tx_read, self._pending = dict(cache[2]), []
            return
        # One round trip: begin, take the ledger's lock, read the head and the accounts the
        # debit will read. Commits are asynchronous (the lock is released without waiting for the
        # disk); ``_commit`` makes each one durable before it returns (see there).
        keys = ", ".join(self._literal(k) for k in prefetch) or "NULL"
        sql = (f"{_BEGIN}; "
               "SELECT 'h', seq, hash, record, NULL, NULL FROM (SELECT seq, hash, record FROM "
               "dpbudget_entries ORDER BY seq DESC LIMIT 1) h UNION ALL SELECT 'a', seq, key, "
               f"rule, config, state FROM dpbudget_accounts WHERE key IN ({keys})")
        try:
            rows = self._raw(sql)
        except LedgerError:
            if not self._conn.broken:
                raise
            # The session died since its last use and only this found out: nothing has run in
            # this transaction, so a new session can start it afresh.
            self._reconnect()
            rows = self._raw(sql)
        read: dict[str, Account | None] = dict.fromkeys(prefetch)
        self._tx_entry, self._tx_head = None, EMPTY_HEAD
        for kind, seq, a, b, c, d in rows:
            if kind == "h":
                self._tx_entry = Entry(int(seq), b, a)
                self._tx_head = (int(seq), a)
            else:
                read[a] = _account((a, b, c, d, int(seq)))
        self._tx_read = read
        self._pending = []

    def _pending_input(self) -> bool:
        """Whether the server said something unasked (a session it ended sends a notice, then
        closes): then the next debit starts with a round trip that finds out safely — nothing
        of an optimistic debit must be sent into a connection that may be gone, as it could
        not be told afterwards whether its commit ran."""
        try:
            poller = select.poll()  # (not select.select: it fails on descriptors >= 1024)
            poller.register(self._conn.pgconn.socket, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError, AttributeError, self._psycopg.Error):
            return True

    def _literal(self, value: str) -> str:
        """``value`` as an SQL string literal (libpq's own escaping). A NUL character is
        refused: libpq would end the whole query text there."""
        if "\0" in value:
            raise LedgerError("PostgreSQL ledger: a NUL character cannot be stored (in a "
                              "name or record); nothing was written")
        try:
            escaped = self._psycopg.pq.Escaping(self._conn.pgconn).escape_literal(
                value.encode("utf-8"))
        except self._psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger: {exc}") from exc
        return bytes(escaped).decode("utf-8")

    def _raw(self, sql: str) -> list[tuple[Any, ...]]:
        """Run several statements in one round trip through libpq itself (less client work
        than a cursor: this is every debit's path); the rows of the last statement as text, or
        for a statement without rows its row count as ``[(count,)]``. Values must already be
        literals (``_literal``).

        Raises:
            LedgerError: any statement failed (those after it did not run).
        """
        pq = self._psycopg.pq
        try:
            result = self._conn.pgconn.exec_(sql.encode("utf-8"))
        except self._psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger: {exc}") from exc
        status = result.status
        if status == pq.ExecStatus.TUPLES_OK:
            return [tuple(None if (v := result.get_value(r, c)) is None else bytes(v).decode()
                          for c in range(result.nfields)) for r in range(result.ntuples)]
        if status == pq.ExecStatus.COMMAND_OK:
            return [(result.command_tuples,)]
        message = (result.error_message or b"").decode("utf-8", "replace").strip()
        raise LedgerError(f"PostgreSQL ledger: {message or 'no answer from the server'}")

    def _head(self) -> tuple[int, str]:
        if self._tx_read is not None:
            return self._tx_head
        return super()._head()

    def _read_account(self, key: str) -> Account | None:
        read = self._tx_read
        if read is None:
            return super()._read_account(key)
        if key not in read:
            read[key] = super()._read_account(key)
        return read[key]

    def _write_entry(self, entry: Entry) -> None:
        self._pending.append(f"INSERT INTO dpbudget_entries (seq, hash, record) VALUES "
                             f"({int(entry.seq)}, {self._literal(entry.hash)}, "
                             f"{self._literal(entry.text)})")
        self._tx_head, self._tx_entry = (entry.seq, entry.hash), entry

    def _write_accounts(self, accounts: list[Account]) -> None:
        read = self._tx_read
        assert read is not None  # only inside a transaction
        for a in accounts:
            rule, config, state, key = (self._literal(v) for v in (
                a.rule, self._config_text(a.config), float_object(a.state), a.key))
            if self._read_account(a.key) is None:  # (read under the lock: it cannot appear)
                sql = (f"INSERT INTO dpbudget_accounts (rule, config, state, seq, key) VALUES "
                       f"({rule}, {config}, {state}, {int(a.seq)}, {key})")
            else:
                sql = (f"UPDATE dpbudget_accounts SET rule = {rule}, config = {config}, state = "
                       f"{state}, seq = {int(a.seq)} WHERE key = {key}")
            self._pending.append(sql)
            read[a.key] = a

    def _commit(self) -> None:
        """Write what the transaction staged, commit, and wait until the commit is on disk — in
        one round trip, with the ledger's lock held only until the commit, not through the disk
        write: group commit across processes.

        The transaction commits asynchronously, which releases its locks as soon as its commit
        record is in the write-ahead log; the statement after it (one row of ``dpbudget_flush``
        written, with ``synchronous_commit`` on) returns only once the log is on disk up to its
        own commit record, which comes after ours. Any writer that reads our record before it is
        on disk commits after it in the log, so it cannot outlive ours in a crash; and no answer
        is released before this returns.

        Raises:
            LedgerError: nothing was committed; or, when it says so, the commit happened (or may
                have) but the server did not confirm that it is on disk: the debit may stand, and
                nothing may be drawn on it.
        """
        statements = self._pending
        staged, self._tx_entry = self._tx_entry, None
        read, self._tx_read = self._tx_read, None
        self._pending, self._cache = [], None  # (kept again only after a confirmed commit)
        status = self._psycopg.pq.TransactionStatus
        if self.optimistic:
            statements = [_BEGIN] + statements
        elif self._conn.info.transaction_status != status.INTRANS:
            raise LedgerError("PostgreSQL ledger: the transaction was lost (its session ended) "
                              "before it committed; nothing was written")
        if not statements or statements == [_BEGIN]:  # (nothing written: nothing to make durable)
            if not self.optimistic:
                self._raw("COMMIT")
            return
        try:
            written = self._raw("; ".join(statements + ["COMMIT", _FLUSH]))[0][0]
        except LedgerError as exc:
            if self.optimistic and self._conn.info.transaction_status == status.INERROR:
                # Refused before the commit (most likely: another writer appended since the
                # cache): nothing was written; the gate redoes the debit on fresh reads.
                self._backoff = _BACKOFF
                raise LedgerStaleError(f"{exc} (an optimistic debit; redone)") from exc
            landed = self._landed_after(staged, exc)
            if landed is False:
                raise
            raise LedgerError(
                f"PostgreSQL ledger: the debit {'was' if landed else 'may have been'} committed "
                f"but the server did not confirm that it reached the disk ({exc}); nothing was "
                "drawn on it, and its budget stays spent") from exc
        if written == 1 and staged is not None and read is not None:
            self._cache = (staged, None, read)  # what this commit left: the next debit's start
        if written != 1:
            raise LedgerError(
                "PostgreSQL ledger: the debit was committed but the server did not confirm that "
                "it reached the disk (the flush wrote no row: dpbudget_flush is hidden or "
                "refused); nothing was drawn on it, and its budget stays spent")

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
        self._pending, self._tx_read, self._cache = [], None, None
        try:
            self._conn.execute("ROLLBACK")
        except self._psycopg.Error:
            pass  # the connection is broken; nothing was committed

    def account(self, key: str) -> Account | None:
        with self._lock:
            self._usable()
            return self._read_account(key)

    def accounts(self) -> list[Account]:
        with self._lock:
            self._usable()
        return super().accounts()

    def head(self) -> tuple[int, str]:
        with self._lock:
            self._usable()
            return self._head()

    def entry(self, seq: int) -> Entry | None:
        with self._lock:
            staged = self._tx_entry if self._tx_read is not None else None
            if staged is not None and staged.seq == seq:  # the head, read with the lock
                return staged
            self._usable()
        return super().entry(seq)

    def _reader(self) -> Any:
        return self._psycopg.connect(self.dsn, autocommit=True, client_encoding="UTF8",
                                     connect_timeout=max(2, math.ceil(self.timeout)))

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():  # a forked child leaves its parent's session alone
                self._conn.close()


# Sessions inherited through fork(): kept referenced so that their finalisers never run in the
# child (which would end the parent's session).
_INHERITED: list[Any] = []
