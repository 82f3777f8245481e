"""The PostgreSQL ledger linked per account (lanes, accountant.ledger.lanes): debits on different
datasets do not wait for each other, the ones that share an account do, nothing overspends, and
every kind of tampering with the records is still reported."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget, LedgerError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
from dpbudget.accountant.ledger import SqliteLedger, lanes
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.accountant.ledger.record import GENESIS, canonical, export_line, record_hash
from dpbudget.mechanisms import Laplace
from dpbudget.policies import Policy
from tests.conftest import _fresh_schema
from tests.support import OWNER, assert_chain

pytestmark = pytest.mark.postgres

TWO = {"datasets": {"a": {"limit": {"epsilon": 1.0}}, "b": {"limit": {"epsilon": 1.0}}}}


@pytest.fixture
def dsn(postgres_database: str) -> str:
    return _fresh_schema(postgres_database)


def _accountant(dsn: str, policy: dict[str, Any] = TWO, timeout: float = 0.5) -> Accountant:
    return Accountant.from_policy(Policy.model_validate(policy),
                                  ledger=PostgresLedger(dsn, timeout=timeout), rng=0,
                                  simulation=True, owner_key=OWNER)


@contextlib.contextmanager
def _holding(dsn: str, keys: list[str], shared: tuple[str, ...] = ()) -> Iterator[None]:
    """Another writer in the middle of a transaction that holds the lanes of ``keys`` (those in
    ``shared`` only shared), until the block ends."""
    holder = PostgresLedger(dsn)
    scope = holder.transaction()
    scope.begin(keys, shared)
    try:
        yield
    finally:
        scope.abandon()
        holder.close()


def test_a_debit_on_another_dataset_does_not_wait(dsn: str) -> None:
    acc = _accountant(dsn)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    with _holding(dsn, ["dataset:a"]):  # another writer in the middle of a debit on dataset a
        start = time.monotonic()
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="b")  # no wait: a lane of its own
        assert time.monotonic() - start < 0.5
        with pytest.raises(LedgerError, match="lock timeout"):  # the same account waits
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    assert acc.spent("a").epsilon == pytest.approx(0.1)  # the refused one debited nothing
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    assert acc.spent("a").epsilon == pytest.approx(0.2)
    assert audit(acc.ledger).ok
    assert assert_chain(acc.ledger) == 3
    acc.close()


def test_a_global_limit_is_one_lane_that_every_debit_writes(dsn: str) -> None:
    acc = _accountant(dsn, {**TWO, "limit": {"epsilon": 5.0}})
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    with _holding(dsn, ["global"]):
        with pytest.raises(LedgerError, match="lock timeout"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="b")
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="b")
    assert acc.ledger.account("global").state["epsilon"] == pytest.approx(0.2)
    acc.close()


def test_a_policy_change_waits_for_the_debits_in_flight(dsn: str) -> None:
    acc = _accountant(dsn)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    with _holding(dsn, ["policy", "dataset:b"], ("policy",)):  # a debit in flight
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")  # debits share the policy's lock
        owner = _accountant(dsn)
        lower = Policy.model_validate({"datasets": {"a": {"limit": {"epsilon": 0.5}},
                                                    "b": {"limit": {"epsilon": 0.5}}}})
        with pytest.raises(LedgerError, match="lock timeout"):
            owner.apply_policy(lower, by="owner", reason="lower", owner_key=OWNER)
    owner.apply_policy(lower, by="owner", reason="lower", owner_key=OWNER)
    assert audit(acc.ledger).ok
    owner.close()
    acc.close()


def test_two_first_debits_on_variants_of_a_new_name_do_not_make_two_budgets(dsn: str) -> None:
    acc = Accountant(Budget(1.0), ledger=PostgresLedger(dsn, timeout=0.5), rng=0, simulation=True)
    with _holding(dsn, ["fold:adult"]):  # another debit on a variant of "Adult", not yet committed
        with pytest.raises(LedgerError, match="lock timeout"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="Adult")
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="Adult")
    with pytest.raises(Exception, match="variant"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    acc.close()


def test_a_debit_that_waited_for_a_lane_reads_the_state_it_left(dsn: str) -> None:
    """A debit that had to wait for another's lock must check and write on the state that other
    debit committed, not on what it would have read before waiting: a stale read would record
    less spend than was made (an overspend the server's "never below" check lets through when
    the cost exceeds the other debit's)."""
    import threading

    earlier = _accountant(dsn)
    earlier.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")  # the lane exists: the wait is for its lock
    earlier.close()
    first, second = _accountant(dsn, timeout=10.0), _accountant(dsn, timeout=10.0)
    ledger = first.ledger
    assert isinstance(ledger, PostgresLedger)
    inside, go = threading.Event(), threading.Event()
    commit = ledger._commit

    def held_commit() -> None:
        inside.set()  # the lane is locked and the record written, not yet committed
        go.wait(10)
        commit()

    ledger._commit = held_commit  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def run(acc: Accountant, epsilon: float) -> None:
        try:
            acc.release(Laplace(epsilon, sensitivity=1.0), 1.0, dataset="a")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    a = threading.Thread(target=run, args=(first, 0.1))
    a.start()
    assert inside.wait(10)
    b = threading.Thread(target=run, args=(second, 0.3))
    b.start()
    time.sleep(0.3)  # b is waiting for dataset a's lane
    go.set()
    a.join(10)
    b.join(10)
    assert errors == []
    assert second.spent("a").epsilon == pytest.approx(0.5)
    assert audit(second.ledger).ok
    first.close()
    second.close()


def test_ledger_objects_of_one_process_on_other_lanes_keep_their_own_counts(dsn: str) -> None:
    """Two accountants of one process debit other datasets at the same time (their lanes do not
    wait for each other): each is a writer of its own, so no two records share a writer's count
    and the ledger, and the process's log, audit clean."""
    import threading

    accountants = [_accountant(dsn, timeout=10.0) for _ in range(2)]
    errors: list[BaseException] = []

    def run(acc: Accountant, dataset: str) -> None:
        try:
            for _ in range(40):
                acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset=dataset)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(acc, d)) for acc, d in zip(accountants, "ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    report = audit(accountants[0].ledger)
    assert report.ok, [p.message for p in report.problems]
    writers = [json.loads(e.text)["writer"] for e in accountants[0].ledger.entries()
               if json.loads(e.text)["kind"] == "release"]
    assert len({(w["id"], w["n"]) for w in writers}) == 80
    for acc in accountants:
        acc.close()


def _race(dsn: str, dataset: str, n: int, out: Any) -> None:
    try:
        acc = _accountant(dsn, {**TWO, "datasets": {**TWO["datasets"],
                                                    "c": {"limit": {"epsilon": 1.0}}}}, 30.0)
        admitted = 0
        for _ in range(n):
            try:
                acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset=dataset)
                admitted += 1
            except Exception as exc:  # noqa: BLE001 - only refusals are expected
                if type(exc).__name__ != "BudgetExceededError":
                    raise
        acc.close()
        out.put((dataset, admitted))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((dataset, f"{type(exc).__name__}: {exc}"))


