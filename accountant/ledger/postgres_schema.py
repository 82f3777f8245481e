"""The PostgreSQL ledger's tables, the triggers that guard them on the server, and the grants of a
deployment in which analysts cannot write the ledger except through the gate
(docs/postgres-deployment.md).

The triggers hold for any client, including one that bypasses dpbudget with raw SQL:

- ``entries`` is append-only (no UPDATE, DELETE or TRUNCATE), and an inserted record must be the
  next link of the chain: its ``seq`` is the last one + 1, its ``prev`` is the hash stored for the
  last one (``GENESIS`` for the first), an unkeyed record's hash is its SHA-256, and no account it
  lists has a state below the stored one; a policy record (the limits in force) is accepted only
  from a member of the tables' owner role, so the owner sets the policy and writers cannot;
- an ``accounts`` row, inserted or updated, holds exactly the rule, configuration and state that
  the record at its ``seq`` lists for its key; its ``seq`` never goes back, no component of its
  state goes down, and rows are never deleted (no DELETE or TRUNCATE).

They cannot check an HMAC (the key never reaches the server) nor that a record's cost is what was
really spent: a writer can still append a well-formed, correctly linked record whose states grow.

Each check is a primary-key lookup plus the parsing of one record (the triggers run on every
debit). The functions pin their ``search_path`` so that a session cannot redirect their lookups to
tables or functions of its own (a temporary table named ``dpbudget_entries``, say).
"""

from __future__ import annotations

from typing import Any

from accountant.errors import LedgerError

__all__ = ["SCHEMA_VERSION", "TRIGGERS", "ddl", "grant_statements", "prepare", "quote_ident"]

# Bumped whenever the DDL below changes, so that opening a ledger recreates functions and triggers
# written by an older version (only its owner can; ``PostgresLedger`` says so to anyone else).
SCHEMA_VERSION = "4"

# (table, trigger, when, for each, function): the DDL creates these, and the ledger is current
# only when all of them exist and are enabled.
_TRIGGERS = (
    ("dpbudget_entries", "dpbudget_entries_append_only", "UPDATE OR DELETE", "ROW",
     "dpbudget_append_only"),
    ("dpbudget_entries", "dpbudget_entries_no_truncate", "TRUNCATE", "STATEMENT",
     "dpbudget_append_only"),
    ("dpbudget_entries", "dpbudget_entries_chain", "INSERT", "ROW", "dpbudget_entry_check"),
    ("dpbudget_accounts", "dpbudget_accounts_match_record", "INSERT OR UPDATE", "ROW",
     "dpbudget_account_check"),
    ("dpbudget_accounts", "dpbudget_accounts_no_delete", "DELETE", "ROW",
     "dpbudget_append_only"),
    ("dpbudget_accounts", "dpbudget_accounts_no_truncate", "TRUNCATE", "STATEMENT",
     "dpbudget_append_only"),
)
TRIGGERS = tuple((table, name) for table, name, *_ in _TRIGGERS)

