"""``PostgresLedger`` (``accountant.ledger.postgres.ledger``): its debits read what the last holder
of their locks committed, whatever isolation level is the default; analysts are the roles their
sessions logged in as (issue 28); and two writers (two accountants, as two processes would be)
taking turns on one PostgreSQL ledger: each debit reads the states under its lanes' locks, so nothing is overspent, a refusal
gives the ledger's numbers, a policy change one writer makes is seen by the other, and a
pipeline's id names its own record."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from dpbudget.accountant import (
    Accountant, AnalystMismatchError, Budget, BudgetExceededError, LedgerError, PolicyChangedError,
    UnknownAnalystError,
)
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.gate.refusals import REFUSAL_LOGGER
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.accountant.ledger.record import canonical, record_hash
from dpbudget.mechanisms import Laplace
from dpbudget.policies.policy import Policy
from tests.conftest import _fresh_schema
from tests.ledger.postgres.test_schema import Deployment
from tests.support import OWNER, snapshot


@pytest.fixture
def two(postgres_database: str) -> tuple[Accountant, Accountant]:
    dsn = _fresh_schema(postgres_database)
    Accountant(Budget(1.0), ledger=dsn, owner_key=OWNER).close()
    a, b = Accountant.open(dsn), Accountant.open(dsn)
    yield a, b
    a.close()
    b.close()


@pytest.mark.postgres
def test_writers_taking_turns_never_overspend(two: tuple[Accountant, Accountant]) -> None:
    a, b = two
    admitted = 0
    for i in range(30):
        try:
            (a if i % 2 == 0 else b).release(Laplace(0.1, sensitivity=1.0), 1.0)
            admitted += 1
        except BudgetExceededError:
            pass
    assert admitted == 10
    assert a.spent().epsilon == pytest.approx(1.0)
    report = audit(a.ledger)
    assert report.ok and report.records == 11  # the policy record and the ten releases


@pytest.mark.postgres
def test_a_refusal_gives_what_the_other_writer_left(two: tuple[Accountant, Accountant]) -> None:
    a, b = two
    a.release(Laplace(0.5, sensitivity=1.0), 1.0)  # a last saw 0.5 spent
    b.release(Laplace(0.5, sensitivity=1.0), 1.0)  # the ledger: 1.0 spent
    with pytest.raises(BudgetExceededError) as refused:
        a.release(Laplace(0.1, sensitivity=1.0), 1.0)  # on a's last numbers it would fit
    assert refused.value.remaining.epsilon == pytest.approx(0.0)  # the ledger's numbers
    assert a.spent().epsilon == pytest.approx(1.0)


@pytest.mark.postgres
def test_a_policy_change_by_one_writer_stops_the_other(two: tuple[Accountant, Accountant]) -> None:
    a, b = two
    a.release(Laplace(0.1, sensitivity=1.0), 1.0)
    b.apply_policy(Policy.model_validate({"datasets": {"default": {"limit": {"epsilon": 0.5}}}}),
                   by="owner", reason="lower the limit", owner_key=OWNER)
    with pytest.raises(PolicyChangedError):
        a.release(Laplace(0.1, sensitivity=1.0), 1.0)


@pytest.mark.postgres
def test_a_pipeline_is_named_by_its_own_record(two: tuple[Accountant, Accountant]) -> None:
    """Records are numbered across writers: the pipeline's id must name the one that opened it."""
    a, b = two
    a.release(Laplace(0.1, sensitivity=1.0), 1.0)
    b.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with a.pipeline("report", budget=Budget(0.2)) as p:
        p.release(Laplace(0.1, sensitivity=1.0), 1.0)
    opening = [e for e in a.ledger.entries() if e.record["kind"] == "pipeline"][0]
    assert p.id == f"report#{opening.seq}"
    assert audit(a.ledger).ok


