"""The PostgreSQL ledger's session: one connection per ledger object and process, with a bound on
every wait, durable commits, and statements sent several to a round trip with bound parameters.

Invariant: a process never touches a session another process opened (the ledger refuses a
forked child, ``Ledger._mine``; psycopg's finaliser leaves a connection of another process
alone); a session lost between transactions is replaced (its role is not checked: the server
refuses a record naming another role than the one logged in, unless that role is the owner's);
one cut off inside a round trip is closed, which makes the server roll back what it held and free
its locks.
"""

from __future__ import annotations

import math
import os
import select
from typing import Any

from dpbudget.accountant.values.errors import LedgerError

__all__ = ["Session"]


class Session:
    """A ledger object's connection (used under the ledger's lock: one statement at a time).

    Args:
        psycopg: the psycopg module.
        dsn: a libpq connection string or URL.
        timeout: seconds: the bound on a wait for a lock, a connection or a silent server.
    """

    def __init__(self, psycopg: Any, dsn: str, timeout: float) -> None:
        self._psycopg, self._dsn, self._timeout = psycopg, dsn, timeout
        self.role: str | None = None  # the role the first session logged in as (session_user)
        self.conn: Any = None
        self.pid = 0
        self.connect()

    def connect(self) -> None:
        """A new session: ``synchronous_commit = on`` whatever the role or database says (each
        COMMIT returns once on disk), ``lock_timeout`` on a wait for another writer's lock, and
        ``tcp_user_timeout`` and keepalives on a server that stopped answering.

        A session that replaces a lost one may log in as another role (a changed credential):
        the releases planned for the first role are then refused by the server's triggers (a
        record is the analyst's who logged in), or written as that first role's by the owner.

        Raises:
            psycopg.Error: the server cannot be reached.
        """
        ms = max(1, int(self._timeout * 1000))
        conn = self._psycopg.connect(
            self._dsn, autocommit=True, client_encoding="UTF8", prepare_threshold=None,
            connect_timeout=max(2, math.ceil(self._timeout)), keepalives=1,
            keepalives_idle=max(1, math.ceil(self._timeout / 3)),
            keepalives_interval=max(1, math.ceil(self._timeout / 9)), keepalives_count=3,
            tcp_user_timeout=ms)
        try:
            conn.execute("SET synchronous_commit = on")
            conn.execute(f"SET lock_timeout = {ms}")
            role = str(conn.execute("SELECT session_user").fetchone()[0])
        except BaseException:
            conn.close()
            raise
        self.conn, self.role, self.pid = conn, self.role or role, os.getpid()
        # SQL -> its prepared statement's name (``send``; psycopg prepares nothing of its own, as
        # it would deallocate every statement of the session after a ROLLBACK).
        self._prepared: dict[str, str] = {}
        self._named = 0

    def usable(self) -> bool:
        """Make the session alive, between transactions: one lost since its last use (a server
        restart, a dropped connection) is replaced, as nothing was in flight on it. True when it
        was replaced."""
        if not (self.conn.closed or self.conn.broken):
            return False
        try:
            self.connect()
        except self._psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger: cannot reconnect: {exc}") from exc
        return True

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open, and no statement of it failed."""
        return bool(self.conn.info.transaction_status
                    == self._psycopg.pq.TransactionStatus.INTRANS)

    def query(self, sql: str, args: Any = ()) -> list[Any]:
        """The rows of one statement.

        Raises:
            LedgerError: it failed.
        """
        try:
            return list(self.conn.execute(sql, args).fetchall())
        except self._psycopg.Error as exc:
            raise _error(exc) from exc

    def send(self, statements: list[tuple[str, tuple[Any, ...]]]) -> list[list[str | None]]:
        """Run ``statements`` (SQL with ``$n`` parameters, and their values: str or int) in one
        round trip, through libpq's pipeline mode (a debit's path: far less client work than a
        cursor per statement); the rows of the last one that returned rows, as text. The values
        are bound parameters, never part of the SQL text.

        Raises:
            LedgerError: a statement failed (those after it did not run), or the session broke
                (then it is left in pipeline mode, which ``rollback`` closes).
        """
        pq, pgconn = self._psycopg.pq, self.conn.pgconn
        last, error, state, fresh = None, None, None, []
        try:
            pgconn.enter_pipeline_mode()
            for sql, args in statements:
                # Each statement parsed and planned once per session (a name never reused: one
                # whose Prepare a failure made unknown here may exist on the server).
                name = self._prepared.get(sql)
                if name is None:
                    self._named += 1
                    name = self._prepared[sql] = f"dpbudget_{self._named}"
                    fresh.append(sql)
                    pgconn.send_prepare(name.encode(), sql.encode())
                pgconn.send_query_prepared(name.encode(), [str(a).encode() for a in args] or None)
            pgconn.pipeline_sync()
            for _ in range(len(statements) + len(fresh)):
                while (result := self._result()) is not None:
                    if result.status == pq.ExecStatus.TUPLES_OK:
                        last = result
                    elif result.status == pq.ExecStatus.FATAL_ERROR and error is None:
                        error = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"?"
                        state = result.error_field(pq.DiagnosticField.SQLSTATE)
                if pgconn.status == pq.ConnStatus.BAD:
                    raise self._psycopg.OperationalError("the connection was lost")
            result = self._result()
            if result is None or result.status != pq.ExecStatus.PIPELINE_SYNC:
                raise self._psycopg.OperationalError("the connection was lost")
            pgconn.exit_pipeline_mode()
        except BaseException as exc:
            self._forget(fresh)
            if isinstance(exc, self._psycopg.Error):
                raise _error(exc) from exc
            raise
        if error is not None:  # a plan DDL made stale (0A000) or a statement gone (26000): all anew
            self._forget(list(self._prepared) if state in (b"0A000", b"26000") else fresh)
            raise LedgerError(f"PostgreSQL ledger: {bytes(error).decode('utf-8', 'replace')}")
        if last is None:
            return []
        get = last.get_value
        return [[None if (v := get(r, c)) is None else bytes(v).decode()
                 for c in range(last.nfields)] for r in range(last.ntuples)]

    def _forget(self, fresh: list[str]) -> None:
        """Statements whose Prepare a failed round trip may not have run: prepared anew."""
        for sql in fresh:
            self._prepared.pop(sql, None)

    def _result(self) -> Any:
        """The next result, waited for in ``poll``, which lets other threads run meanwhile (libpq's
        own wait would hold the interpreter lock: a thread waiting for a lane's lock would stop
        the thread that holds it from committing)."""
        pgconn = self.conn.pgconn
        while pgconn.is_busy():
            poller = select.poll()  # (not select.select: it fails on descriptors >= 1024)
            poller.register(pgconn.socket, select.POLLIN)
            poller.poll()
            pgconn.consume_input()
        return pgconn.get_result()

    def rollback(self) -> None:
        """End whatever transaction this process's session has open, without committing it. A
        round trip an interrupt cut off is finished first (a sync sent, every result read), so
        that the ROLLBACK, and the release of the lanes' locks, is done when this returns; a
        session that fails that is closed (the server then rolls back and frees them itself)."""
        conn, status = self.conn, self._psycopg.pq.TransactionStatus
        if self.pid != os.getpid() or conn.closed:
            return  # (a forked child: the session is the parent's, never touched from here)
        pgconn = conn.pgconn
        try:
            if pgconn.pipeline_status:
                if pgconn.transaction_status == status.ACTIVE:  # (results still due)
                    pgconn.pipeline_sync()
                    while pgconn.transaction_status == status.ACTIVE:
                        self._result()
                pgconn.exit_pipeline_mode()
            if pgconn.transaction_status in (status.INTRANS, status.INERROR):
                conn.execute("ROLLBACK")
            elif pgconn.transaction_status != status.IDLE:
                conn.close()
        except BaseException as exc:
            conn.close()
            if not isinstance(exc, Exception):
                raise

    def reader(self) -> Any:
        """A connection of its own, for long reads that must not hold the ledger's lock."""
        return self._psycopg.connect(self._dsn, autocommit=True, client_encoding="UTF8",
                                     connect_timeout=max(2, math.ceil(self._timeout)))

    def close(self) -> None:
        if self.pid == os.getpid():  # a forked child leaves its parent's session alone
            self.conn.close()


def _error(exc: Any) -> LedgerError:
    """The server's (or psycopg's) primary message only: its detail and context may quote the
    record's text."""
    message = getattr(getattr(exc, "diag", None), "message_primary", None)
    return LedgerError(f"PostgreSQL ledger: {message or str(exc).strip() or type(exc).__name__}")


def shown(dsn: str) -> str:
    """``dsn`` as the ledger shows it (``url``: in errors, ``dpbudget status``, reports, the
    writers' logs): without its password, which a URL or a key=value string may hold."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # (the session's own connect reports it, typed)
        return "postgresql://(a DSN that does not parse)"
    secret = [k for k in params if "password" in k]  # (password, sslpassword)
    if not secret:
        return dsn
    return make_conninfo("", **{k: v for k, v in params.items() if k not in secret})