def test_processes_on_shared_and_distinct_datasets_never_overspend(dsn: str) -> None:
    _accountant(dsn, {**TWO, "datasets": {**TWO["datasets"],
                                          "c": {"limit": {"epsilon": 1.0}}}}).close()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    plan = ["a", "a", "a", "b", "c"]  # three on one dataset, one each on two others
    procs = [ctx.Process(target=_race, args=(dsn, d, 60, out)) for d in plan]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(isinstance(n, int) for _, n in results), results
    assert sum(n for d, n in results if d == "a") == 100  # the limit admits exactly 100
    assert {d: n for d, n in results if d != "a"} == {"b": 60, "c": 60}
    ledger = PostgresLedger(dsn)
    report = audit(ledger)
    assert report.ok, [p.message for p in report.problems]
    assert assert_chain(ledger) == 220
    ledger.close()


def _export(dsn: str, tmp_path: Path) -> list[dict[str, Any]]:
    acc = _accountant(dsn)
    for dataset in ("a", "b", "a", "b", "a"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=dataset)
    with acc.session(_sparse(), dataset="b") as session:
        session.test(0.0)
    acc.close()
    path = tmp_path / "full.jsonl"
    with PostgresLedger(dsn) as ledger:
        export_jsonl(ledger, path)
    assert audit(str(path), complete=True).ok
    return [{**d["record"], "hash": d["hash"]} for d in map(json.loads,
                                                             path.read_text().splitlines())]


def _sparse() -> Any:
    from dpbudget.mechanisms import AboveThreshold

    return AboveThreshold(epsilon=0.2, threshold=10.0, sensitivity=1.0)


