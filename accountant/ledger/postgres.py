"""The PostgreSQL ledger: the scale-out backend, for many processes on many machines.

Same records, chain and account states as the SQLite ledger. Every check-and-debit is one
transaction that first takes a transaction-level advisory lock dedicated to this ledger, so writers
are serialised exactly as the hash chain requires (each record names the one before it), and the
lock is released by the COMMIT that makes the debit durable (``synchronous_commit`` is forced on
for the session). Records are append-only (a trigger refuses UPDATE and DELETE).

Needs the optional extra: ``pip install "dpbudget[postgres]"`` (psycopg 3).
"""

from __future__ import annotations

import zlib
from typing import Any

from accountant.errors import LedgerError
from accountant.ledger.sql import SqlLedger

__all__ = ["PostgresLedger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dpbudget_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dpbudget_entries (
    seq BIGINT PRIMARY KEY, hash TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dpbudget_accounts (
    key TEXT PRIMARY KEY, rule TEXT NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL,
    seq BIGINT NOT NULL);
CREATE OR REPLACE FUNCTION dpbudget_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'ledger entries are append-only'; END $$;
DROP TRIGGER IF EXISTS dpbudget_entries_append_only ON dpbudget_entries;
CREATE TRIGGER dpbudget_entries_append_only BEFORE UPDATE OR DELETE ON dpbudget_entries
    FOR EACH ROW EXECUTE FUNCTION dpbudget_append_only();
"""
# One advisory lock key per ledger kind; per-database, so ledgers in different databases are
# independent.
_LOCK_KEY = zlib.crc32(b"dpbudget-ledger")


class PostgresLedger(SqlLedger):
    """A ledger in a PostgreSQL database. ``PostgresLedger("postgresql://user@host/db")``.

    Args:
        dsn: a libpq connection string or URL.
        hmac_key: chain new records with HMAC-SHA256 under this key (default: the environment
            variable ``DPBUDGET_LEDGER_KEY``, if set); see ``accountant.ledger.record``.

    Raises:
        LedgerError: psycopg is not installed, the server cannot be reached, or the database
            holds a ledger of another format version.
    """

    _P = "%s"
    _T = "dpbudget_"

    def __init__(self, dsn: str, *, hmac_key: bytes | str | None = None) -> None:
        super().__init__(hmac_key=hmac_key)
        try:
            import psycopg
        except ImportError:
            raise LedgerError("the PostgreSQL ledger needs psycopg 3: "
                              'pip install "dpbudget[postgres]"') from None
        self._psycopg = psycopg
        self.dsn = dsn
        self.url = dsn
        try:
            self._conn = psycopg.connect(dsn, autocommit=True)
            self._conn.execute("SET synchronous_commit = on")
            with self._conn.transaction():
                self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                self._conn.execute(_SCHEMA)
                self._check_format()
        except psycopg.Error as exc:
            raise LedgerError(f"cannot open PostgreSQL ledger: {exc}") from exc

    def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        try:
            return self._conn.execute(sql, args)
        except self._psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger: {exc}") from exc

    def _begin(self) -> None:
        if self._conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
            self._rollback()  # a transaction an interrupt left open: it never committed
        self._execute("BEGIN")
        self._execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except self._psycopg.Error:
            pass  # the connection is broken; nothing was committed

    def _reader(self) -> Any:
        return self._psycopg.connect(self.dsn, autocommit=True)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