def test_a_stale_debit_is_redone_and_charged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LedgerStaleError (a debit that locked another renewal window's accounts; nothing
    written) is redone by the gate, and the release is charged once."""
    from dpbudget.accountant.values.errors import LedgerStaleError

    acc = Accountant(Budget(1.0), rng=0)  # (in memory: the gate's logic alone)
    ledger = acc.ledger
    real = ledger._commit
    calls = []

    def stale_once() -> object:
        calls.append(1)
        if len(calls) == 1:
            ledger._rollback()
            raise LedgerStaleError("stale (test)")
        return real()

    monkeypatch.setattr(ledger, "_commit", stale_once)
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    assert len(calls) == 2 and acc.spent().epsilon == 0.25
    assert len([e for e in ledger.entries() if e.record["kind"] == "release"]) == 1


# -- a debit reads what the last holder of its locks committed, whatever isolation level the role,
# the database or the DSN sets as default (review of the one-package ledger: a plain BEGIN)

REPEATABLE_READ = "%20-cdefault_transaction_isolation%3Drepeatable%5C%20read"
POLICY = "limit = { epsilon = 5.0 }\n[datasets.adult]\nlimit = { epsilon = 2.0 }\n"


def _outcome(call: Callable[[], Any]) -> str:
    try:
        call()
        return "answered"
    except Exception as exc:  # the type is what the test reads
        return type(exc).__name__


def _race(database: str, holder: PostgresLedger, first: Callable[[], Any],
          second: Callable[[], Any]) -> str:
    """Run ``first`` (on ``holder``) up to its commit; start ``second``; let ``first`` commit
    once ``second`` waits on a lock; return ``second``'s outcome."""
    commit, holding, go = holder._commit, threading.Event(), threading.Event()

    def held() -> None:
        holding.set()
        go.wait(30)
        commit()

    holder._commit = held  # type: ignore[method-assign]
    worker = threading.Thread(target=first)
    worker.start()
    assert holding.wait(30)
    result: list[str] = []
    other = threading.Thread(target=lambda: result.append(_outcome(second)))
    other.start()
    with psycopg.connect(database, autocommit=True) as watch:
        deadline = time.monotonic() + 30
        while not watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]:
            assert time.monotonic() < deadline, "the second debit never waited on a lock"
            time.sleep(0.01)
    go.set()
    worker.join(30)
    other.join(30)
    return result[0]


def _twins(database: str, dsn: str) -> str:
    a_ledger, b_ledger = PostgresLedger(dsn), PostgresLedger(dsn)
    a = Accountant(Budget(1.0), ledger=a_ledger, rng=0, simulation=True)
    b = Accountant(Budget(1.0), ledger=b_ledger, rng=0, simulation=True)
    try:
        return _race(database, a_ledger,
                     lambda: a.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="People"),
                     lambda: b.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="people"))
    finally:
        a.close()
        b.close()


def _lowered(database: str, dsn: str, tmp_path: Path) -> str:
    (tmp_path / "p.toml").write_text(POLICY)
    (tmp_path / "low.toml").write_text(POLICY.replace("2.0", "0.5"))
    owner_ledger = PostgresLedger(dsn)
    owner = Accountant.from_policy(tmp_path / "p.toml", ledger=owner_ledger, rng=0,
                                   simulation=True, owner_key=OWNER)
    analyst = Accountant.open(PostgresLedger(dsn), rng=0, simulation=True)
    try:
        return _race(database, owner_ledger,
                     lambda: owner.apply_policy(tmp_path / "low.toml", by="owner",
                                                reason="lower", owner_key=OWNER),
                     lambda: analyst.release(Laplace(1.0, sensitivity=1.0), 1.0,
                                             dataset="adult"))
    finally:
        owner.close()
        analyst.close()


@pytest.mark.postgres
@pytest.mark.parametrize("default", ["", REPEATABLE_READ], ids=["server-default", "repeatable-read"])
def test_a_twin_committed_while_waiting_is_refused(postgres_database: str, default: str) -> None:
    dsn = _fresh_schema(postgres_database) + default
    assert _twins(postgres_database, dsn) == "InvalidArgumentError"


@pytest.mark.postgres
@pytest.mark.parametrize("default", ["", REPEATABLE_READ], ids=["server-default", "repeatable-read"])
def test_a_policy_lowered_while_waiting_is_enforced(postgres_database: str, default: str,
                                                    tmp_path: Path) -> None:
    dsn = _fresh_schema(postgres_database) + default
    assert _lowered(postgres_database, dsn, tmp_path) == "PolicyChangedError"