def _write(tmp_path: Path, lines: list[dict[str, Any]]) -> str:
    path = tmp_path / "edited.jsonl"
    path.write_text("".join(export_line(d["hash"], canonical({k: v for k, v in d.items()
                                                               if k != "hash"})) + "\n"
                            for d in lines))
    return str(path)


def _rehash(line: dict[str, Any]) -> dict[str, Any]:
    """What a forger without a key does after an edit: the hash recomputed."""
    body = {k: v for k, v in line.items() if k != "hash"}
    return {**body, "hash": record_hash(canonical(body))}


@pytest.mark.parametrize("tamper", ["delete-a-middle-record", "delete-a-session-close",
                                    "delete-the-policy-record",
                                    "swap-two-records-of-a-lane", "insert-a-fork",
                                    "strip-a-link", "one-chain-record-after-lanes"])
def test_every_tampering_with_an_export_is_reported(dsn: str, tmp_path: Path,
                                                    tamper: str) -> None:
    lines = _export(dsn, tmp_path)
    releases = [i for i, d in enumerate(lines) if d.get("dataset") == "a"
                and d["kind"] == "release"]
    close = next(i for i, d in enumerate(lines) if d["kind"] == "session-close")
    if tamper == "delete-a-middle-record":
        del lines[releases[1]]
    elif tamper == "delete-the-policy-record":  # the last (and only) record on its lane
        assert lines[0]["kind"] == "policy" and "reads" in lines[1]
        del lines[0]
    elif tamper == "delete-a-session-close":
        lines.append(_rehash({**lines[releases[-1]], "seq": lines[-1]["seq"] + 1,
                              "links": {"dataset:b": [lines[close]["seq"], lines[close]["hash"]]},
                              "accounts": {}, "dataset": "b"}))
        del lines[close]
    elif tamper == "swap-two-records-of-a-lane":
        first, second = lines[releases[0]], lines[releases[1]]
        lines[releases[0]] = _rehash({**second, "seq": first["seq"]})
        lines[releases[1]] = _rehash({**first, "seq": second["seq"]})
    elif tamper == "insert-a-fork":
        fork = _rehash({**lines[releases[1]], "seq": lines[-1]["seq"] + 1, "label": "forged"})
        lines.append(fork)  # links where record releases[1] already does
    elif tamper == "strip-a-link":
        lines[releases[1]] = _rehash({**lines[releases[1]], "links": {
            "policy": [0, GENESIS]}})
    else:
        body = {k: v for k, v in lines[releases[-1]].items() if k not in ("hash", "links")}
        lines.append(_rehash({**body, "seq": lines[-1]["seq"] + 1, "prev": lines[-1]["hash"],
                              "v": 1}))
    report = audit(_write(tmp_path, lines), complete=True)
    messages = [p.message for p in report.problems]
    assert not report.ok and "chain" in report.problem_kinds, messages
    # ... by the lanes themselves, not only by the writer's count of records
    assert any("lane" in m or "one chain" in m for m in messages), messages
    if tamper == "delete-the-policy-record":
        assert any("checked against record" in m for m in messages), messages


def test_the_untouched_export_audits_clean_and_imports(dsn: str, tmp_path: Path,
                                                       postgres_database: str) -> None:
    lines = _export(dsn, tmp_path)
    assert all(d["v"] == 2 and "prev" not in d for d in lines)
    target = PostgresLedger(_fresh_schema(postgres_database))
    assert import_jsonl(tmp_path / "full.jsonl", target) == len(lines)
    acc = Accountant.open(target, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="b")  # continues every lane where it was
    assert audit(target).ok
    assert assert_chain(target) == len(lines)  # (the policy record is not counted)
    acc.close()
    target.close()


def test_an_export_of_lanes_is_refused_by_a_ledger_of_one_chain(dsn: str,
                                                                tmp_path: Path) -> None:
    _export(dsn, tmp_path)
    target = SqliteLedger(tmp_path / "one-chain.db")
    with pytest.raises(LedgerError, match="linked per account"):
        import_jsonl(tmp_path / "full.jsonl", target)
    assert target.head()[0] == 0  # nothing imported
    target.close()


