"""Pipelines (child budgets): the allocation is one step in every parent account, debited at open
and never refunded; releases inside are charged to the pipeline's own account only; nesting; the
decorator; refusal at open debits nothing."""

from __future__ import annotations

import pytest

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError,
    MechanismNotAllowedError, Pipeline,
)
from dpbudget.mechanisms import Gaussian, Laplace

from tests.support import replay_ledger

POLICY = """
    [datasets.adult]
    limit = { epsilon = 2.0, delta = 1e-6 }
    max_per_query = { epsilon = 0.5 }
    allowed_mechanisms = ["Laplace"]

    [datasets.adult.analysts.alice]
    limit = { epsilon = 1.0, delta = 1e-7 }
"""


def keys(acc):
    return {a.key: a.state["epsilon"] for a in acc.ledger.accounts()}


def test_allocation_is_debited_once_from_every_parent_account(make):
    acc = make(POLICY)
    with acc.pipeline("monthly-report", dataset="adult", analyst="alice",
                      budget=Budget(0.5, 1e-8)) as p:
        opened = keys(acc)
        assert opened == {"dataset:adult": 0.5, "dataset:adult/analyst:alice": 0.5}
        p.release(Laplace(0.2, sensitivity=1.0), 1.0)
        p.release(Laplace(0.2, sensitivity=1.0), 2.0)
        # releases inside touch the pipeline's account only
        assert keys(acc) == {**opened, f"pipeline:{p.id}": pytest.approx(0.4)}
        assert p.spent().epsilon == pytest.approx(0.4)
        assert p.remaining().epsilon == pytest.approx(0.1)
    # not refunded: the parent paid the whole allocation
    assert acc.spent("adult", analyst="alice") == Budget(0.5, 1e-8)


def test_records_name_their_pipeline(make):
    acc = make(POLICY)
    with acc.pipeline("r", dataset="adult", budget=Budget(0.5)) as p:
        p.release(Laplace(0.1, sensitivity=1.0), 1.0, label="inside")
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", label="outside")
    opening, inside, outside = (e.record for e in acc.ledger.entries())
    assert p.id == f"r#{opening['seq']}" and p.key == f"pipeline:r#{opening['seq']}"
    assert opening["kind"] == "pipeline" and opening["pipeline"] == p.id
    assert opening["parent"] is None
    assert opening["cost"] == {"epsilon": 0.5, "delta": 0.0, "rho": None, "mu": None}
    assert opening["rule"]["rule"] == "basic" and opening["rule"]["limit"]["epsilon"] == 0.5
    assert set(opening["accounts"]) == {"dataset:adult"}
    assert inside["kind"] == "release" and inside["pipeline"] == p.id
    assert set(inside["accounts"]) == {p.key}
    assert "pipeline" not in outside
    replay_ledger(acc.ledger)


def test_child_never_exceeds_its_allocation(make, untouched):
    acc = make(POLICY)
    with acc.pipeline("r", dataset="adult", budget=Budget(0.3)) as p:
        p.release(Laplace(0.2, sensitivity=1.0), 1.0)
        with untouched(acc), pytest.raises(BudgetExceededError) as info:
            p.release(Laplace(0.2, sensitivity=1.0), 1.0)
        assert info.value.account == p.key and info.value.dataset == "adult"
        assert not p.can_afford(Laplace(0.2, sensitivity=1.0)) and p.can_afford(Laplace(0.1, sensitivity=1.0))
    # the parent still has room: only the child is full
    assert acc.can_afford(Laplace(0.2, sensitivity=1.0), dataset="adult")


def test_policy_checks_still_apply_inside(make, untouched):
    acc = make(POLICY)
    with acc.pipeline("r", dataset="adult", budget=Budget(1.0, 1e-8)) as p:
        with untouched(acc), pytest.raises(MechanismNotAllowedError):
            p.release(Gaussian(0.2, delta=1e-9, sensitivity=1.0), 1.0)
        with untouched(acc), pytest.raises(BudgetExceededError, match="max_per_query"):
            p.release(Laplace(0.6, sensitivity=1.0), 1.0)  # the cap is per release, not per allocation


