"""The PostgreSQL ledger's optimistic debit: a debit that starts from what this ledger object's
last commit left (no read) is sent in one round trip, and the server's chain check refuses it if
another writer appended meanwhile; the gate then redoes it on fresh reads. Two writers taking
turns make every cache stale: nothing may be overspent, refused on stale numbers, or kept from a
policy change."""

from __future__ import annotations

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, PolicyChangedError
from dpbudget.accountant.audit import audit
from dpbudget.accountant.ledger.postgres import PostgresLedger
from dpbudget.mechanisms import Laplace
from dpbudget.policies.policy import Policy
from tests.conftest import _fresh_schema
from tests.support import OWNER




@pytest.fixture
def two(postgres_database: str) -> tuple[Accountant, Accountant]:
    dsn = _fresh_schema(postgres_database)
    Accountant(Budget(1.0), ledger=dsn, owner_key=OWNER).close()
    a, b = Accountant.open(dsn), Accountant.open(dsn)
    yield a, b
    a.close()
    b.close()


@pytest.mark.postgres
def test_a_lone_writer_debits_optimistically(two: tuple[Accountant, Accountant]) -> None:
    a, _ = two
    a.release(Laplace(0.1, sensitivity=1.0), 1.0)
    ledger = a.ledger
    assert isinstance(ledger, PostgresLedger)
    a.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert ledger.optimistic  # started from its own last commit: one round trip
    assert a.spent().epsilon == pytest.approx(0.2)


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
def test_a_stale_cache_is_redone_on_fresh_reads(two: tuple[Accountant, Accountant]) -> None:
    a, b = two
    a.release(Laplace(0.5, sensitivity=1.0), 1.0)  # a's cache: 0.5 spent
    b.release(Laplace(0.5, sensitivity=1.0), 1.0)  # the ledger: 1.0 spent; a's cache is stale
    with pytest.raises(BudgetExceededError) as refused:
        a.release(Laplace(0.1, sensitivity=1.0), 1.0)  # optimistic on 0.5 would admit; the server refuses it
    assert refused.value.remaining.epsilon == pytest.approx(0.0)  # the fresh numbers
    ledger = a.ledger
    assert isinstance(ledger, PostgresLedger) and ledger._backoff > 0  # others are active
    assert a.spent().epsilon == pytest.approx(1.0)


@pytest.mark.postgres
def test_a_policy_change_is_seen_through_a_cache(two: tuple[Accountant, Accountant]) -> None:
    a, b = two
    a.release(Laplace(0.1, sensitivity=1.0), 1.0)
    b.apply_policy(Policy.model_validate({"datasets": {"default": {"limit": {"epsilon": 0.5}}}}),
                   by="owner", reason="lower the limit", owner_key=OWNER)
    with pytest.raises(PolicyChangedError):
        a.release(Laplace(0.1, sensitivity=1.0), 1.0)


@pytest.mark.postgres
def test_a_pipeline_opened_on_a_stale_cache_is_named_by_its_own_record(
        two: tuple[Accountant, Accountant]) -> None:
    """A redone debit gets a new seq: the pipeline's id must name the record that opened it."""
    a, b = two
    a.release(Laplace(0.1, sensitivity=1.0), 1.0)
    b.release(Laplace(0.1, sensitivity=1.0), 1.0)  # a's cache is now stale
    with a.pipeline("report", budget=Budget(0.2)) as p:
        p.release(Laplace(0.1, sensitivity=1.0), 1.0)
    opening = [e for e in a.ledger.entries() if e.record["kind"] == "pipeline"][0]
    assert p.id == f"report#{opening.seq}"
    assert audit(a.ledger).ok


def test_a_stale_debit_is_always_redone_whatever_the_flag_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The redo does not depend on a flag another thread may have changed meanwhile: a
    LedgerStaleError (nothing written) is redone, and the release is charged once."""
    from dpbudget.accountant.errors import LedgerStaleError

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