@pytest.mark.postgres
def test_negative_control_a_plain_begin_under_repeatable_read_opens_a_twin(
        postgres_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpbudget.accountant.ledger.postgres.ledger as module

    monkeypatch.setattr(module, "BEGIN", "BEGIN")
    dsn = _fresh_schema(postgres_database) + REPEATABLE_READ
    assert _twins(postgres_database, dsn) == "answered"
    assert _lowered(postgres_database, _fresh_schema(postgres_database) + REPEATABLE_READ,
                    tmp_path) == "answered"


# -- analysts authenticated where the ledger can (issue 28): a release is charged to the role
# the session logged in as (``session_user``), never to the analyst= the caller passes: the client
# refuses another name (``AnalystMismatchError``, nothing drawn or debited), and the server itself
# refuses a record whose analyst is not the session's role, whoever wrote it. The attack is the
# issue's: alice, with a quota of 0.3 on a dataset of 1.0, released under other names (a
# colleague's, a variant of her own, none) and got ε = 1.0 (0.6 with ``other_analysts = "deny"``).
# On SQLite and in memory the caller's name still stands (docs/threat-model.md): the same attack
# there is the negative control.

class Analysts(Deployment):
    """The deployment guide's roles, plus one login role per analyst (alice, bob), each granted
    the writer role; the policy names them. Role names carry a tag: roles are the server's."""

    def __init__(self, database: str) -> None:
        super().__init__(database)
        tag = self.schema.removeprefix("ledger_")
        self.alice, self.bob = f"alice_{tag}", f"bob_{tag}"
        with psycopg.connect(database, autocommit=True) as conn:
            for role in (self.alice, self.bob):
                conn.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE "{self.writer}"')

    def policy(self, deny: bool) -> Policy:
        """The issue's: a dataset of ε = 1.0, alice's and bob's quotas of 0.3 on it."""
        adult: dict[str, Any] = {"limit": {"epsilon": 1.0}, "analysts": {
            self.alice: {"limit": {"epsilon": 0.3}}, self.bob: {"limit": {"epsilon": 0.3}}}}
        if deny:
            adult["other_analysts"] = "deny"
        return Policy.model_validate({"datasets": {"adult": adult}})

    def names(self) -> list[str | None]:
        """What alice tries: her name, a colleague's, a variant of hers, and none."""
        return [self.alice, self.bob, self.alice.capitalize(), None]

    def drop(self) -> None:
        with psycopg.connect(self.superuser, autocommit=True) as conn:
            for role in (self.alice, self.bob):
                conn.execute(f'DROP OWNED BY "{role}"')
                conn.execute(f'DROP ROLE "{role}"')
        super().drop()


@pytest.fixture
def analysts(postgres_database: str) -> Iterator[Analysts]:
    made = Analysts(postgres_database)
    try:
        yield made
    finally:
        made.drop()


def _take_everything(acc: Accountant, names: list[str | None]) -> float:
    """The attack: ε = 0.1 at a time under each name in turn, until it is refused; returns the
    ε obtained (each release's receipt)."""
    got = 0.0
    for name in names:
        for _ in range(20):
            try:
                acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst=name)
            except (BudgetExceededError, UnknownAnalystError):  # (AnalystMismatchError is one)
                break
            receipt = acc.last_receipt
            assert receipt is not None
            got += receipt.cost.epsilon
    return got


@pytest.mark.postgres
@pytest.mark.parametrize(("deny", "on_main"), [(False, 1.0), (True, 0.6)])
def test_alice_cannot_spend_under_other_names(analysts: Analysts, tmp_path: Path, deny: bool,
                                               on_main: float) -> None:
    policy = analysts.policy(deny)
    # Negative control: where the caller's name stands (SQLite, memory), the figure.
    for url in (f"sqlite:///{tmp_path / 'l.db'}", "memory://"):
        with Accountant.from_policy(policy, ledger=url) as acc:
            assert acc.ledger.authenticated_analyst is None
            assert _take_everything(acc, analysts.names()) == pytest.approx(on_main)
    # On PostgreSQL, logged in as alice: her quota, and nothing more, whatever she names.
    Accountant.from_policy(policy, ledger=analysts.dsn(analysts.owner)).close()
    with Accountant.open(analysts.dsn(analysts.alice)) as acc:
        assert acc.ledger.authenticated_analyst == analysts.alice
        assert _take_everything(acc, analysts.names()) == pytest.approx(0.3)
        for other in analysts.names()[1:3]:
            with pytest.raises(AnalystMismatchError, match="the role this ledger's session"):
                acc.can_afford(Laplace(1e-6, sensitivity=1.0), dataset="adult", analyst=other)
    releases = [json.loads(r[2]) for r in analysts.rows()[0]]
    releases = [r for r in releases if r["kind"] == "release"]
    assert len(releases) == 3 and {r["analyst"] for r in releases} == {analysts.alice}
    report = audit(analysts.dsn(analysts.auditor))
    assert report.ok, [p.message for p in report.problems]
    spent = {a.account: a.spent["epsilon"] for a in report.accounts}
    assert spent[f"dataset:adult/analyst:{analysts.alice}"] == pytest.approx(0.3)
    assert f"dataset:adult/analyst:{analysts.bob}" not in spent


