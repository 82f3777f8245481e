"""The PostgreSQL ledger's tables and the triggers that guard them on the server (``schema.sql``,
a resource of this package), and the grants of the recommended deployment.

Invariant: the triggers hold for any client and role, raw SQL included (only the owner can
disable them); what they refuse, and what they cannot check (an HMAC, the truth of a cost):
docs/postgres-deployment.md, "What the server enforces". The functions pin their ``search_path``.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from typing import Any

from dpbudget.accountant.values.errors import LedgerError

__all__ = ["SCHEMA_VERSION", "TRIGGERS", "ddl", "grant_statements", "lock_id", "prepare",
           "quote_ident"]

# Bumped whenever schema.sql changes, so that opening a ledger recreates functions and triggers
# written by an older version (only its owner can; ``prepare`` says so to anyone else).
SCHEMA_VERSION = "11"

# (table, trigger, when, for each, function): the DDL creates these, and the ledger is current
# only when all of them exist and are enabled.
_TRIGGERS = (
    ("dpbudget_entries", "dpbudget_entries_append_only", "BEFORE UPDATE OR DELETE", "ROW",
     "dpbudget_append_only"),
    ("dpbudget_entries", "dpbudget_entries_no_truncate", "BEFORE TRUNCATE", "STATEMENT",
     "dpbudget_append_only"),
    ("dpbudget_entries", "dpbudget_entries_chain", "BEFORE INSERT", "ROW",
     "dpbudget_entry_check"),
    # After the row is in: it writes the account rows and moves the lanes.
    ("dpbudget_entries", "dpbudget_entries_lanes", "AFTER INSERT", "ROW",
     "dpbudget_entry_lanes"),
    ("dpbudget_accounts", "dpbudget_accounts_match_record", "BEFORE INSERT OR UPDATE", "ROW",
     "dpbudget_account_check"),
    ("dpbudget_accounts", "dpbudget_accounts_no_delete", "BEFORE DELETE", "ROW",
     "dpbudget_append_only"),
    ("dpbudget_accounts", "dpbudget_accounts_no_truncate", "BEFORE TRUNCATE", "STATEMENT",
     "dpbudget_append_only"),
    # The lock salt is written once (``lock_id``): gates running with an older one would not wait
    # for a policy change made with a new one.
    ("dpbudget_salt", "dpbudget_salt_fixed", "BEFORE UPDATE OR DELETE", "ROW",
     "dpbudget_append_only"),
    ("dpbudget_salt", "dpbudget_salt_no_truncate", "BEFORE TRUNCATE", "STATEMENT",
     "dpbudget_append_only"),
)
TRIGGERS = tuple((table, name) for table, name, *_ in _TRIGGERS)
_TABLES = ("dpbudget_meta", "dpbudget_entries", "dpbudget_accounts", "dpbudget_lanes",
           "dpbudget_salt", "dpbudget_seq")


def quote_ident(name: str) -> str:
    """``name`` as a PostgreSQL identifier (always quoted, so any spelling is taken literally).

    Raises:
        LedgerError: not a non-empty string without NUL characters.
    """
    if not isinstance(name, str) or not name or "\0" in name:
        raise LedgerError("a PostgreSQL role or schema name must be a non-empty string without "
                          "NUL characters")
    return '"' + name.replace('"', '""') + '"'


def ddl(schema: str) -> str:
    """The statements that create (or bring up to date) a ledger's tables and triggers in
    ``schema``. Idempotent; only the tables' owner can run them once the tables exist."""
    triggers = "".join(
        f"DROP TRIGGER IF EXISTS {name} ON {{S}}.{table};\n"
        f"CREATE TRIGGER {name} {when} ON {{S}}.{table}\n"
        f"    FOR EACH {each} EXECUTE FUNCTION {{S}}.{function}();\n"
        for table, name, when, each, function in _TRIGGERS)
    if "$" in schema:  # the server functions' bodies are dollar-quoted: a name must not end one
        raise LedgerError(f"PostgreSQL ledger: a schema name with '$' is not supported "
                          f"({len(schema)} characters); nothing was created")
    name = quote_ident(schema)
    literal = "'" + name.replace("'", "''") + "'"  # (the quoted name, as an SQL string)
    text = resources.files(__package__).joinpath("schema.sql").read_text("utf-8").replace(
        "{TRIGGERS}", triggers)
    # Filled in one pass, so a value is never searched for {S}-style markers again: a schema
    # named "a{S}');..." stays inside its quotes.
    fill = {"{S_LITERAL}": literal, "{S}": name, "{V}": SCHEMA_VERSION}
    return re.sub(r"\{S_LITERAL\}|\{S\}|\{V\}", lambda m: fill[m.group(0)], text)


