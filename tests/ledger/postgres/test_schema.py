"""The PostgreSQL deployment of docs/postgres-deployment.md, against the real server the test
session starts: an owner role creates the ledger, the gate runs as a writer role that owns nothing,
an auditor role only reads. Raw SQL as the writer, bypassing dpbudget, cannot rewrite, shorten,
break or refund the ledger: each attempt is refused by the server and leaves the ledger as it was
and auditing clean. What the server accepts from a writer (a record with a made-up HMAC, a record
understating its cost) leaves the ledger open and is flagged by the audit (issue 32)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, LedgerError, PolicyChangedError,
)
from dpbudget.accountant.audit.release import LibraryRecords
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.accountant.ledger.postgres.schema import grant_statements
from dpbudget.accountant.ledger.record import canonical, record_hash
from dpbudget.accountant.values.errors import LedgerCorruptedError, PrivacyError
from dpbudget.mechanisms import Gaussian, Laplace
from tests.support import OWNER

pytestmark = pytest.mark.postgres


class Deployment:
    """Three roles and a schema owned by the owner, holding a ledger with a few releases."""

    def __init__(self, database: str) -> None:
        tag = uuid.uuid4().hex[:10]
        self.superuser = database
        self.schema = f"ledger_{tag}"
        self.owner, self.writer, self.auditor = (f"{r}_{tag}" for r in ("own", "gate", "audit"))
        with psycopg.connect(database, autocommit=True) as conn:
            for role in (self.owner, self.writer, self.auditor):
                conn.execute(f'CREATE ROLE "{role}" LOGIN')
            conn.execute(f'CREATE SCHEMA "{self.schema}" AUTHORIZATION "{self.owner}"')
        PostgresLedger(self.dsn(self.owner)).close()  # the owner creates the tables
        with psycopg.connect(self.dsn(self.owner), autocommit=True) as conn:
            for statement in grant_statements(self.owner, self.writer, self.auditor,
                                              schema=self.schema):
                conn.execute(statement)

    def dsn(self, role: str | None = None) -> str:
        """A DSN logging in as ``role`` (the superuser by default), searching the schema."""
        base = self.superuser
        if role is not None:
            base = base.replace("//dpbudget@", f"//{role}@", 1)
        return f"{base}?options=-csearch_path%3D{self.schema}"

    def rows(self) -> tuple[list[Any], list[Any]]:
        """Every record and account row, read by the superuser."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            entries = conn.execute("SELECT seq, hash, record FROM dpbudget_entries "
                                   "ORDER BY seq").fetchall()
            accounts = conn.execute("SELECT key, rule, config, state, seq FROM "
                                    "dpbudget_accounts ORDER BY key").fetchall()
        return entries, accounts

    def drop(self) -> None:
        with psycopg.connect(self.superuser, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            for role in (self.owner, self.writer, self.auditor):
                conn.execute(f'DROP OWNED BY "{role}"')
                conn.execute(f'DROP ROLE "{role}"')


@pytest.fixture
def deployment(postgres_database: str) -> Iterator[Deployment]:
    made = Deployment(postgres_database)
    # The owner sets the policy, pinning the owner key (policy changes are signed with it).
    Accountant(Budget(10.0), ledger=made.dsn(made.owner), owner_key=OWNER).close()
    acc = Accountant(Budget(10.0), ledger=made.dsn(made.writer))
    for _ in range(3):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    acc.close()
    try:
        yield made
    finally:
        made.drop()


def _forged(conn: psycopg.Connection[Any], *, seq_offset: int = 1, prev: str | None = None,
            scale: float = 1.0, base: int | None = None) -> tuple[int, str, str]:
    """A record built like the gate's from the last one (or record ``base``): next seq (plus
    ``seq_offset - 1``), linked to the last hash unless ``prev`` is given, with every account's
    state multiplied by ``scale``. Returns (seq, hash, text) for an INSERT."""
    last_seq, last_hash = conn.execute("SELECT seq, hash FROM dpbudget_entries ORDER BY seq "
                                       "DESC LIMIT 1").fetchone()  # type: ignore[misc]
    text = conn.execute("SELECT record FROM dpbudget_entries WHERE seq = %s",
                        (last_seq if base is None else base,)).fetchone()[0]  # type: ignore[index]
    record = json.loads(text)
    record["seq"] = last_seq + seq_offset
    if "links" in record:  # linked per account: to each lane's last record, or to ``prev``
        for lane in record["links"]:
            head = conn.execute("SELECT seq, hash FROM dpbudget_lanes WHERE key = %s",
                                (lane,)).fetchone()
            assert head is not None
            record["links"][lane] = [head[0], head[1]] if prev is None else [last_seq, prev]
    else:
        record["prev"] = last_hash if prev is None else prev
    for account in record["accounts"].values():
        account["state"] = {k: v * scale for k, v in account["state"].items()}
    text = canonical(record)
    return record["seq"], record_hash(text), text


def _forked(conn: psycopg.Connection[Any]) -> tuple[int, str, str]:
    """A well-formed record linking to the lanes' last records but one: a second successor
    of a record that already has one on its lane (a fork, or an insertion before the last)."""
    seq, text = conn.execute("SELECT seq, record FROM dpbudget_entries ORDER BY seq DESC "
                             "LIMIT 1").fetchone()  # type: ignore[misc]
    record = json.loads(text)
    assert "links" in record
    record["seq"] = seq + 1  # the old links, with a new number and a grown state
    for account in record["accounts"].values():
        account["state"] = {k: v * 2 for k, v in account["state"].items()}
    text = canonical(record)
    return record["seq"], record_hash(text), text


def _insert(conn: psycopg.Connection[Any], row: tuple[int, str, str]) -> None:
    conn.execute("INSERT INTO dpbudget_entries (seq, hash, record) VALUES (%s, %s, %s)", row)


def _dataset_account(conn: psycopg.Connection[Any]) -> tuple[str, str, int]:
    """(key, state, seq) of the account the releases were charged to (not the policy pointer)."""
    row = conn.execute("SELECT key, state, seq FROM dpbudget_accounts WHERE key <> 'policy' "
                       "ORDER BY seq DESC LIMIT 1").fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _rewind(conn: psycopg.Connection[Any]) -> None:
    """Point the account back at an earlier record, with exactly the state that record wrote."""
    key, _, seq = _dataset_account(conn)
    text = conn.execute("SELECT record FROM dpbudget_entries WHERE seq = %s",
                        (seq - 1,)).fetchone()[0]  # type: ignore[index]
    state = json.loads(text)["accounts"][key]["state"]
    conn.execute("UPDATE dpbudget_accounts SET state = %s, seq = %s WHERE key = %s",
                 (canonical(state), seq - 1, key))


def _refund_through_two_records(conn: psycopg.Connection[Any]) -> None:
    """Two linked records that each grow past the stored state, the second less than the first;
    moving the account to the first and then to the second would lower it."""
    key = _dataset_account(conn)[0]
    _insert(conn, _forged(conn, scale=2.0))
    _insert(conn, _forged(conn, scale=0.75))  # 1.5x the stored state, below the 2x just written
    first = json.loads(conn.execute("SELECT record FROM dpbudget_entries ORDER BY seq DESC "
                                    "OFFSET 1 LIMIT 1").fetchone()[0])  # type: ignore[index]
    conn.execute("UPDATE dpbudget_accounts SET state = %s, seq = %s WHERE key = %s",
                 (canonical(first["accounts"][key]["state"]), first["seq"], key))
    second = json.loads(conn.execute("SELECT record FROM dpbudget_entries ORDER BY seq DESC "
                                     "LIMIT 1").fetchone()[0])  # type: ignore[index]
    conn.execute("UPDATE dpbudget_accounts SET state = %s, seq = %s WHERE key = %s",
                 (canonical(second["accounts"][key]["state"]), second["seq"], key))


def _shadow_with_temp_table(conn: psycopg.Connection[Any], schema: str) -> None:
    """A temporary table named like the ledger's comes first on the session's search_path; a
    trigger that looked its table up there would accept a forged link."""
    forged = _forged(conn, prev="f" * 64)
    conn.execute("CREATE TEMP TABLE dpbudget_entries (seq BIGINT, hash TEXT, record TEXT)")
    conn.execute("INSERT INTO pg_temp.dpbudget_entries VALUES (%s, %s, '{}')",
                 (forged[0] - 1, "f" * 64))
    conn.execute(f'INSERT INTO "{schema}".dpbudget_entries VALUES (%s, %s, %s)', forged)


def _lower_component(conn: psycopg.Connection[Any]) -> None:
    key, state, _ = _dataset_account(conn)
    lowered = {k: v * 0.5 for k, v in json.loads(state).items()}
    conn.execute("UPDATE dpbudget_accounts SET state = %s WHERE key = %s",
                 (canonical(lowered), key))



def _appended(conn: psycopg.Connection[Any], edit: Callable[[dict[str, Any]], None],
              number: tuple[str, str] = ("", "")) -> None:
    """As a writer may (the review's attacks): the last record again, numbered from the
    sequence, ``edit``-ed, linked to the last record of each of its lanes, then appended, with
    ``number[0]`` written as ``number[1]`` (a number ``canonical`` does not write)."""
    record = json.loads(conn.execute("SELECT record FROM dpbudget_entries ORDER BY seq DESC "
                                     "LIMIT 1").fetchone()[0])  # type: ignore[index]
    record.pop("writer", None)  # (a copied count would read as a reordered writer)
    record["seq"] = conn.execute("SELECT nextval('dpbudget_seq')").fetchone()[0]  # type: ignore[index]
    edit(record)
    for lane in record["links"]:
        head = conn.execute("SELECT seq, hash FROM dpbudget_lanes WHERE key = %s",
                            (lane,)).fetchone()
        record["links"][lane] = [head[0], head[1]] if head else [0, "0" * 64]
    text = canonical(record).replace(*number)
    _insert(conn, (record["seq"], record_hash(text), text))


def _list_the_policy_account(record: dict[str, Any]) -> None:
    """Finding 2: a release record listing the policy pointer at its current row (rule, state),
    which would move the pointer to a record that holds no policy: every gate locked out."""
    record["accounts"]["policy"] = {"rule": "policy", "state": {}}
    record["links"]["policy"] = None
    record.get("reads", {}).pop("policy", None)
    if not record.get("reads"):
        record.pop("reads", None)


def _each_dataset_account(change: Callable[[dict[str, Any]], None]) -> Callable[
        [dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        for key, account in record["accounts"].items():
            if key != "policy":
                change(account)
    return edit


def _update_accounts_from_a_temp_trigger(conn: psycopg.Connection[Any], d: Deployment) -> None:
    """Finding 5: a writer still holding the UPDATE on accounts that grants from before ee6834b
    gave, its own trigger on a table of its own (depth 2, as the writer) zeroing the rows."""
    with psycopg.connect(d.dsn(d.owner), autocommit=True) as owner:
        owner.execute(f'GRANT UPDATE ON dpbudget_accounts TO "{d.writer}"')  # a stale grant
    conn.execute("CREATE TEMP TABLE t (x int)")
    conn.execute("CREATE FUNCTION pg_temp.f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "UPDATE dpbudget_accounts SET state = '{\"epsilon\": 0.0, \"delta\": 0.0}' "
                 "WHERE key <> 'policy'; RETURN NEW; END $$")
    conn.execute("CREATE TRIGGER tt AFTER INSERT ON pg_temp.t FOR EACH ROW EXECUTE FUNCTION "
                 "pg_temp.f()")
    conn.execute("INSERT INTO pg_temp.t VALUES (1)")


ATTACKS: dict[str, Callable[[psycopg.Connection[Any], Deployment], None]] = {
    "update-entry": lambda c, d: c.execute(
        "UPDATE dpbudget_entries SET record = record || ' ' WHERE seq = (SELECT min(seq) FROM "
        "dpbudget_entries WHERE seq > 1)"),
    "delete-last-entry": lambda c, d: c.execute(
        "DELETE FROM dpbudget_entries WHERE seq = (SELECT max(seq) FROM dpbudget_entries)"),
    "truncate-entries": lambda c, d: c.execute("TRUNCATE dpbudget_entries"),
    # (Skipping a number is no attack in a ledger of lanes: numbers need only grow along each
    # lane, and a refused debit leaves a gap. A wrong link is one; see insert-a-fork.)
    "insert-with-wrong-prev": lambda c, d: _insert(c, _forged(c, prev="f" * 64)),
    "insert-with-wrong-hash": lambda c, d: _insert(c, _forged(c)[:1] + ("0" * 64,)
                                                   + _forged(c)[2:]),
    "insert-lowering-a-state": lambda c, d: _insert(c, _forged(c, scale=0.5)),
    "insert-linked-through-a-temp-table": lambda c, d: _shadow_with_temp_table(c, d.schema),
    "set-account-to-zero": lambda c, d: c.execute(
        "UPDATE dpbudget_accounts SET state = '{\"delta\":0.0,\"epsilon\":0.0}' "
        "WHERE key <> 'policy'"),
    "lower-a-component": lambda c, d: _lower_component(c),
    "rewind-account-to-an-earlier-record": lambda c, d: _rewind(c),
    "refund-through-two-linked-records": lambda c, d: _refund_through_two_records(c),
    "rename-account": lambda c, d: c.execute(
        "UPDATE dpbudget_accounts SET key = key || '-old' WHERE key <> 'policy'"),
    "insert-unrecorded-account": lambda c, d: c.execute(
        "INSERT INTO dpbudget_accounts VALUES ('dataset:new', 'basic', '{}', '{}', 1)"),
    "delete-account": lambda c, d: c.execute("DELETE FROM dpbudget_accounts"),
    "truncate-accounts": lambda c, d: c.execute("TRUNCATE dpbudget_accounts"),
    "drop-table": lambda c, d: c.execute("DROP TABLE dpbudget_entries"),
    "disable-triggers": lambda c, d: c.execute(
        "ALTER TABLE dpbudget_accounts DISABLE TRIGGER dpbudget_accounts_match_record"),
    "replace-trigger-function": lambda c, d: c.execute(
        "CREATE OR REPLACE FUNCTION dpbudget_account_check() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN RETURN NEW; END $$"),
    "create-own-trigger": lambda c, d: c.execute(
        "CREATE TRIGGER mine BEFORE INSERT ON dpbudget_entries FOR EACH ROW EXECUTE FUNCTION "
        "suppress_redundant_updates_trigger()"),
    "replica-mode-skips-triggers": lambda c, d: c.execute(
        "SET session_replication_role = replica"),
    "write-meta": lambda c, d: c.execute(
        "UPDATE dpbudget_meta SET value = '1' WHERE key = 'schema'"),
    # Rewinding a lane would let a second record link where one already does (a fork).
    "move-a-lane": lambda c, d: c.execute("UPDATE dpbudget_lanes SET seq = 0"),
    "insert-a-lane": lambda c, d: c.execute(
        "INSERT INTO dpbudget_lanes VALUES ('dataset:new', 0, repeat('0', 64))"),
    "rewind-the-numbering": lambda c, d: c.execute("SELECT setval('dpbudget_seq', 1)"),
    "insert-a-fork": lambda c, d: _insert(c, _forked(c)),
    # The storage review's findings 2-5.
    "list-the-policy-account": lambda c, d: _appended(c, _list_the_policy_account),
    "a-state-number-above-a-double": lambda c, d: _appended(c, _each_dataset_account(
        lambda a: a["state"].update(epsilon=12345.5)), ("12345.5", "1e400")),
    "change-an-account-rule": lambda c, d: _appended(c, _each_dataset_account(
        lambda a: a.update(rule="bogus"))),
    "update-accounts-from-a-temp-trigger": _update_accounts_from_a_temp_trigger,
}

# What the triggers refuse by themselves, whatever the grants: even the owner cannot.
BY_TRIGGERS = [a for a in ATTACKS if a not in (
    "drop-table", "disable-triggers", "replace-trigger-function", "create-own-trigger",
    "replica-mode-skips-triggers", "write-meta", "move-a-lane", "insert-a-lane",
    "rewind-the-numbering",
    # The owner's to do: it moves the policy pointer, and may change a rule or run triggers.
    "list-the-policy-account", "change-an-account-rule", "update-accounts-from-a-temp-trigger")]


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_raw_sql_as_the_writer_is_refused(deployment: Deployment, attack: str,
                                          role: str = "writer") -> None:
    before = deployment.rows()
    with psycopg.connect(deployment.dsn(getattr(deployment, role))) as conn:  # one transaction
        with pytest.raises(psycopg.Error):
            ATTACKS[attack](conn, deployment)
        conn.rollback()
    assert deployment.rows() == before
    report = audit(deployment.dsn(deployment.auditor))
    assert report.ok, [p.message for p in report.problems]
    # ... and the gate still works afterwards.
    acc = Accountant.open(deployment.dsn(deployment.writer))
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    acc.close()
    assert audit(deployment.dsn(deployment.auditor)).ok


@pytest.mark.parametrize("attack", BY_TRIGGERS)
def test_the_triggers_refuse_it_even_for_the_owner(deployment: Deployment, attack: str) -> None:
    test_raw_sql_as_the_writer_is_refused(deployment, attack, role="owner")


def test_the_gate_runs_as_the_writer(deployment: Deployment) -> None:
    acc = Accountant(Budget(10.0), ledger=deployment.dsn(deployment.writer))
    for _ in range(5):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    assert acc.spent().epsilon == pytest.approx(4.0)
    acc.close()
    report = audit(deployment.dsn(deployment.auditor))
    assert report.ok and report.records == 9  # the policy record and eight releases


def test_the_auditor_reads_but_cannot_write(deployment: Deployment) -> None:
    assert audit(deployment.dsn(deployment.auditor)).ok
    with psycopg.connect(deployment.dsn(deployment.auditor)) as conn:  # nor hold the lane locks
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT salt FROM dpbudget_salt")
    before = deployment.rows()
    with psycopg.connect(deployment.dsn(deployment.auditor)) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            _insert(conn, _forged(conn))
    acc = Accountant.open(deployment.dsn(deployment.auditor))
    with pytest.raises(LedgerError, match="permission denied"):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    acc.close()
    assert deployment.rows() == before


@pytest.mark.parametrize("outdate", [
    "ALTER TABLE dpbudget_entries DISABLE TRIGGER dpbudget_entries_chain",
    "DROP TRIGGER dpbudget_accounts_no_delete ON dpbudget_accounts",
    "DELETE FROM dpbudget_meta WHERE key = 'schema'",  # a ledger made by an older version
])
def test_a_non_owner_refuses_a_ledger_without_its_triggers(deployment: Deployment,
                                                            outdate: str) -> None:
    with psycopg.connect(deployment.dsn(deployment.owner), autocommit=True) as conn:
        conn.execute(outdate)
    for role in (deployment.writer, deployment.auditor):
        with pytest.raises(LedgerError, match="owner must open it"):
            PostgresLedger(deployment.dsn(role))
    PostgresLedger(deployment.dsn(deployment.owner)).close()  # the owner brings it up to date
    test_raw_sql_as_the_writer_is_refused(deployment, "set-account-to-zero")
    acc = Accountant.open(deployment.dsn(deployment.writer))
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    acc.close()


def test_grant_statements_need_three_roles() -> None:
    with pytest.raises(LedgerError, match="three different roles"):
        grant_statements("a", "a", "b")
    with pytest.raises(LedgerError, match="role or schema name"):
        grant_statements("a", "b", "")
    assert any('"we""ird"' in s for s in grant_statements("o", 'we"ird', "r"))


def test_a_writer_cannot_raise_the_limits_by_appending_a_policy_record(
        deployment: Deployment) -> None:
    """The forged record is well formed and correctly linked; only its author is wrong."""
    before = deployment.rows()
    with psycopg.connect(deployment.dsn(deployment.writer), autocommit=True) as conn:
        _, last_hash = conn.execute("SELECT seq, hash FROM dpbudget_entries ORDER BY seq "
                                           "DESC LIMIT 1").fetchone()  # type: ignore[misc]
        text = conn.execute("SELECT record FROM dpbudget_entries WHERE seq = 1").fetchone()[0]  # type: ignore[index]
        record = json.loads(text)
        assert record["kind"] == "policy"
        record["policy"]["default"]["limit"]["epsilon"] = 1e6
        seq = conn.execute("SELECT nextval('dpbudget_seq')").fetchone()[0]  # type: ignore[index]
        record.update(seq=seq, prev=last_hash)
        forged = canonical(record)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="owner writes policy"):
            _insert(conn, (seq, record_hash(forged), forged))
    assert deployment.rows() == before
    with Accountant.open(deployment.dsn(deployment.writer)) as acc:
        assert acc.remaining("default").epsilon <= 10.0


def test_the_owner_applies_a_new_policy_and_writers_follow_it(deployment: Deployment) -> None:
    from dpbudget.policies.policy import Policy

    def policy(epsilon: float) -> Policy:
        return Policy.model_validate({"datasets": {"default": {"limit": {"epsilon": epsilon}}}})

    with Accountant.open(deployment.dsn(deployment.writer)) as stale:
        with Accountant.open(deployment.dsn(deployment.owner)) as owner:
            owner.apply_policy(policy(2.0), by="owner", reason="lower", owner_key=OWNER)
        with pytest.raises(PolicyChangedError):
            stale.release(Laplace(0.5, sensitivity=1.0), 1.0)
    with Accountant.open(deployment.dsn(deployment.writer)) as acc:
        assert acc.remaining("default") == Budget(0.5)  # 1.5 of 2.0 spent
        with pytest.raises(LedgerError, match="owner writes policy"):
            acc.apply_policy(policy(9.0), by="writer", reason="raise it", owner_key=OWNER)
    assert audit(deployment.dsn(deployment.auditor)).ok


def test_a_writer_without_the_lock_salt_is_refused_and_writes_nothing(
        deployment: Deployment) -> None:
    """Grants from before the salt existed: without it, a writer's lane locks would not be the
    other writers' (a policy change would not wait for its debits), so it is refused, typed."""
    with psycopg.connect(deployment.dsn(deployment.owner), autocommit=True) as conn:
        conn.execute(f'REVOKE SELECT ON dpbudget_salt FROM "{deployment.writer}"')
    before = deployment.rows()
    acc = Accountant.open(deployment.dsn(deployment.writer))
    with pytest.raises(LedgerError, match="lock salt"):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    acc.close()
    assert deployment.rows() == before


# Issue 32: what the server accepts from a writer, and what then reports it.

def _append_forged_hmac(deployment: Deployment) -> int:
    """As the writer, raw SQL: a third release of 0.5 like the two before it, at the next number,
    linked to each lane's last record, its state grown by its cost (1.0 to 1.5), its HMAC made
    up (no key): the server cannot check it and accepts it, and moves the rows of its accounts
    to it. Returns its seq."""
    with psycopg.connect(deployment.dsn(deployment.writer)) as conn:
        seq, _, text = _forged(conn, seq_offset=0, scale=1.5)
        record = json.loads(text)
        (seq,) = conn.execute("SELECT nextval('dpbudget_seq')").fetchone()  # type: ignore[misc]
        record["seq"] = seq
        record.pop("writer", None)  # (a copied count would read as a reordered writer)
        assert record["auth"] == "hmac-sha256"
        text = canonical(record)
        _insert(conn, (seq, record_hash(text, b"not the key"), text))
        conn.commit()  # (the server's trigger moves the rows of its accounts to it)
    return int(seq)


@pytest.fixture
def keyed(postgres_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    """A deployment whose gate and auditor hold the HMAC key, with a few releases."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", "the key")
    made = Deployment(postgres_database)
    Accountant(Budget(10.0), ledger=made.dsn(made.owner), owner_key=OWNER).close()
    with Accountant(Budget(10.0), ledger=made.dsn(made.writer)) as acc:
        for _ in range(2):
            acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    try:
        yield made
    finally:
        made.drop()


def test_a_record_with_a_fake_hmac_leaves_the_ledger_open_and_is_flagged(
        keyed: Deployment) -> None:
    forged = _append_forged_hmac(keyed)
    with pytest.warns(RuntimeWarning, match=rf"records \[{forged}\] do not verify"):
        acc = Accountant.open(keyed.dsn(keyed.owner))
    acc.close()
    with pytest.warns(RuntimeWarning):
        acc = Accountant.open(keyed.dsn(keyed.writer))
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)  # linked to the forged record
    assert acc.spent().epsilon == pytest.approx(2.0)  # (the forged record's 0.5 counts)
    acc.close()
    report = audit(keyed.dsn(keyed.auditor))
    assert report.exit_status == 128, [p.message for p in report.problems]
    assert [(p.kind, p.seq) for p in report.problems] == [("auth", forged)]
    assert report.verified == report.records - 1  # the records after it verify


def test_negative_control_the_open_that_demanded_every_hmac_is_locked_out(
        keyed: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old behaviour: any row naming a record the key does not verify refuses the open,
    whoever opens it: one writer's forged append locked everyone out of the ledger."""
    _append_forged_hmac(keyed)
    monkeypatch.setattr(PostgresLedger, "appends_only", False)
    for role in (keyed.owner, keyed.writer):
        with pytest.raises(LedgerCorruptedError):
            Accountant.open(keyed.dsn(role))


def _understated(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's own gate, its Laplace altered to record ten times the ε it was charged:
    a release record of ``Laplace`` whose cost (0.5) is a tenth of what its recorded parameters
    (ε = 5) give, and whose chain, states and rows are otherwise exactly the gate's."""
    honest = Laplace.params
    with monkeypatch.context() as patch:
        patch.setattr(Laplace, "params",
                      lambda self: {**honest(self), "epsilon": self.epsilon * 10})
        with Accountant.open(deployment.dsn(deployment.writer)) as acc:
            acc.release(Laplace(0.5, sensitivity=1.0), 1.0)


def test_a_record_that_understates_its_cost_is_flagged(deployment: Deployment,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _understated(deployment, monkeypatch)
    report = audit(deployment.dsn(deployment.auditor))
    assert report.exit_status == 16, [p.message for p in report.problems]
    (problem,) = report.problems
    assert "cost" in problem.message and "Laplace" in problem.message


def test_negative_control_an_audit_trusting_the_declared_cost_passes_it(
        deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    _understated(deployment, monkeypatch)
    monkeypatch.setattr(LibraryRecords, "check", lambda self, record, seeded_ok: None)
    report = audit(deployment.dsn(deployment.auditor))
    assert report.ok, [p.message for p in report.problems]  # consistent otherwise: unseen


def _append_at_twice_the_state(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    """As a writer may: a number from the sequence, then a correctly linked record charging the
    dataset's account at twice its state, and no write of the account row. (key, its seq)."""
    key = _dataset_account(conn)[0]
    seq = conn.execute("SELECT nextval('dpbudget_seq')").fetchone()[0]  # type: ignore[index]
    last = conn.execute("SELECT max(seq) FROM dpbudget_entries").fetchone()[0]  # type: ignore[index]
    _insert(conn, _forged(conn, seq_offset=seq - last, scale=2.0))
    return key, seq


def _epsilons_along(deployment: Deployment, key: str) -> list[float]:
    """The ε of account ``key`` in each record that lists it, in seq order."""
    records = [json.loads(text) for _, _, text in deployment.rows()[0]]
    return [r["accounts"][key]["state"]["epsilon"] for r in records
            if key in r.get("accounts", {})]


def test_an_account_row_never_lags_behind_its_lane(deployment: Deployment) -> None:
    """F1: a writer's correctly linked record charging twice the state, the account row left
    alone, is accepted (it spends the writer's own budget) and the server moves the row to it:
    the gate's next debit builds on it, never below it (which would read as a refund)."""
    with psycopg.connect(deployment.dsn(deployment.writer), autocommit=True) as conn:
        key, seq = _append_at_twice_the_state(conn)
        row = conn.execute("SELECT state, seq FROM dpbudget_accounts WHERE key = %s",
                           (key,)).fetchone()
    assert row is not None and row[1] == seq and json.loads(row[0])["epsilon"] == 3.0
    with Accountant.open(deployment.dsn(deployment.writer)) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
        assert acc.spent().epsilon == pytest.approx(3.5)  # 2 x 1.5, then 0.5
    epsilons = _epsilons_along(deployment, key)
    assert epsilons[-2:] == [3.0, 3.5] and epsilons == sorted(epsilons)


def test_a_row_left_behind_its_lane_is_read_as_a_refund(deployment: Deployment) -> None:
    """Negative control of the test above: the old behaviour (the row left where it was, here
    by the owner with the row trigger off) puts the gate's record below the forged one."""
    with psycopg.connect(deployment.dsn(deployment.writer), autocommit=True) as conn:
        key, old_state, old_seq = _dataset_account(conn)
        _append_at_twice_the_state(conn)
    with psycopg.connect(deployment.dsn(deployment.owner), autocommit=True) as conn:
        conn.execute("ALTER TABLE dpbudget_accounts DISABLE TRIGGER "
                     "dpbudget_accounts_match_record")
        conn.execute("UPDATE dpbudget_accounts SET state = %s, seq = %s WHERE key = %s",
                     (old_state, old_seq, key))
        conn.execute("ALTER TABLE dpbudget_accounts ENABLE TRIGGER "
                     "dpbudget_accounts_match_record")
    with Accountant.open(deployment.dsn(deployment.writer)) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    assert _epsilons_along(deployment, key)[-2:] == [3.0, 2.0]


# The storage review's finding 1: a 'renyi' account's order, raised by a writer, read the same
# Rényi cost r0 as less spent.

def _until_refused(acc: Accountant, most: int = 1000) -> int:
    """How many releases of the same Gaussian ``acc`` answers before refusing (at most ``most``)."""
    for n in range(most):
        try:
            acc.release(Gaussian(0.1, delta=1e-7, sensitivity=1.0), 1.0)
        except BudgetExceededError:
            return n
    return most


def _raise_the_order(record: dict[str, Any]) -> None:
    for account in record["accounts"].values():
        if "order" in account["state"]:
            assert 0 < account["state"]["order"] < 256
            account["state"]["order"] = 256.0


@pytest.fixture
def renyi_spent(postgres_database: str) -> Iterator[Deployment]:
    """A deployment whose 'renyi' limit (1, 1e-6) the writer's gate has spent: 159 releases."""
    made = Deployment(postgres_database)
    limit = Budget(1.0, 1e-6)
    Accountant(limit, composition="renyi", ledger=made.dsn(made.owner), owner_key=OWNER).close()
    with Accountant(limit, composition="renyi", ledger=made.dsn(made.writer)) as acc:
        assert _until_refused(acc) == 159
    try:
        yield made
    finally:
        made.drop()


def test_a_writer_cannot_raise_a_renyi_order(renyi_spent: Deployment) -> None:
    made, before = renyi_spent, renyi_spent.rows()
    with psycopg.connect(made.dsn(made.writer)) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="another order"):
            _appended(conn, _raise_the_order)
    assert made.rows() == before
    with Accountant.open(made.dsn(made.writer)) as acc:
        assert _until_refused(acc) == 0
    assert audit(made.dsn(made.auditor)).ok


def test_negative_control_a_raised_order_overspends(renyi_spent: Deployment) -> None:
    """The old check (each member of the state does not go down; here the entry check off):
    the same record is accepted, and the gate answers past the limit."""
    made = renyi_spent
    with psycopg.connect(made.dsn(made.owner), autocommit=True) as conn:
        conn.execute("ALTER TABLE dpbudget_entries DISABLE TRIGGER dpbudget_entries_chain")
    with psycopg.connect(made.dsn(made.writer)) as conn:
        _appended(conn, _raise_the_order)
        conn.commit()
    with psycopg.connect(made.dsn(made.owner), autocommit=True) as conn:
        conn.execute("ALTER TABLE dpbudget_entries ENABLE TRIGGER dpbudget_entries_chain")
    with Accountant.open(made.dsn(made.writer)) as acc:
        assert _until_refused(acc) == 11  # answers past the limit


def test_a_number_above_a_double_already_stored_is_read_as_typed_damage(
        deployment: Deployment) -> None:
    """Finding 3's damage where the trigger did not refuse it (a ledger of an older version,
    or the owner's triggers off): a row holding a 401-digit integer. Opening and releasing end
    in a typed error or a refusal, ``status`` and ``audit`` in their exit bits; never a
    traceback (an OverflowError, before)."""
    import subprocess
    import sys

    with psycopg.connect(deployment.dsn(deployment.owner), autocommit=True) as conn:
        conn.execute("ALTER TABLE dpbudget_entries DISABLE TRIGGER dpbudget_entries_chain")
    with psycopg.connect(deployment.dsn(deployment.writer)) as conn:
        _appended(conn, _each_dataset_account(lambda a: a["state"].update(epsilon=12345.5)),
                  ("12345.5", "1e400"))
        conn.commit()
    with psycopg.connect(deployment.dsn(deployment.owner), autocommit=True) as conn:
        conn.execute("ALTER TABLE dpbudget_entries ENABLE TRIGGER dpbudget_entries_chain")
    assert any(len(state) > 400 for *_, state, _ in deployment.rows()[1])
    for role in (deployment.owner, deployment.writer):
        try:
            with Accountant.open(deployment.dsn(role)) as acc:
                with pytest.raises(PrivacyError):
                    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
        except PrivacyError:
            pass
    outcomes = {}
    for command in ("status", "audit"):
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from dpbudget.accountant.cli import main; "
             "sys.exit(main())", command, deployment.dsn(deployment.auditor)],
            capture_output=True, text=True, timeout=120)
        assert "Traceback" not in done.stderr, done.stderr[-2000:]
        outcomes[command] = done.returncode, done.stdout
    assert "refuse every release: dataset:" in outcomes["status"][1]  # (spent: infinity)
    assert outcomes["audit"][0] & 32, outcomes["audit"]  # a state its records do not replay to