@pytest.mark.postgres
def test_another_name_is_refused_before_anything_is_drawn_or_debited(
        analysts: Analysts, caplog: pytest.LogCaptureFixture) -> None:
    Accountant.from_policy(analysts.policy(False), ledger=analysts.dsn(analysts.owner),
                           simulation=True).close()
    rng = np.random.default_rng(0)
    with Accountant.open(analysts.dsn(analysts.alice), rng=rng, simulation=True) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")  # None names alice
        receipt = acc.last_receipt
        assert receipt is not None and receipt.analyst == analysts.alice
        before = snapshot(acc.ledger, rng)
        with caplog.at_level(logging.WARNING, logger=REFUSAL_LOGGER):
            for other in (analysts.bob, analysts.alice.upper(), analysts.writer):
                with pytest.raises(AnalystMismatchError) as info:
                    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst=other)
                assert info.value.authenticated == analysts.alice
                with pytest.raises(AnalystMismatchError):
                    with acc.pipeline("p", dataset="adult", analyst=other, budget=Budget(0.1)):
                        pass
        assert snapshot(acc.ledger, rng) == before
        assert acc.remaining("adult", analyst=analysts.alice).epsilon == pytest.approx(0.2)
        refused = [r.dpbudget_refusal for r in caplog.records if r.name == REFUSAL_LOGGER]
        assert len(refused) == 6  # three releases, three pipelines
        assert {(r["analyst"], r["reason"]) for r in refused} == {
            (analysts.alice, "AnalystMismatchError")}


def _client_check_bypassed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client as it was: the ledger authenticates no one, so the caller's name stands."""
    monkeypatch.setattr(PostgresLedger, "authenticated_analyst", property(lambda self: None))


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["bob", "Alice", None])
def test_the_server_refuses_a_record_under_another_name(
        analysts: Analysts, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    policy = analysts.policy(False)
    other = {"bob": analysts.bob, "Alice": analysts.alice.capitalize(), None: None}[name]
    _client_check_bypassed(monkeypatch)
    # Negative control: with the client check bypassed, nothing else on the client stops it.
    with Accountant.from_policy(policy, ledger=f"sqlite:///{tmp_path / 'l.db'}") as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst=other)
        assert acc.last_receipt is not None and acc.last_receipt.analyst == other
    Accountant.from_policy(policy, ledger=analysts.dsn(analysts.owner), simulation=True).close()
    rng = np.random.default_rng(0)
    with Accountant.open(analysts.dsn(analysts.alice), rng=rng, simulation=True) as acc:
        assert acc.ledger.authenticated_analyst is None  # (bypassed)
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst=analysts.alice)
        before = snapshot(acc.ledger, rng)
        with pytest.raises(LedgerError, match="its analyst is not the role that logged in"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst=other)
        assert snapshot(acc.ledger, rng) == before
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst=analysts.alice)  # still works
    assert audit(analysts.dsn(analysts.auditor)).ok


def _record_as(conn: psycopg.Connection[Any], analyst: str | None,
               moved: dict[str, str] | None = None) -> tuple[int, str, str]:
    """A copy of the last release, well formed and linked as the gate would link it (a number
    from the ledger's sequence, each lane's last record), naming ``analyst``; ``moved``: accounts
    it charges instead to other keys (old key -> new key)."""
    text = conn.execute("SELECT record FROM dpbudget_entries WHERE record::jsonb->>'kind' = "
                        "'release' ORDER BY seq DESC LIMIT 1").fetchone()[0]  # type: ignore[index]
    record = json.loads(text)
    (record["seq"],) = conn.execute("SELECT nextval('dpbudget_seq')").fetchone()  # type: ignore[misc]
    for old, new in (moved or {}).items():
        record["accounts"][new] = record["accounts"].pop(old)
        record["links"][new] = record["links"].pop(old)
    for lane in record["links"]:
        head = conn.execute("SELECT seq, hash FROM dpbudget_lanes WHERE key = %s",
                            (lane,)).fetchone()
        assert head is not None or moved  # (a moved account's lane may be new: its first)
        record["links"][lane] = [0, "0" * 64] if head is None else [head[0], head[1]]
    record["analyst"] = analyst
    text = canonical(record)
    return record["seq"], record_hash(text), text


