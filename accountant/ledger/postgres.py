"""The PostgreSQL ledger: the scale-out backend, for many processes on many machines.

Same records, chain and account states as the SQLite ledger. Every check-and-debit is one
transaction that first takes a transaction-level advisory lock dedicated to this ledger, so writers
are serialised exactly as the hash chain requires (each record names the one before it), and the
lock is released by the COMMIT that makes the debit durable (``synchronous_commit`` is forced on
for the session). Records are append-only (a trigger refuses UPDATE and DELETE).

Needs the optional extra: ``pip install "dpbudget[postgres]"`` (psycopg 3).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

from accountant.errors import LedgerError
from accountant.ledger.base import EMPTY_HEAD, Account, Entry, Ledger
from accountant.ledger.record import FORMAT_VERSION

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


class PostgresLedger(Ledger):
    """A ledger in a PostgreSQL database. ``PostgresLedger("postgresql://user@host/db")``.

    Args:
        dsn: a libpq connection string or URL.
        hmac_key: chain new records with HMAC-SHA256 under this key (default: the environment
            variable ``DPBUDGET_LEDGER_KEY``, if set); see ``accountant.ledger.record``.

    Raises:
        LedgerError: psycopg is not installed, the server cannot be reached, or the database
            holds a ledger of another format version.
    """

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
                row = self._conn.execute(
                    "SELECT value FROM dpbudget_meta WHERE key = 'format'").fetchone()
                if row is None:
                    self._conn.execute("INSERT INTO dpbudget_meta VALUES ('format', %s)",
                                       (str(FORMAT_VERSION),))
        except psycopg.Error as exc:
            raise LedgerError(f"cannot open PostgreSQL ledger: {exc}") from exc
        if row is not None and row[0] != str(FORMAT_VERSION):
            raise LedgerError(f"the PostgreSQL ledger has record format {row[0]}; this version "
                              f"of dpbudget reads format {FORMAT_VERSION}")

    def _execute(self, sql: str, args: tuple = ()) -> Any:
        try:
            return self._conn.execute(sql, args)
        except self._psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger: {exc}") from exc

    def _begin(self) -> None:
        self._execute("BEGIN")
        self._execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))

    def _commit(self) -> None:
        self._execute("COMMIT")

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except self._psycopg.Error:
            pass  # the connection is broken; nothing was committed

    def _head(self) -> tuple[int, str]:
        row = self._execute(
            "SELECT seq, hash FROM dpbudget_entries ORDER BY seq DESC LIMIT 1").fetchone()
        return EMPTY_HEAD if row is None else (row[0], row[1])

    def _read_account(self, key: str) -> Account | None:
        row = self._execute("SELECT key, rule, config, state, seq FROM dpbudget_accounts "
                            "WHERE key = %s", (key,)).fetchone()
        return None if row is None else _account(row)

    def _write_entry(self, entry: Entry) -> None:
        self._execute("INSERT INTO dpbudget_entries (seq, hash, record) VALUES (%s, %s, %s)",
                      (entry.seq, entry.hash, entry.text))

    def _write_accounts(self, accounts: list[Account]) -> None:
        for a in accounts:
            self._execute(
                "INSERT INTO dpbudget_accounts VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) "
                "DO UPDATE SET rule = EXCLUDED.rule, config = EXCLUDED.config, "
                "state = EXCLUDED.state, seq = EXCLUDED.seq",
                (a.key, a.rule, json.dumps(a.config, sort_keys=True),
                 json.dumps(a.state, sort_keys=True), a.seq))

    def accounts(self) -> list[Account]:
        with self._lock:
            rows = self._execute("SELECT key, rule, config, state, seq FROM dpbudget_accounts "
                                 "ORDER BY key").fetchall()
        return [_account(r) for r in rows]

    def entries(self, start: int = 1) -> Iterator[Entry]:
        # A connection of its own, paged by primary key: streams without holding the lock.
        with self._psycopg.connect(self.dsn, autocommit=True) as conn:
            seq = start - 1
            while True:
                rows = conn.execute("SELECT seq, record, hash FROM dpbudget_entries WHERE seq > %s "
                                    "ORDER BY seq LIMIT 4096", (seq,)).fetchall()
                if not rows:
                    return
                for seq, text, digest in rows:
                    yield Entry(seq, text, digest)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _account(row: tuple) -> Account:
    key, rule, config, state, seq = row
    return Account(key, rule, json.loads(config), json.loads(state), seq)
