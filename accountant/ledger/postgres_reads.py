"""The PostgreSQL ledger's reads outside a transaction (a mixin of
``dpbudget.accountant.ledger.postgres.PostgresLedger``): each on this process's live session, and an
audit's records and rows in one snapshot."""

from __future__ import annotations

from typing import Any

from dpbudget.accountant.ledger.entry import Account, Entry
from dpbudget.accountant.ledger.postgres_lanes import check_rows
from dpbudget.accountant.ledger.sql import SqlLedger, _account

__all__ = ["PgReads"]



class PgReads:
    """Reads of ``PostgresLedger``: the ledger and session attributes are the ledger's, and the
    reads it makes durable-ledger-wide are ``SqlLedger``'s (next in its order of bases)."""

    _lock: Any
    _audited: list[Account] | None
    _tx_read: dict[str, Account | None] | None
    _tx_entry: Entry | None

    def _ledger(self) -> Any:
        return self  # (a PostgresLedger: typed Any here, where the mixin cannot say so)

    def audited_accounts(self) -> list[Account]:
        audited, self._audited = self._audited, None  # (once: a later call reads afresh)
        return self.accounts() if audited is None else audited

    def check_accounts(self) -> None:
        SqlLedger.check_accounts(self._ledger())
        with self._lock:
            self._ledger()._usable()
            check_rows(self)

    def account(self, key: str) -> Account | None:
        with self._lock:
            self._ledger()._usable()
            account: Account | None = self._ledger()._read_account(key)
            return account

    def accounts(self) -> list[Account]:
        with self._lock:
            self._ledger()._usable()
        return SqlLedger.accounts(self._ledger())

    def head(self) -> tuple[int, str]:
        with self._lock:
            self._ledger()._usable()
            head: tuple[int, str] = self._ledger()._head()
            return head

    def entry(self, seq: int) -> Entry | None:
        with self._lock:
            staged = self._tx_entry if self._tx_read is not None else None
            if staged is not None and staged.seq == seq:  # written by this transaction
                return staged
            self._ledger()._usable()
        return SqlLedger.entry(self._ledger(), seq)

    def _reading(self, conn: Any, start: int) -> None:
        """All of ``entries()`` in one snapshot: commits land out of ``seq`` order across lanes,
        and in one snapshot every record a visible record links to is visible too (its writer
        committed first), so a live ledger reads as a closed one. An audit compares the rows
        with the records: they are read in the same snapshot (``audited_accounts``)."""
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if start == 1:
            self._audited = [_account(r) for r in conn.execute(
                "SELECT key, rule, config, state, seq FROM dpbudget_accounts ORDER BY key")]