_DDL = """
CREATE TABLE IF NOT EXISTS {S}.dpbudget_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {S}.dpbudget_entries (
    seq BIGINT PRIMARY KEY, hash TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {S}.dpbudget_accounts (
    key TEXT PRIMARY KEY, rule TEXT NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL,
    seq BIGINT NOT NULL);
-- Rows the writers update after each asynchronous commit, to wait until it is on disk
-- (accountant.ledger.postgres): what they hold means nothing.
CREATE TABLE IF NOT EXISTS {S}.dpbudget_flush (slot INT PRIMARY KEY, n BIGINT NOT NULL);
INSERT INTO {S}.dpbudget_flush SELECT g, 0 FROM generate_series(0, 63) g ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION {S}.dpbudget_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'dpbudget ledger: % on % refused: ledger entries are append-only and '
        'accounts are never removed', TG_OP, TG_TABLE_NAME USING ERRCODE = 'check_violation';
END $$;

CREATE OR REPLACE FUNCTION {S}.dpbudget_entry_check() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, {S}, pg_temp AS $$
DECLARE
    v_rec jsonb;
    v_accounts jsonb;
    v_last bigint;
    v_prev text;
    v_key text;
BEGIN
    -- Each statement that reads a table costs a round through the executor, so there are two:
    -- everything else is a simple expression.
    v_rec := NEW.record::jsonb;
    IF jsonb_typeof(v_rec) IS DISTINCT FROM 'object' OR v_rec->'seq' IS DISTINCT FROM
            to_jsonb(NEW.seq) THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its record is not an object with '
            'that seq', NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    -- max(seq) by a backward scan of the primary key. A concurrent writer's uncommitted entry is
    -- not seen here, but it holds that seq: the primary key refuses the second one.
    SELECT seq, hash INTO v_last, v_prev FROM dpbudget_entries ORDER BY seq DESC LIMIT 1;
    IF NOT FOUND THEN
        v_last := 0;
        v_prev := repeat('0', 64);
    END IF;
    IF NEW.seq <> v_last + 1 THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: the next entry is %', NEW.seq,
            v_last + 1 USING ERRCODE = 'check_violation';
    END IF;
    IF v_rec->'prev' IS DISTINCT FROM to_jsonb(v_prev) THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its prev is not the hash of entry %',
            NEW.seq, v_last USING ERRCODE = 'check_violation';
    END IF;
    IF length(NEW.hash) <> 64 OR ltrim(NEW.hash, '0123456789abcdef') <> '' THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its hash is not 64 hex digits',
            NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    -- The limits are the owner's: a policy record (a new policy in force) may come only from a
    -- member of the role that owns the ledger's tables, never from a writer (a forged record
    -- raising the limits would otherwise be a well-formed, correctly linked append).
    IF v_rec->>'kind' = 'policy' AND NOT pg_has_role(current_user,
            (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: only the ledger''s owner writes '
            'policy records', NEW.seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    CASE coalesce(v_rec->>'auth', 'sha256')
        WHEN 'sha256' THEN
            IF NEW.hash <> encode(sha256(convert_to(NEW.record, 'UTF8')), 'hex') THEN
                RAISE EXCEPTION 'dpbudget ledger: entry % refused: its hash is not the SHA-256 '
                    'of its record', NEW.seq USING ERRCODE = 'check_violation';
            END IF;
        WHEN 'hmac-sha256' THEN
            NULL;  -- the key is not on the server: only an audit with the key checks it
        ELSE
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: unknown auth', NEW.seq
                USING ERRCODE = 'check_violation';
    END CASE;
    v_accounts := coalesce(v_rec->'accounts', '{}');
    IF jsonb_typeof(v_accounts) <> 'object' THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its accounts are not an object',
            NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    IF v_accounts <> '{}' THEN
        -- OFFSET 0 keeps one primary-key lookup per listed account, whatever the planner
        -- estimates for jsonb_each (a hash join would scan every account).
        SELECT a.key INTO v_key FROM jsonb_each(v_accounts) a,
            LATERAL (SELECT s.state FROM dpbudget_accounts s WHERE s.key = a.key OFFSET 0) s,
            LATERAL jsonb_each(s.state::jsonb) o
            WHERE CASE WHEN jsonb_typeof(a.value->'state'->o.key) = 'number'
                       AND jsonb_typeof(o.value) = 'number'
                  THEN (a.value->'state'->o.key)::numeric < o.value::numeric ELSE true END
            LIMIT 1;
        IF v_key IS NOT NULL THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: it lists account % with a state '
                'below the stored one', NEW.seq, v_key USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION {S}.dpbudget_account_check() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, {S}, pg_temp AS $$
DECLARE
    v_acct jsonb;
    v_state jsonb;
    v_bad text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.key IS DISTINCT FROM OLD.key THEN
            RAISE EXCEPTION 'dpbudget ledger: account %: its key cannot change', OLD.key
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.seq < OLD.seq THEN
            RAISE EXCEPTION 'dpbudget ledger: account % refused: its seq would go back from % '
                'to %', NEW.key, OLD.seq, NEW.seq USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    -- The entry is written before its accounts, in the same transaction (accountant.ledger.sql).
    SELECT record::jsonb->'accounts'->NEW.key INTO v_acct FROM dpbudget_entries
        WHERE seq = NEW.seq;
    IF jsonb_typeof(v_acct) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'dpbudget ledger: account % refused: entry % does not record it',
            NEW.key, NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    v_state := NEW.state::jsonb;
    IF v_acct->'state' IS DISTINCT FROM v_state OR jsonb_typeof(v_state) <> 'object' THEN
        RAISE EXCEPTION 'dpbudget ledger: account % refused: its state is not the one entry % '
            'records', NEW.key, NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    -- The rule's configuration decides how a state is read (a rule's state parameters).
    IF NEW.rule IS DISTINCT FROM v_acct->>'rule'
            OR NEW.config::jsonb - 'rule' IS DISTINCT FROM v_acct - 'state' - 'rule' THEN
        RAISE EXCEPTION 'dpbudget ledger: account % refused: its rule or configuration is not '
            'the one entry % records', NEW.key, NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    IF jsonb_path_exists(v_state, 'strict $.* ? (@.type() != "number" || @ < 0)') THEN
        RAISE EXCEPTION 'dpbudget ledger: account % refused: its state is not made of numbers '
            '>= 0', NEW.key USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.state <> OLD.state THEN
        SELECT o.key INTO v_bad FROM jsonb_each(OLD.state::jsonb) o
            WHERE CASE WHEN jsonb_typeof(v_state->o.key) = 'number'
                       AND jsonb_typeof(o.value) = 'number'
                  THEN (v_state->o.key)::numeric < o.value::numeric ELSE true END
            LIMIT 1;
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION 'dpbudget ledger: account % refused: its state % would decrease (a '
                'refund)', NEW.key, v_bad USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- Trigger functions only ever run as triggers; nobody needs to call them.
REVOKE ALL ON FUNCTION {S}.dpbudget_append_only(), {S}.dpbudget_entry_check(),
    {S}.dpbudget_account_check() FROM PUBLIC;

{TRIGGERS}
INSERT INTO {S}.dpbudget_meta VALUES ('schema', '{V}')
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
"""


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
        f"CREATE TRIGGER {name} BEFORE {when} ON {{S}}.{table}\n"
        f"    FOR EACH {each} EXECUTE FUNCTION {{S}}.{function}();\n"
        for table, name, when, each, function in _TRIGGERS)
    return _DDL.replace("{TRIGGERS}", triggers).replace("{S}", quote_ident(schema)).replace(
        "{V}", SCHEMA_VERSION)