@pytest.mark.postgres
@pytest.mark.parametrize("set_role", [False, True])
def test_raw_sql_under_another_name_is_refused_even_after_set_role(
        analysts: Analysts, set_role: bool) -> None:
    """alice bypasses dpbudget: her own name is accepted (the control: the record is otherwise
    well formed), any other — the writer role she can SET ROLE to included — is not."""
    Accountant.from_policy(analysts.policy(False), ledger=analysts.dsn(analysts.owner)).close()
    with Accountant.open(analysts.dsn(analysts.alice)) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    before = analysts.rows()
    insert = "INSERT INTO dpbudget_entries (seq, hash, record) VALUES (%s, %s, %s)"
    for name in (analysts.bob, analysts.writer, None, analysts.alice):
        with psycopg.connect(analysts.dsn(analysts.alice)) as conn:  # one transaction each
            if set_role:
                conn.execute(f'SET ROLE "{analysts.writer}"')
                assert conn.execute("SELECT current_user").fetchone() == (analysts.writer,)
            if name == analysts.alice:
                conn.execute(insert, _record_as(conn, name))  # accepted
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege,
                                   match="its analyst is not the role that logged in"):
                    conn.execute(insert, _record_as(conn, name))
            conn.rollback()
    assert analysts.rows() == before


@pytest.mark.postgres
def test_the_owner_may_write_others_records(analysts: Analysts) -> None:
    """An import (records of many analysts, written by the tables' owner) is the owner's."""
    Accountant.from_policy(analysts.policy(False), ledger=analysts.dsn(analysts.owner)).close()
    with Accountant.open(analysts.dsn(analysts.alice)) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    with psycopg.connect(analysts.dsn(analysts.owner)) as conn:
        conn.execute("INSERT INTO dpbudget_entries (seq, hash, record) VALUES (%s, %s, %s)",
                     _record_as(conn, analysts.bob))
        conn.rollback()


@pytest.mark.postgres
def test_raw_sql_charging_another_analysts_quota_is_refused(analysts: Analysts) -> None:
    """The review's attack: a record that names alice, from alice's session, but charges bob's
    quota (on the dataset, everywhere, in a renewal window) so that bob can no longer release
    and alice's quota is untouched. The server refuses it; alice's own quota is accepted (the
    control: the record is otherwise well formed), and so is bob's from the tables' owner (an
    import)."""
    Accountant.from_policy(analysts.policy(False), ledger=analysts.dsn(analysts.owner)).close()
    with Accountant.open(analysts.dsn(analysts.alice)) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    before = analysts.rows()
    insert = "INSERT INTO dpbudget_entries (seq, hash, record) VALUES (%s, %s, %s)"
    mine = f"dataset:adult/analyst:{analysts.alice}"
    escaped = "\\u003a"  # (a ':' spelled as a JSON escape in the record's text)
    for theirs in (f"dataset:adult/analyst:{analysts.bob}", f"analyst:{analysts.bob}",
                   f"dataset:adult/analyst:{analysts.bob}@2026-11-21+1d",
                   f"dataset:adult/analyst:{analysts.alice}x", f"analyst{escaped}{analysts.bob}"):
        key = theirs.replace(escaped, ":")
        with psycopg.connect(analysts.dsn(analysts.alice)) as conn:  # one transaction each
            conn.execute(insert, _record_as(conn, analysts.alice, {mine: mine}))  # accepted
            conn.rollback()
            seq, _, text = _record_as(conn, analysts.alice, {mine: key})
            text = text.replace(json.dumps(key), json.dumps(theirs).replace("\\\\", "\\"))
            assert (escaped in text) == (escaped in theirs)
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match="another analyst's than the role that logged in"):
                conn.execute(insert, (seq, record_hash(text), text))
            conn.rollback()
        with psycopg.connect(analysts.dsn(analysts.owner)) as conn:
            conn.execute(insert, _record_as(conn, analysts.alice, {mine: key}))  # accepted
            conn.rollback()
    assert analysts.rows() == before


@pytest.mark.postgres
def test_a_session_replaced_by_another_roles_is_refused(analysts: Analysts) -> None:
    """The role is read once, when the ledger opens; a session replaced later (a lost
    connection) by another role's writes nothing: the server's triggers refuse a record of the
    first role from the second. Negative control: the same replacement as the first role
    releases."""
    Accountant.from_policy(analysts.policy(False), ledger=analysts.dsn(analysts.owner)).close()
    with Accountant.open(analysts.dsn(analysts.alice)) as acc:
        ledger = acc.ledger
        assert isinstance(ledger, PostgresLedger)
        before = analysts.rows()
        ledger._s._dsn = analysts.dsn(analysts.bob)  # (what a changed credential would do)
        ledger._s.conn.close()
        with pytest.raises(LedgerError, match="not the role that logged in"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
        assert ledger.authenticated_analyst == analysts.alice
        assert analysts.rows() == before
        ledger._s._dsn = analysts.dsn(analysts.alice)
        ledger._s.conn.close()
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
        assert analysts.rows() != before