def test_refused_at_open_with_nothing_debited(make, untouched):
    acc = make(POLICY)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    with untouched(acc), pytest.raises(BudgetExceededError) as info:
        acc.pipeline("big", dataset="adult", analyst="alice", budget=Budget(0.6))
    assert info.value.account == "dataset:adult/analyst:alice"
    assert info.value.requested == Budget(0.6)


def test_nesting(make, untouched):
    acc = make(POLICY)
    with acc.pipeline("outer", dataset="adult", budget=Budget(1.0)) as outer:
        outer.release(Laplace(0.1, sensitivity=1.0), 1.0)
        with outer.pipeline("inner", budget=Budget(0.5)) as inner:
            assert inner.parent is outer
            inner.release(Laplace(0.3, sensitivity=1.0), 1.0)
            assert inner.spent().epsilon == pytest.approx(0.3)
            # the inner allocation is one step in the outer account; the dataset saw only outer
            assert outer.spent().epsilon == pytest.approx(0.6)
            assert acc.spent("adult") == Budget(1.0)
            with untouched(acc), pytest.raises(BudgetExceededError) as info:
                inner.release(Laplace(0.3, sensitivity=1.0), 1.0)
            assert info.value.account == inner.key
        with untouched(acc), pytest.raises(BudgetExceededError) as info:
            outer.pipeline("too-big", budget=Budget(0.5))
        assert info.value.account == outer.key
        inner_open = [e.record for e in acc.ledger.entries() if e.record.get("parent")]
        assert inner_open[0]["parent"] == outer.id and inner_open[0]["pipeline"] == inner.id
        assert set(inner_open[0]["accounts"]) == {outer.key}
    replay_ledger(acc.ledger)


def test_decorator_opens_a_new_pipeline_per_call(make):
    acc = make(POLICY)

    @acc.budgeted("report", dataset="adult", analyst="alice", budget=Budget(0.3))
    def report(p: Pipeline, value: float) -> str:
        assert isinstance(p, Pipeline) and not p.closed
        p.release(Laplace(0.1, sensitivity=1.0), value)
        return p.id

    first, second = report(1.0), report(2.0)
    assert first != second and first.startswith("report#")
    assert acc.spent("adult", analyst="alice").epsilon == pytest.approx(0.6)
    report(3.0)
    with pytest.raises(BudgetExceededError):
        report(4.0)  # a fourth allocation does not fit alice's 1.0


def test_nested_decorator(make):
    acc = make(POLICY)
    with acc.pipeline("outer", dataset="adult", budget=Budget(1.0)) as outer:
        @outer.budgeted("step", budget=Budget(0.2))
        def step(p):
            return p.release(Laplace(0.2, sensitivity=1.0), 1.0)
        step()
        step()
        assert outer.spent().epsilon == pytest.approx(0.4)


def test_decorator_checks_arguments_when_decorating(make):
    acc = make(POLICY)
    with pytest.raises(InvalidTypeError):
        acc.budgeted("x", dataset="adult", budget=0.5)
    with pytest.raises(InvalidArgumentError):
        acc.budgeted("bad name", dataset="adult", budget=Budget(0.5))


def test_exception_inside_keeps_the_allocation_spent(make):
    acc = make(POLICY)
    with pytest.raises(RuntimeError):
        with acc.pipeline("r", dataset="adult", budget=Budget(0.4)) as p:
            raise RuntimeError("analysis failed")
    assert p.closed and acc.spent("adult") == Budget(0.4)