def grant_statements(owner_role: str, writer_role: str, reader_role: str, *,
                     schema: str = "public") -> list[str]:
    """The grants of the recommended deployment (docs/postgres-deployment.md), as SQL statements
    for the owner (or a superuser) to run once the owner has created the ledger.

    ``owner_role`` owns the schema's ledger tables, functions and triggers; ``writer_role`` is the
    role of the processes that run the gate (it can read, append entries, and insert and update
    accounts, nothing else); ``reader_role`` (auditors) can only read. Roles must exist.

    Raises:
        LedgerError: a name that is empty or holds a NUL character, or the same role given
            twice.
    """
    if len({owner_role, writer_role, reader_role}) != 3:
        raise LedgerError("grant_statements needs three different roles: the writer and the "
                          "readers must not own the ledger's tables")
    s, owner = quote_ident(schema), quote_ident(owner_role)
    writer, reader = quote_ident(writer_role), quote_ident(reader_role)
    tables = [f"{s}.dpbudget_{t}" for t in ("meta", "entries", "accounts", "flush")]
    functions = [f"{s}.dpbudget_{f}()" for f in ("append_only", "entry_check", "account_check")]
    return [f"ALTER TABLE {t} OWNER TO {owner}" for t in tables] + [
        f"ALTER FUNCTION {f} OWNER TO {owner}" for f in functions
    ] + [
        # Creating objects in the ledger's schema would let a role shadow what it resolves to.
        f"REVOKE CREATE ON SCHEMA {s} FROM PUBLIC, {writer}, {reader}",
        f"GRANT USAGE ON SCHEMA {s} TO {writer}, {reader}",
        f"REVOKE ALL ON {', '.join(tables)} FROM PUBLIC, {writer}, {reader}",
        f"REVOKE ALL ON FUNCTION {', '.join(functions)} FROM PUBLIC, {writer}, {reader}",
        f"GRANT SELECT ON {s}.dpbudget_meta TO {writer}",
        f"GRANT SELECT, INSERT ON {s}.dpbudget_entries TO {writer}",
        # Not the key column: an account's key never changes (the trigger refuses it as well).
        f"GRANT SELECT, INSERT, UPDATE (rule, config, state, seq) ON {s}.dpbudget_accounts "
        f"TO {writer}",
        # The rows a writer updates to wait for the disk (``PostgresLedger._commit``).
        f"GRANT SELECT, INSERT, UPDATE (n) ON {s}.dpbudget_flush TO {writer}",
        f"GRANT SELECT ON {', '.join(tables)} TO {reader}",
    ]