def test_a_ledger_of_one_chain_continues_in_lanes(dsn: str, tmp_path: Path) -> None:
    """A ledger written in one chain (format 1, here by SQLite, as an older PostgreSQL ledger
    was) continues on PostgreSQL in lanes: each account's lane starts at its last record."""
    old = Accountant.from_policy(Policy.model_validate(TWO), ledger=SqliteLedger(
        tmp_path / "old.db"), rng=0, simulation=True)
    for dataset in ("a", "b", "a"):
        old.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=dataset)
    export_jsonl(old.ledger, tmp_path / "old.jsonl")
    old.close()
    ledger = PostgresLedger(dsn)
    import_jsonl(tmp_path / "old.jsonl", ledger)
    acc = Accountant.open(ledger, rng=0, simulation=True)
    for dataset in ("b", "a", "b"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=dataset)
    records = [e.record for e in ledger.entries()]
    assert [r["v"] for r in records] == [1, 1, 1, 1, 2, 2, 2]
    assert records[4]["links"]["dataset:b"] == [3, list(ledger.entries())[2].hash]
    assert audit(ledger).ok and assert_chain(ledger) == 6
    assert acc.spent("a").epsilon == pytest.approx(0.3)
    with psycopg.connect(dsn) as conn:  # and the server takes no more records of one chain
        last = json.loads(records[-1] and list(ledger.entries())[-1].text)
        body = {k: v for k, v in last.items() if k != "links"}
        body.update(seq=last["seq"] + 1, prev=list(ledger.entries())[-1].hash, v=1)
        text = canonical(body)
        with pytest.raises(psycopg.Error, match="linked per account"):
            conn.execute("INSERT INTO dpbudget_entries VALUES (%s, %s, %s)",
                         (body["seq"], record_hash(text), text))
    acc.close()


@pytest.mark.parametrize("lane_too", [False, True], ids=["row", "row-and-lane"])
def test_an_account_row_rewound_by_the_owner_is_reported_by_the_audit(dsn: str,
                                                                      lane_too: bool) -> None:
    """With the triggers off (only the owner can), an account row set back to an earlier record
    of its lane, with exactly the state that record wrote: the gate opens on it (the owner can
    rewind the lane with the row, so no check of the row against its lane at opening could tell),
    and the audit reports it, the lane rewound too or not."""
    acc = _accountant(dsn)
    for _ in range(3):
        acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="a")
    acc.close()
    with PostgresLedger(dsn) as ledger:
        assert audit(ledger).ok  # (negative control: untouched, clean)
    with psycopg.connect(dsn, autocommit=True) as conn:
        seq = conn.execute("SELECT seq FROM dpbudget_accounts WHERE key = 'dataset:a'"
                           ).fetchone()[0]  # type: ignore[index]
        earlier = conn.execute("SELECT seq, record, hash FROM dpbudget_entries WHERE seq < %s "
                               "AND record::jsonb->'accounts' ? 'dataset:a' ORDER BY seq DESC "
                               "LIMIT 1", (seq,)).fetchone()
        assert earlier is not None
        state = json.loads(earlier[1])["accounts"]["dataset:a"]["state"]
        conn.execute("SET session_replication_role = replica")  # (triggers off: superuser)
        conn.execute("UPDATE dpbudget_accounts SET state = %s, seq = %s WHERE key = "
                     "'dataset:a'", (canonical(state), earlier[0]))
        if lane_too:
            conn.execute("UPDATE dpbudget_lanes SET seq = %s, hash = %s WHERE key = "
                         "'dataset:a'", (earlier[0], earlier[2]))
    with PostgresLedger(dsn) as ledger:
        Accountant.open(ledger, rng=0, simulation=True).close()
        report = audit(ledger)
        assert any(p.kind == "state" and "dataset:a" in p.message for p in report.problems)


def test_an_audit_reads_the_records_and_the_rows_at_one_moment(dsn: str) -> None:
    """A ledger written while it is audited: the rows the audit compares with the records are
    read in the records' snapshot, not after them (which would report the debits and policy
    changes made meanwhile as tampering)."""
    acc = _accountant(dsn)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    ledger = PostgresLedger(dsn)
    records = ledger.entries()
    first = next(records)  # the snapshot is taken
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")  # committed meanwhile
    acc.apply_policy(Policy.model_validate({"datasets": {"a": {"limit": {"epsilon": 0.9}},
                                                         "b": {"limit": {"epsilon": 1.0}}}}),
                     by="owner", reason="lower a", owner_key=OWNER)
    seen = [first, *records]
    rows = {a.key: a for a in ledger.audited_accounts()}
    assert rows["dataset:a"].state["epsilon"] == pytest.approx(0.1)  # as of the snapshot
    assert rows["policy"].seq == seen[0].seq and len(seen) == 2
    assert audit(ledger).ok  # (a full audit now: its own snapshot, after both)
    ledger.close()
    acc.close()


