"""A debit reads what the last holder of its locks committed, whatever isolation level the role,
the database or the DSN sets as default (review of the one-package ledger: a plain ``BEGIN``).

Under a default of repeatable read, the snapshot was taken as the lock statement started, before
it waited: the reads after the locks missed the holder's commit. Two budgets opened for one table
("People" beside "people"), and a release was answered under a limit the owner had just lowered.
The race is made deterministic: the holder commits only once the other session is seen waiting on
a lock in ``pg_locks``; the negative control sends the old plain ``BEGIN``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.mechanisms import Laplace
from tests.conftest import _fresh_schema
from tests.support import OWNER

pytestmark = pytest.mark.postgres

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


@pytest.mark.parametrize("default", ["", REPEATABLE_READ], ids=["server-default", "repeatable-read"])
def test_a_twin_committed_while_waiting_is_refused(postgres_database: str, default: str) -> None:
    dsn = _fresh_schema(postgres_database) + default
    assert _twins(postgres_database, dsn) == "InvalidArgumentError"


@pytest.mark.parametrize("default", ["", REPEATABLE_READ], ids=["server-default", "repeatable-read"])
def test_a_policy_lowered_while_waiting_is_enforced(postgres_database: str, default: str,
                                                    tmp_path: Path) -> None:
    dsn = _fresh_schema(postgres_database) + default
    assert _lowered(postgres_database, dsn, tmp_path) == "PolicyChangedError"


def test_negative_control_a_plain_begin_under_repeatable_read_opens_a_twin(
        postgres_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpbudget.accountant.ledger.postgres.ledger as module

    monkeypatch.setattr(module, "BEGIN", "BEGIN")
    dsn = _fresh_schema(postgres_database) + REPEATABLE_READ
    assert _twins(postgres_database, dsn) == "answered"
    assert _lowered(postgres_database, _fresh_schema(postgres_database) + REPEATABLE_READ,
                    tmp_path) == "answered"
