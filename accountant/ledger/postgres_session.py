"""The PostgreSQL ledger's session: one connection per process (never a parent's after
``fork()``), replaced when it was lost between transactions, with timeouts on every wait, and the
one-round-trip statement path every debit takes (``_raw``: libpq itself, literals escaped by
libpq). Used by ``dpbudget.accountant.ledger.postgres.PostgresLedger``."""

from __future__ import annotations

import math
import os
import select
from typing import Any

from dpbudget.accountant.errors import LedgerError
from dpbudget.accountant.ledger.entry import Account

__all__ = ["BACKEND", "SERVER", "PgSession", "readable"]

# Which server a session reached: its address, port and start time (a restart changes the last,
# in a form no session setting changes). A session after a restart, or elsewhere, is another
# server: it cannot flush this one's commits (``dpbudget.accountant.ledger.postgres_sync``).
SERVER = ("concat_ws(' ', inet_server_addr(), inet_server_port(), "
          "extract(epoch FROM pg_postmaster_start_time()))")
# Which backend serves a session: its process and when it started. A server that recovers from a
# crashed backend keeps its start time (the postmaster lives on: ``restart_after_crash``) but ends
# every session and loses what was not on disk; a session a pooler opens after that has a new
# backend, so a session's flush checks this too (``dpbudget.accountant.ledger.postgres_sync``).
BACKEND = ("concat_ws(' ', pg_backend_pid(), (SELECT extract(epoch FROM backend_start) FROM "
           "pg_stat_activity WHERE pid = pg_backend_pid()))")


class PgSession:
    """The session half of ``PostgresLedger`` (a mixin: it holds no ledger logic)."""

    _psycopg: Any
    _conn: Any
    _pid: int
    _lock: Any
    _tx_read: dict[str, Account | None] | None
    _server: str
    _role: str | None = None  # the role the first session logged in as (``_connect``)
    dsn: str
    timeout: float

    def _connect(self) -> None:
        """A new session: durable commits, and no wait without end. ``lock_timeout`` bounds the
        wait for another writer's lock; ``tcp_user_timeout`` and keepalives bound a wait on a
        server that stopped answering (a frozen server), where a server-side timeout cannot.

        The role it logged in as is read with the server's identity (no round trip of its own),
        once: a session replaced later must be the same role's, or the releases planned for the
        first would be recorded as someone else's (the server refuses them; this says why).
        """
        conn, server, role = self._session()
        if self._role is not None and role != self._role:
            conn.close()
            raise LedgerError("PostgreSQL ledger: the new session logged in as another role than "
                              "the one this ledger opened as; nothing was written. Open the "
                              "ledger again")
        self._conn, self._server, self._role = conn, server, role
        self._pid = os.getpid()

    @property
    def authenticated_analyst(self) -> str | None:
        """The role this ledger's session logged in as (``session_user``): the analyst every
        release through it is charged to (``Ledger.authenticated_analyst``). ``session_user``, not
        ``current_user``: ``SET ROLE`` (which any member of a role may run) changes only the
        latter, and ``SET SESSION AUTHORIZATION`` needs a superuser's login."""
        return self._role

    def _open_session(self) -> tuple[Any, str]:
        """A connection with the settings above (also the flushing session's,
        ``dpbudget.accountant.ledger.postgres_sync``), and which server it reached: its address, port and
        start time (a session elsewhere, or after a restart, cannot flush this one's commits)."""
        conn, server, _ = self._session()
        return conn, server

    def _session(self) -> tuple[Any, str, str]:
        """``_open_session``'s, and the role the session logged in as."""
        ms = max(1, int(self.timeout * 1000))
        conn = self._psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=max(2, math.ceil(self.timeout)),
            keepalives=1, keepalives_idle=max(1, math.ceil(self.timeout / 3)),
            keepalives_interval=max(1, math.ceil(self.timeout / 9)), keepalives_count=3,
            tcp_user_timeout=ms)
        # UTF-8 whatever the environment, role or database says: the debit path encodes its
        # statements as UTF-8 (``_raw``), and the text the server stores must be the text hashed.
        try:
            conn.execute("SET client_encoding = 'UTF8'")
            conn.execute("SET synchronous_commit = on")
            conn.execute(f"SET lock_timeout = {ms}")
            if conn.info.encoding != "utf-8":  # pragma: no cover - the SET above failed
                raise LedgerError("PostgreSQL ledger: the session does not speak UTF-8")
            row = conn.execute("SELECT " + SERVER + ", session_user").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn, str(row[0]), str(row[1])

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
            self._forked()
            self._reconnect()
        elif self._conn.closed or self._conn.broken:
            self._reconnect()

    def _forked(self) -> None:
        """Forget what this object knew in the parent process (``PostgresLedger`` overrides)."""

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

    def _pending_input(self) -> bool:
        """Whether the server said something unasked (a session it ended sends a notice, then
        closes): then the next debit starts with a round trip that finds out safely — nothing
        of an optimistic debit must be sent into a connection that may be gone, as it could
        not be told afterwards whether its commit ran."""
        return readable(self._conn)

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

    def _reader(self) -> Any:
        return self._psycopg.connect(self.dsn, autocommit=True, client_encoding="UTF8",
                                     connect_timeout=max(2, math.ceil(self.timeout)))

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():  # a forked child leaves its parent's session alone
                self._conn.close()


def readable(conn: Any) -> bool:
    """Whether the server said something unasked on ``conn`` (a session it ended sends a notice,
    then closes), or the connection failed."""
    try:
        poller = select.poll()  # (not select.select: it fails on descriptors >= 1024)
        poller.register(conn.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except Exception:  # (OSError, ValueError, a psycopg error: the connection is unusable)
        return True


# Sessions inherited through fork(): kept referenced so that their finalisers never run in the
# child (which would end the parent's session).
_INHERITED: list[Any] = []