def test_a_policy_change_comes_after_every_debit_that_read_the_policy_before_it(
        dsn: str) -> None:
    """A policy record must be numbered after every record checked against the policy it
    replaces, although this accountant holds a number taken before them: the change takes a new
    one once its lock is held (else the untouched ledger would fail its audit)."""
    a, b = _accountant(dsn), _accountant(dsn)
    a.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")  # a now holds a number for its next record
    b.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="b")
    b.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="b")  # numbered after a's spare, reading the policy
    a.apply_policy(Policy.model_validate({"datasets": {"a": {"limit": {"epsilon": 0.9}},
                                                       "b": {"limit": {"epsilon": 0.9}}}}),
                   by="owner", reason="lower", owner_key=OWNER)
    report = audit(a.ledger)
    assert report.ok, [p.message for p in report.problems]
    assert assert_chain(a.ledger) == 3
    a.close()
    b.close()


def test_ledgers_in_one_database_do_not_share_lane_locks(postgres_database: str) -> None:
    first, second = _fresh_schema(postgres_database), _fresh_schema(postgres_database)
    one, two = _accountant(first), _accountant(second)
    with _holding(first, ["policy"]):  # a policy change in progress on the first ledger
        two.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")  # the second ledger does not wait
        with pytest.raises(LedgerError, match="lock timeout"):
            one.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    one.close()
    two.close()


def test_an_account_row_deleted_by_the_owner_is_reported_by_the_audit(dsn: str) -> None:
    """A deleted row would start its limit again from zero: the audit, replaying the records,
    reports the row missing."""
    acc = _accountant(dsn)
    acc.release(Laplace(0.9, sensitivity=1.0), 1.0, dataset="a")
    acc.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # (triggers off: superuser)
        conn.execute("DELETE FROM dpbudget_accounts WHERE key = 'dataset:a'")
    with PostgresLedger(dsn) as ledger:
        report = audit(ledger)
        assert any(p.kind == "state" and "dataset:a" in p.message for p in report.problems)


def test_links_are_read_back_as_written_and_a_malformed_member_is_refused() -> None:
    """``lanes.links_member`` and ``lanes.read_links`` are inverse (keys sorted, canonical JSON);
    a ``links`` that is empty, not an object, or holds anything but ``[seq, hash]`` with a
    whole seq >= 0 is refused, so an edited record cannot pose as another lane's link. The
    negative control: a record of one chain has no ``links`` at all (None, not an error)."""
    heads = [("dataset:b", (3, "h3")), ("dataset:a", (0, GENESIS))]
    text = lanes.links_member(heads)
    assert text == canonical({"dataset:a": [0, GENESIS], "dataset:b": [3, "h3"]})
    assert lanes.read_links({"links": json.loads(text)}) == dict(heads)
    assert lanes.read_links({"prev": GENESIS}) is None
    for bad in ({}, [], {"dataset:a": [1.0, "h"]}, {"dataset:a": [True, "h"]},
                {"dataset:a": [-1, "h"]}, {"dataset:a": [1, 2]}, {"dataset:a": [1]}):
        with pytest.raises(ValueError):
            lanes.read_links({"links": bad})


def test_a_ledger_of_one_chain_is_not_upgraded_in_place(dsn: str) -> None:
    """A PostgreSQL ledger from before lanes (no format 2 marker, records in place) is refused
    on open, typed, and left as it was: export, then import (docs/postgres-deployment.md)."""
    PostgresLedger(dsn).close()
    with psycopg.connect(dsn, autocommit=True) as conn:  # re-created: an older version's ledger
        conn.execute("DELETE FROM dpbudget_meta WHERE key IN ('format', 'schema')")
        conn.execute("ALTER TABLE dpbudget_entries DISABLE TRIGGER USER")
        conn.execute("INSERT INTO dpbudget_entries VALUES (1, %s, '{}')", ("0" * 64,))
        before = conn.execute("SELECT key, value FROM dpbudget_meta ORDER BY key").fetchall()
    with pytest.raises(LedgerError, match="dpbudget export"):
        PostgresLedger(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT key, value FROM dpbudget_meta ORDER BY key").fetchall() == before
        assert conn.execute("SELECT tgenabled FROM pg_trigger WHERE tgname = 'dpbudget_entries_"
                            "chain' AND tgrelid = to_regclass('dpbudget_entries')"
                            ).fetchone() == ("D",)  # (the DDL it ran was rolled back)
