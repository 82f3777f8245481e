"""Two writers (two accountants, as two processes would be) taking turns on one PostgreSQL
ledger: each debit reads the states under its lanes' locks, so nothing is overspent, a refusal
gives the ledger's numbers, a policy change one writer makes is seen by the other, and a
pipeline's id names its own record."""

from __future__ import annotations

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, PolicyChangedError
from dpbudget.accountant.audit.run import audit
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