def prepare(conn: Any, psycopg: Any) -> None:
    """Create the tables and triggers on ``conn``, or bring them up to date, when they are not
    current.

    Only the owner of the tables may (re)create their triggers, so the DDL runs only when it is
    needed: a writer role that owns nothing opens a current ledger without touching it. "Current"
    is judged from the server's catalog, not trusted from a flag alone: a disabled or dropped
    trigger makes the ledger outdated again.

    Raises:
        LedgerError: not current, and this role may not make it so (or no schema to create in).
    """
    if _current(conn):
        return
    # An existing ledger is upgraded where it is, even when that is not the first schema of the
    # search_path (where a new one is created).
    schema = _value(conn, "SELECT coalesce((SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE c.oid = to_regclass('dpbudget_entries')), "
                    "current_schema())")
    info = conn.info
    where = f"(database {info.dbname!r} as role {info.user!r})"  # (never a password)
    if schema is None:
        raise LedgerError(f"cannot open PostgreSQL ledger {where}: no schema of the search_path "
                          "exists to create its tables in")
    try:
        conn.execute(ddl(schema))
    except psycopg.errors.InsufficientPrivilege:
        raise LedgerError(
            f"cannot open PostgreSQL ledger {where}: its tables or the triggers that guard them "
            "are missing or were made by an older version of dpbudget, and this role may not "
            "create them. The ledger's owner must open it once with this version "
            "(docs/postgres-deployment.md); nothing was written") from None


def _current(conn: Any) -> bool:
    if _value(conn, "SELECT to_regclass('dpbudget_meta') IS NOT NULL AND to_regclass("
              "'dpbudget_entries') IS NOT NULL AND to_regclass('dpbudget_accounts') IS NOT NULL "
              "AND to_regclass('dpbudget_flush') IS NOT NULL") is not True:
        return False
    if _value(conn, "SELECT value FROM dpbudget_meta WHERE key = 'schema'") != SCHEMA_VERSION:
        return False
    # 'O' and 'A': the trigger fires in ordinary sessions ('D' disabled, 'R' replicas only).
    enabled = _value(
        conn, "SELECT count(*) FROM pg_trigger WHERE tgenabled IN ('O', 'A') AND ("
        "(tgrelid = to_regclass('dpbudget_entries') AND tgname = ANY(%s)) OR "
        "(tgrelid = to_regclass('dpbudget_accounts') AND tgname = ANY(%s)))",
        ([n for t, n in TRIGGERS if t == "dpbudget_entries"],
         [n for t, n in TRIGGERS if t == "dpbudget_accounts"]))
    return bool(enabled == len(TRIGGERS))


def _value(conn: Any, sql: str, args: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row of a query, or None."""
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]