def test_closed_pipeline_refuses(make, untouched):
    acc = make(POLICY)
    with acc.pipeline("r", dataset="adult", budget=Budget(0.4)) as p:
        pass
    with untouched(acc), pytest.raises(InvalidArgumentError, match="closed"):
        p.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with pytest.raises(InvalidArgumentError, match="closed"):
        p.pipeline("child", budget=Budget(0.1))


@pytest.mark.parametrize("kwargs,error", [
    ({"budget": 0.5}, InvalidTypeError),
    ({"budget": Budget.unlimited()}, InvalidArgumentError),
    ({"budget": Budget(0.5), "composition": "magic"}, InvalidArgumentError),
    ({"budget": Budget(0.5), "dataset": "other"}, InvalidArgumentError),
    ({"budget": Budget(0.5), "label": 3}, InvalidTypeError),
    ({"budget": Budget(0.5), "per_query": 0.1}, InvalidTypeError),
])
def test_bad_pipeline_arguments_debit_nothing(make, untouched, kwargs, error):
    acc = make(POLICY)
    kwargs = {"dataset": "adult", **kwargs}
    with untouched(acc), pytest.raises(error):
        acc.pipeline("r", **kwargs)


@pytest.mark.parametrize("name", ["", "a b", "a/b", "a:b", "a@b", 7])
def test_pipeline_names_cannot_forge_keys(make, name):
    acc = make(POLICY)
    with pytest.raises((InvalidArgumentError, InvalidTypeError)):
        acc.pipeline(name, dataset="adult", budget=Budget(0.1))


def test_pipeline_on_a_plain_accountant_and_receipts(tmp_path):
    acc = Accountant(Budget(1.0), ledger=tmp_path / "b.db", rng=0, simulation=True)
    p = acc.pipeline("r", dataset="d", budget=Budget(0.5))
    assert acc.last_receipt.cost == Budget(0.5)
    p.release(Laplace(0.25, sensitivity=1.0), 1.0)
    assert acc.last_receipt.remaining == Budget(0.25)  # the pipeline's account
    acc.close()
    again = Accountant(Budget(1.0), ledger=tmp_path / "b.db", rng=0, simulation=True)
    assert again.spent("d") == Budget(0.5)
    again.close()


def test_a_pipeline_may_use_its_own_rule(make, other_rule):
    acc = make(POLICY)
    with acc.pipeline("r", dataset="adult", budget=Budget(0.4), composition=other_rule) as p:
        p.release(Laplace(0.1, sensitivity=1.0), 1.0)
    (_, inside) = (e.record for e in acc.ledger.entries())
    assert inside["accounts"][p.key]["rule"] == other_rule
    replay_ledger(acc.ledger)


def test_sessions_and_batches_inside_a_pipeline_charge_only_its_allocation():
    from dpbudget.accountant import Accountant, Budget, BudgetExceededError
    from dpbudget.accountant.audit.run import audit
    from dpbudget.mechanisms import AboveThreshold, Laplace

    acc = Accountant(Budget(1.0), rng=2)
    with acc.pipeline("explore", dataset="d", budget=Budget(0.6)) as p:
        with p.session(AboveThreshold(0.2, threshold=1e6, sensitivity=1.0)) as svt:
            assert [svt.test(x) for x in (0.0, 1.0)] == [False, False]
        answers = p.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(0.1, sensitivity=1.0), 2.0)])
        assert len(answers) == 2
        assert p.spent().epsilon == pytest.approx(0.4)
        before = list(acc.ledger.entries())
        with pytest.raises(BudgetExceededError):
            p.session(AboveThreshold(0.3, threshold=1.0, sensitivity=1.0))
        assert list(acc.ledger.entries()) == before
    assert acc.spent("d").epsilon == pytest.approx(0.6)  # the allocation, charged once
    records = [e.record for e in acc.ledger.entries()]
    assert {r["kind"] for r in records} >= {"pipeline", "session", "session-close", "release"}
    assert all(r.get("pipeline", "").startswith("explore#") for r in records)
    assert audit(acc.ledger).ok
