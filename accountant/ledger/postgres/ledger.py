"""``PostgresLedger``: a debit in two round trips, each commit on disk before it returns.

A debit is one transaction (``Ledger.transaction``). Its begin is one round trip (pipeline mode,
bound parameters): BEGIN; the lanes' advisory locks (``dpbudget.accountant.ledger.lanes``: exclusive on
the lanes it writes, shared on the policy's, in the order of their ids: no cycle of waits); then,
in a statement of its own (whose snapshot is taken once the locks are held), the lanes' last
records, the accounts, a number for the record and the server's clock (``rows.READS``). Its
commit is the other: the record (the server writes the account rows from it) and COMMIT, under ``synchronous_commit = on``
(``session``), so COMMIT returns once the record is on disk; the server groups concurrent commits
into one disk write itself. A transaction's time is the server's clock, never the caller's
(``rows.Tx``). Threads of a process take turns on the object's session; a process uses only
the objects it opened (``Ledger._mine``), and debits on different lanes run in parallel on the
server. Needs the optional
extra: ``pip install "dpbudget[postgres]"`` (psycopg 3).
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from dpbudget.accountant.values.errors import LedgerError, LedgerUnconfirmedError
from dpbudget.accountant.ledger.base import Account, Entry
from dpbudget.accountant.ledger.entry import account_row
from dpbudget.accountant.ledger.lanes import FORMAT, START
from dpbudget.accountant.ledger.postgres.rows import BEGIN, READS, Tx
from dpbudget.accountant.ledger.postgres.schema import lock_id, prepare, quote_ident
from dpbudget.accountant.ledger.postgres.session import Session, shown
from dpbudget.accountant.ledger.sql import SqlLedger

__all__ = ["PostgresLedger"]

# Taken while a ledger's tables are created or updated: two openers never run the DDL at once.
_LOCK_KEY = zlib.crc32(b"dpbudget-ledger")
_ENTRY = "INSERT INTO dpbudget_entries (seq, hash, record) VALUES ($1, $2, $3)"


class PostgresLedger(SqlLedger):
    """A ledger in a PostgreSQL database. ``PostgresLedger("postgresql://user@host/db")``.

    Args:
        dsn: a libpq connection string or URL.
        timeout: seconds to wait for another writer's lock, a connection or a silent server,
            before a typed ``LedgerError`` (nothing is written).
        hmac_key: chain new records with HMAC-SHA256 under this key (default: the environment
            variable ``DPBUDGET_LEDGER_KEY``, if set); see ``dpbudget.accountant.ledger.record``.
        create: create the tables where the database holds none; ``False`` refuses instead,
            with no DDL run (a reader, or a service, never makes an empty ledger).

    Raises:
        LedgerError: psycopg is missing, the server cannot be reached, the ledger has another
            format, or its tables or triggers are outdated and this role may not fix them, or
            are missing and ``create`` is False.
    """

    lanes = True
    appends_only = True  # (schema.sql's triggers)
    _tables, _marker = "dpbudget_", "%s"

    def __init__(self, dsn: str, *, timeout: float = 30.0,
                 hmac_key: bytes | str | None = None, create: bool = True) -> None:
        super().__init__(hmac_key=hmac_key)
        try:
            import psycopg
        except ImportError:
            raise LedgerError("the PostgreSQL ledger needs psycopg 3: "
                              'pip install "dpbudget[postgres]"') from None
        if not (isinstance(timeout, (int, float)) and 0.0 < timeout < math.inf):
            raise LedgerError(f"timeout must be a finite number of seconds > 0; got {timeout!r}")
        self.url, self.timeout = shown(dsn), float(timeout)
        self._salt: str | None = None  # read on the first transaction (only writers may)
        self._tx: Tx | None = None  # the open transaction
        self._anchor: tuple[int, int] | None = None  # (server µs, monotonic µs) at the last begin
        self._audited: list[Account] | None = None  # read with the last full entries()
        try:
            self._s = Session(psycopg, dsn, self.timeout)
            conn = self._s.conn
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                    schema = prepare(conn, psycopg, create)
                    row = conn.execute("SELECT value FROM dpbudget_meta WHERE key = 'format'"
                                       ).fetchone()
                    # (raised inside: the DDL rolled back)
                    self._refuse_format(None if row is None else row[0], FORMAT)
                    # A member of the tables' owner role may write any analyst's records (the
                    # triggers let it, asking as they do: current_user, on the table prepare
                    # found): such a session authenticates no analyst of its own.
                    self._owns = bool(conn.execute(
                        "SELECT pg_has_role(current_user, relowner, 'MEMBER') FROM pg_class "
                        "WHERE oid = %s::regclass",
                        (f"{quote_ident(schema)}.dpbudget_entries",)).fetchone()[0])
            except BaseException:
                conn.close()  # the caller never gets a handle that could close it
                raise
        except psycopg.Error as exc:
            raise LedgerError(f"cannot open PostgreSQL ledger: {exc}") from exc

    @property
    def authenticated_analyst(self) -> str | None:
        """The role this ledger's session logged in as (``session_user``, which ``SET ROLE`` does
        not change): the analyst every release through it is charged to — or None when that
        role (``current_user``, as the triggers ask) is a member of the role owning the
        ledger's tables — read once, when the ledger opened: a grant made later is not seen
        until it is opened again — which the server lets write any analyst's records: a query
        service connects so, and charges each query to its token's analyst."""
        return None if self._owns else self._s.role

    def _fetch(self, sql: str, args: Any = ()) -> list[Any]:
        """The rows of one statement on this object's session (in its transaction, if open)."""
        if self._tx is None:
            self._s.usable()
        return self._s.query(sql, args)

    def _disconnect(self) -> None:
        self._s.close()

    # -- transactions ---------------------------------------------------------------------------

    def _begin(self, prefetch: Sequence[str] = (), shared: Sequence[str] = ()) -> None:
        session = self._s
        session.usable()
        session.rollback()  # what an interrupt left open or half read: it never committed
        session.usable()
        if self._salt is None:
            self._salt = self._read_salt()
        read_only = [k for k in dict.fromkeys(shared) if k in prefetch]
        every = list(dict.fromkeys([*prefetch, *read_only]))
        modes = {lock_id(self._salt, k): "_shared" for k in read_only}
        modes.update((lock_id(self._salt, k), "") for k in every if k not in read_only)
        ids = sorted(modes)
        locks = "SELECT " + (", ".join(f"pg_advisory_xact_lock{modes[i]}(${n}::bigint)"
                                       for n, i in enumerate(ids, 1)) or "1")
        statements = [(BEGIN, ()), (locks, tuple(ids)), (READS, (json.dumps(every),))]
        try:
            rows = session.send(statements)
        except LedgerError:
            if not session.conn.broken:
                raise
            # The session died unseen since its last use: nothing ran; a new one starts afresh.
            session.usable()
            rows = session.send(statements)
        self._tx, self._tx_shared = Tx(prefetch, every, rows), read_only
        self._anchor = (self._tx.server, time.monotonic_ns() // 1000)

    def _read_salt(self) -> str:
        """The ledger's lock salt (``schema.lock_id``): without it this object's locks would not
        be the other writers'.

        Raises:
            LedgerError: this role cannot read it, or it is missing; nothing was written.
        """
        try:
            rows, why = self._s.query("SELECT salt FROM dpbudget_salt"), "it is missing"
        except LedgerError as exc:
            rows, why = [], str(exc).strip().splitlines()[0]
        if not rows or not rows[0][0]:
            raise LedgerError(f"PostgreSQL ledger: cannot read the ledger's lock salt "
                              f"(dpbudget_salt: {why}); a writer needs SELECT on it: the owner "
                              "runs grant_statements again after an upgrade. Nothing was written")
        return str(rows[0][0])

    def _tx_micros(self, head: tuple[int, str] | None) -> int:
        return self._open().micros

    def now(self) -> float:
        """The server's time, estimated from the last begin that read it (without a round trip);
        this process's wall clock before any has."""
        anchor = self._anchor
        if anchor is None:
            return time.time()
        return (anchor[0] + time.monotonic_ns() // 1000 - anchor[1]) / 1e6

    def _open(self) -> Tx:
        tx = self._tx
        if tx is None:
            raise LedgerError("PostgreSQL ledger: no transaction of this process is open; "
                              "nothing was written")
        return tx

    def _read_account(self, key: str) -> Account | None:
        tx = self._tx
        if tx is None:
            return super()._read_account(key)
        if key not in tx.read:
            # Not locked by this transaction: its lane is read in the same statement, so that the
            # link the record will carry is the one this state is from (the server refuses the
            # record if the lane moved since).
            rows = self._read(
                "SELECT a.key, a.rule, a.config, a.state, a.seq, l.seq, l.hash FROM (SELECT "
                "%s::text AS key) k LEFT JOIN dpbudget_accounts a ON a.key = k.key LEFT JOIN "
                "dpbudget_lanes l ON l.key = k.key", (key,))
            row = rows[0]
            tx.read[key] = None if row[0] is None else account_row(row[:5])
            tx.lanes.setdefault(key, START if row[5] is None else (row[5], row[6]))
        return tx.read[key]

    def _lane(self, key: str) -> tuple[int, str]:
        """``(seq, hash)`` of the last record on lane ``key`` (``lanes.START`` if none)."""
        tx = self._open()
        if key not in tx.lanes:  # not locked by this transaction: the server checks its link
            rows = self._read("SELECT seq, hash FROM dpbudget_lanes WHERE key = %s", (key,))
            tx.lanes[key] = (rows[0][0], rows[0][1]) if rows else START
        return tx.lanes[key]

    def _next_seq(self) -> int:
        """The seq the next record appended in this transaction gets (the same until then)."""
        tx = self._open()
        if tx.seq is None:
            tx.seq = int(self._read("SELECT nextval('dpbudget_seq')")[0][0])
        return tx.seq

    def _advance(self, keys: list[str], entry: Entry) -> None:
        """``entry``, just written, is now the last record on each of ``keys``."""
        tx = self._open()
        tx.lanes.update((key, (entry.seq, entry.hash)) for key in keys)
        tx.seq = None

    def _write_entry(self, entry: Entry) -> None:
        self._open().writes.append((_ENTRY, (entry.seq, entry.hash, entry.text)))

    def _write_accounts(self, accounts: list[Account]) -> None:
        # The server writes the rows from the record (schema.sql: dpbudget_entry_lanes).
        self._open().read.update((a.key, a) for a in accounts)

    def _commit(self) -> None:
        """Send the transaction's writes and COMMIT in one round trip; it returns once the
        commit is on disk (``synchronous_commit = on``).

        Raises:
            LedgerError: nothing was committed.
            LedgerUnconfirmedError: the session broke during the round trip: the commit may have
                happened; nothing may be drawn on it, and its budget stays spent.
        """
        tx, session = self._open(), self._s
        self._tx = None
        if not session.in_transaction:
            raise LedgerError("PostgreSQL ledger: the transaction was lost (its session ended) "
                              "before it committed; nothing was written")
        try:
            session.send([*tx.writes, ("COMMIT", ())])
        except LedgerError as exc:
            if tx.writes and session.conn.broken:
                raise LedgerUnconfirmedError(
                    f"PostgreSQL ledger: the session ended during the commit ({exc}); the debit "
                    "may have been committed: nothing was drawn on it, and its budget stays "
                    "spent") from exc
            raise

    def _rollback(self) -> None:
        self._tx = None
        self._s.rollback()

    # -- reads ----------------------------------------------------------------------------------

    def created_since(self, mark: Any = None) -> tuple[Any, list[str]]:
        # Every key, no state parsed: the table keeps no order of creation to start from.
        return None, [str(row[0]) for row in self._read("SELECT key FROM dpbudget_accounts")]

    def audited_accounts(self) -> list[Account]:
        audited, self._audited = self._audited, None  # (once: a later call reads afresh)
        return self.accounts() if audited is None else audited

    def entries(self, start: int = 1) -> Iterator[Entry]:
        """Records from ``start`` in ``seq`` order, paged on a connection of their own (which holds
        no lock), all in one snapshot: commits land out of ``seq`` order across lanes, and in one
        snapshot every record a visible record links to is visible too, so a live ledger reads as
        a closed one. From the first record, the account rows of the same snapshot are kept for
        ``audited_accounts`` (an audit compares the rows with the records)."""
        self._mine()
        with self._s.reader() as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

            def fetch(sql: str, args: tuple[Any, ...]) -> list[Any]:
                return list(conn.execute(sql, args).fetchall())

            if start == 1:
                self._audited = self._accounts(fetch)
            yield from self._pages(fetch, start)

    def _writer_key(self) -> str | None:
        """None: each object is a writer of its own (``dpbudget.accountant.ledger.writer``): two objects'
        transactions on other lanes run at once, and one count would number two records alike."""
        return None