def grant_statements(owner_role: str, writer_role: str, reader_role: str, *,
                     schema: str = "public") -> list[str]:
    """The grants of the recommended deployment (docs/postgres-deployment.md), as SQL statements
    for the owner (or a superuser) to run once the owner has created the ledger.

    ``owner_role`` owns the schema's ledger tables, functions and triggers; ``writer_role`` is the
    role of the processes that run the gate (it can read and append entries, nothing else: the
    server writes the lanes and account rows); ``reader_role`` (auditors) can only read. Roles must exist.

    Raises:
        LedgerError: a name that is empty or holds a NUL character, or the same role given
            twice.
    """
    if len({owner_role, writer_role, reader_role}) != 3:
        raise LedgerError("grant_statements needs three different roles: the writer and the "
                          "readers must not own the ledger's tables")
    s, owner = quote_ident(schema), quote_ident(owner_role)
    writer, reader = quote_ident(writer_role), quote_ident(reader_role)
    tables = [f"{s}.dpbudget_{t}" for t in ("meta", "entries", "accounts", "lanes")]
    salt = f"{s}.dpbudget_salt"  # (the writers' only: see ``lock_id``)
    functions = [f"{s}.dpbudget_{f}()" for f in ("append_only", "entry_check", "account_check",
                                                 "entry_lanes")]
    return [f"ALTER TABLE {t} OWNER TO {owner}" for t in [*tables, salt]] + [
        f"ALTER SEQUENCE {s}.dpbudget_seq OWNER TO {owner}",
    ] + [
        f"ALTER FUNCTION {f} OWNER TO {owner}" for f in functions
    ] + [
        # Creating objects in the ledger's schema would let a role shadow what it resolves to.
        f"REVOKE CREATE ON SCHEMA {s} FROM PUBLIC, {writer}, {reader}",
        f"GRANT USAGE ON SCHEMA {s} TO {writer}, {reader}",
        f"REVOKE ALL ON {', '.join([*tables, salt])} FROM PUBLIC, {writer}, {reader}",
        f"GRANT SELECT ON {salt} TO {writer}",
        f"REVOKE ALL ON FUNCTION {', '.join(functions)} FROM PUBLIC, {writer}, {reader}",
        f"REVOKE ALL ON SEQUENCE {s}.dpbudget_seq FROM PUBLIC, {writer}, {reader}",
        # Lanes and accounts are written only by the trigger, as the owner. Taking numbers
        # (``nextval``) is harmless: they need only grow along each lane, and a record's must
        # have been taken.
        f"GRANT USAGE, SELECT ON SEQUENCE {s}.dpbudget_seq TO {writer}",
        f"GRANT SELECT ON {s}.dpbudget_meta, {s}.dpbudget_lanes, {s}.dpbudget_accounts "
        f"TO {writer}",
        f"GRANT SELECT, INSERT ON {s}.dpbudget_entries TO {writer}",
        f"GRANT SELECT ON {', '.join(tables)} TO {reader}",
    ]


def prepare(conn: Any, psycopg: Any, create: bool = True) -> str:
    """Create the tables and triggers on ``conn``, or bring them up to date, when they are not
    current. Only the owner of the tables may (re)create their triggers, so the DDL runs only
    when needed: a writer role that owns nothing opens a current ledger without touching it.
    "Current" is judged from the server's catalog: a disabled or dropped trigger, or an unlogged
    table, makes the ledger outdated again. ``create=False``: where there are no tables, refuse
    before any DDL.

    Returns:
        The schema holding the ledger's tables.

    Raises:
        LedgerError: not current, and this role may not make it so (or no schema to create in);
            no tables and ``create`` False.
    """
    # An existing ledger is upgraded where it is, even when that is not the first schema of the
    # search_path (where a new one is created).
    found = _value(conn, "SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
                   "ON n.oid = c.relnamespace WHERE c.oid = to_regclass('dpbudget_entries')")
    if found is not None and _current(conn):
        return str(found)
    info = conn.info
    where = f"(database {info.dbname!r} as role {info.user!r})"  # (never a password)
    if found is None and not create:
        raise LedgerError(f"cannot open PostgreSQL ledger {where}: it holds no ledger "
                          "(no dpbudget_entries table on the search_path); nothing was created")
    schema = found if found is not None else _value(conn, "SELECT current_schema()")
    if schema is None:
        raise LedgerError(f"cannot open PostgreSQL ledger {where}: no schema of the search_path "
                          "exists to create its tables in")
    try:
        conn.execute(ddl(schema))
    except psycopg.errors.InsufficientPrivilege:
        raise LedgerError(
            f"cannot open PostgreSQL ledger {where}: its tables or the triggers that guard them "
            "are missing, unlogged or made by an older version of dpbudget, and this role may "
            "not set them right. The ledger's owner must open it once with this version "
            "(docs/postgres-deployment.md); nothing was written") from None
    return str(schema)


def _current(conn: Any) -> bool:
    # Each table exists and is written to the log ('p'): rows of an unlogged one do not survive a
    # crash, and a commit that wrote only such tables would not wait for the disk.
    if _value(conn, "SELECT count(*) FROM unnest(%s::text[]) u(t) JOIN pg_class c ON c.oid = "
              "to_regclass(u.t) WHERE c.relpersistence = 'p'", (list(_TABLES),)) != len(_TABLES):
        return False
    if _value(conn, "SELECT value FROM dpbudget_meta WHERE key = 'schema'") != SCHEMA_VERSION:
        return False
    # 'O' and 'A': the trigger fires in ordinary sessions ('D' disabled, 'R' replicas only).
    enabled = _value(
        conn, "SELECT count(*) FROM pg_trigger g JOIN unnest(%s::text[], %s::text[]) u(t, n) "
        "ON g.tgrelid = to_regclass(u.t) AND g.tgname = u.n WHERE g.tgenabled IN ('O', 'A')",
        ([t for t, _ in TRIGGERS], [n for _, n in TRIGGERS]))
    return bool(enabled == len(TRIGGERS))


def _value(conn: Any, sql: str, args: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row of a query, or None."""
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


def lock_id(salt: str, key: str) -> int:
    """A lane's advisory lock: 64 bits of BLAKE2b of its key, keyed by the ledger's salt (ledgers
    in one database do not share locks, and a role that cannot read the salt cannot name the
    locks to hold them; a collision only makes two lanes wait for each other)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8,
                             key=salt.encode("utf-8")[:64]).digest()
    return int.from_bytes(digest, "big", signed=True)
