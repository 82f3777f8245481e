"""The PostgreSQL ledger: the scale-out backend, for many processes on many machines.

Same records and account states as the SQLite ledger, but linked per account (record format 2,
``dpbudget.accountant.ledger.lanes``) so that debits on different accounts append in parallel:
``ledger`` (``PostgresLedger``: the session and the debit), ``schema`` (the tables and the
server's triggers, ``schema.sql``; the grants of a deployment). The server guards the tables
itself, against clients that bypass dpbudget with raw SQL as well; the tables' owner creates
them, and processes that run the gate can open the ledger as a role that owns nothing
(docs/postgres-deployment.md).
"""

from dpbudget.accountant.ledger.postgres.ledger import PostgresLedger
from dpbudget.accountant.ledger.postgres.schema import grant_statements

__all__ = ["PostgresLedger", "grant_statements"]
