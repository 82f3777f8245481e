"""The accounts a policy declares (``policies.accounts``): every limit is checked and debited in one
transaction, before any noise is drawn, concurrent callers included; every refusal names its
account and leaves the ledger and the RNG untouched (pipelines: tests/gate/test_pipeline.py)."""

from __future__ import annotations

import threading
import tomllib

import pytest

from dpbudget.accountant import (
    Accountant, Budget, BudgetExceededError, InvalidArgumentError, InvalidTypeError,
    MechanismNotAllowedError, UnknownAnalystError, UnknownDatasetError,
)
from dpbudget.accountant.gate import planner as planner_module
from dpbudget.mechanisms import AnalyticGaussian, Gaussian, Laplace
from dpbudget.policies.accounts import PolicyLimits, dataset_name, policy_accounts
from dpbudget.policies.policy import Policy
from tests.support import charged_accounts, replay_ledger

POLICY = """
    limit = { epsilon = 2.0, delta = 1e-5 }

    [datasets.adult]
    limit = { epsilon = 1.5, delta = 1e-6 }
    max_per_query = { epsilon = 0.5, delta = 1e-7 }
    allowed_mechanisms = ["Laplace", "AnalyticGaussian"]

    [datasets.adult.analysts.alice]
    limit = { epsilon = 0.6, delta = 1e-7 }

    [datasets.census]
    limit = { epsilon = 1.0, delta = 1e-6 }
    other_analysts = "deny"

    [datasets.census.analysts.bob]
    limit = { epsilon = 0.8, delta = 1e-6 }

    [analysts.bob]
    limit = { epsilon = 0.9, delta = 1e-6 }
"""


def accounts(acc):
    return {a.key: a.state for a in acc.ledger.accounts()}


def test_targets_of_each_kind_of_release(make):
    acc = make(POLICY)
    assert charged_accounts(acc, "adult") == ["dataset:adult", "global"]
    assert charged_accounts(acc, "adult", "alice") == [
        "dataset:adult", "dataset:adult/analyst:alice", "global"]
    assert charged_accounts(acc, "adult", "bob") == ["analyst:bob", "dataset:adult", "global"]
    assert charged_accounts(acc, ("adult", "census"), "bob") == [
        "analyst:bob", "dataset:adult", "dataset:census", "dataset:census/analyst:bob", "global"]


def test_one_release_debits_every_applicable_limit_in_one_record(make):
    acc = make(POLICY)
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    (entry,) = acc.ledger.entries()
    record = entry.record
    assert set(record["accounts"]) == {"dataset:adult", "dataset:adult/analyst:alice", "global"}
    assert record["analyst"] == "alice" and record["dataset"] == "adult"
    assert acc.spent("adult") == acc.spent("adult", analyst="alice") == Budget(0.25)


def refusal(acc, untouched, mechanism, **where):
    with untouched(acc), pytest.raises(BudgetExceededError) as info:
        acc.release(mechanism, 1.0, **where)
    assert info.value.requested == mechanism.cost
    assert "nothing was drawn and nothing was debited" in str(info.value)
    return info.value


def test_dataset_analyst_limit_refuses(make, untouched):
    acc = make(POLICY)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    err = refusal(acc, untouched, Laplace(0.2, sensitivity=1.0), dataset="adult", analyst="alice")
    assert err.account == "dataset:adult/analyst:alice" and err.dataset == "adult"
    assert err.remaining.epsilon == pytest.approx(0.1)
    assert "dataset:adult/analyst:alice" in str(err)
    acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset="adult", analyst="carol")  # carol: dataset only


def test_dataset_limit_refuses(make, untouched):
    acc = make(POLICY)
    for _ in range(3):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult")
    err = refusal(acc, untouched, Laplace(0.1, sensitivity=1.0), dataset="adult", analyst="carol")
    assert err.account == "dataset:adult"


def test_analyst_limit_across_datasets_refuses(make, untouched):
    acc = make(POLICY)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="bob")
    acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="census", analyst="bob")
    err = refusal(acc, untouched, Laplace(0.2, sensitivity=1.0), dataset="adult", analyst="bob")
    assert err.account == "analyst:bob"
    acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")  # not bob's limit


def test_global_limit_refuses(make, untouched):
    acc = make(POLICY)
    for _ in range(3):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult")
    acc.release(Laplace(0.4, sensitivity=1.0), 1.0, dataset="census", analyst="bob")
    err = refusal(acc, untouched, Laplace(0.2, sensitivity=1.0), dataset="census", analyst="bob")
    assert err.account == "global" and err.dataset == "census"


def test_per_query_cap_refuses(make, untouched):
    acc = make(POLICY)
    err = refusal(acc, untouched, Laplace(0.6, sensitivity=1.0), dataset="adult")
    assert err.account == "dataset:adult" and "max_per_query" in str(err)
    err = refusal(acc, untouched, AnalyticGaussian(0.4, delta=1e-6, sensitivity=1.0), dataset="adult")  # δ above cap
    assert "max_per_query" in str(err)
    acc.release(AnalyticGaussian(0.5, delta=1e-7, sensitivity=1.0), 1.0, dataset="adult")  # exactly the cap
    with untouched(acc):
        assert not acc.can_afford(Laplace(0.6, sensitivity=1.0), dataset="adult")
        assert acc.can_afford(Laplace(0.5, sensitivity=1.0), dataset="adult")


def test_allowed_mechanisms(make, untouched):
    acc = make(POLICY)
    with untouched(acc), pytest.raises(MechanismNotAllowedError, match="allowed_mechanisms"):
        acc.release(Gaussian(0.3, delta=1e-7, sensitivity=1.0), 1.0, dataset="adult")
    with untouched(acc), pytest.raises(MechanismNotAllowedError):
        acc.release(Gaussian(0.3, delta=1e-7, sensitivity=1.0), 1.0, dataset=("census", "adult"), analyst="bob")
    assert not _can(acc, Gaussian(0.3, delta=1e-7, sensitivity=1.0), "adult")
    acc.release(Gaussian(0.3, delta=1e-7, sensitivity=1.0), 1.0, dataset="census", analyst="bob")  # census: any


def _can(acc, mechanism, dataset, analyst=None):
    try:
        return acc.can_afford(mechanism, dataset=dataset, analyst=analyst)
    except MechanismNotAllowedError:
        return False


def test_unlisted_analysts_and_anonymous_releases(make, untouched):
    acc = make(POLICY)
    # adult allows others: only the dataset-level (and global) limits apply to them
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst="carol")
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    assert set(accounts(acc)) == {"dataset:adult", "global"}
    # census denies others, and anonymous releases
    for who in ("carol", None):
        with untouched(acc), pytest.raises(UnknownAnalystError) as info:
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="census", analyst=who)
        assert info.value.argument == "analyst" and info.value.value == who
        assert "datasets.census" in str(info.value)
    assert isinstance(info.value, InvalidArgumentError)


def test_policy_wide_deny(make, untouched):
    acc = make("""
        other_analysts = "deny"
        [datasets.adult]
        [analysts.alice]
        limit = { epsilon = 1.0 }
    """)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    with untouched(acc), pytest.raises(UnknownAnalystError, match=r"\[analysts\]"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst="bob")


def test_unknown_dataset_is_refused(make, untouched):
    acc = make(POLICY)
    with untouched(acc), pytest.raises(UnknownDatasetError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="other")
    with untouched(acc), pytest.raises(UnknownDatasetError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=("adult", "other"))


def test_join_debits_all_datasets_in_one_record(make):
    acc = make(POLICY)
    acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset=["adult", "census"], analyst="bob")
    (entry,) = acc.ledger.entries()
    rec = entry.record
    assert rec["dataset"] == "adult" and rec["datasets"] == ["adult", "census"]
    assert set(rec["accounts"]) == {"dataset:adult", "dataset:census",
                                    "dataset:census/analyst:bob", "analyst:bob", "global"}
    assert acc.spent("adult") == acc.spent("census") == Budget(0.3)


def test_join_is_all_or_nothing(make, untouched):
    acc = make(POLICY)
    acc.release(Laplace(0.7, sensitivity=1.0), 1.0, dataset="census", analyst="bob")  # census/bob: 0.1 left
    with untouched(acc), pytest.raises(BudgetExceededError) as info:
        acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset=("adult", "census"), analyst="bob")
    assert info.value.account == "dataset:census/analyst:bob"
    assert info.value.dataset == "census"
    assert acc.spent("adult") == Budget(0.0)


def test_bad_join_arguments(make, untouched):
    acc = make(POLICY)
    with untouched(acc):
        with pytest.raises(InvalidArgumentError, match="distinct"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=("adult", "adult"))
        with pytest.raises(InvalidArgumentError, match="non-empty"):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=())
        with pytest.raises(InvalidTypeError):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=("adult", 3))
        with pytest.raises(InvalidTypeError):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst=3)


def test_joins_work_without_a_policy_too():
    acc = Accountant(Budget(1.0), rng=0)
    acc.release(Laplace(0.4, sensitivity=1.0), 1.0, dataset=("a", "b"))
    assert acc.spent("a") == acc.spent("b") == Budget(0.4)


def test_can_afford_checks_every_limit_and_debits_nothing(make, untouched):
    acc = make(POLICY)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    with untouched(acc):
        assert not acc.can_afford(Laplace(0.2, sensitivity=1.0), dataset="adult", analyst="alice")
        assert acc.can_afford(Laplace(0.2, sensitivity=1.0), dataset="adult", analyst="carol")


def test_analyst_reading_needs_an_analyst_limit(make):
    acc = make(POLICY)
    with pytest.raises(InvalidArgumentError, match="analyst"):
        acc.spent("adult", analyst="carol")


def test_plans_do_not_leak_between_dataset_and_analyst_pairs(make):
    """Plans are cached per (dataset, analyst): asking for one pair never changes another's."""
    acc = make(POLICY)
    alice = charged_accounts(acc, "adult", "alice")
    assert charged_accounts(acc, "adult", None) == ["dataset:adult", "global"]
    assert charged_accounts(acc, "adult", "alice") == alice
    plain = Accountant(Budget(1.0))
    assert charged_accounts(plain, "x") == charged_accounts(plain, "x") == ["dataset:x"]


def _plan_misses(monkeypatch, acc, order):
    """How many of the plans asked for in ``order`` (dataset names) were made afresh."""
    planner = acc._gate.planner
    made = []
    real = type(planner)._make_plan
    monkeypatch.setattr(type(planner), "_make_plan",
                        lambda self, d, a, **k: made.append(d) or real(self, d, a, **k))
    for name in order:
        planner.plan(name, None)
    return made


def test_a_full_plan_cache_evicts_the_least_recently_used_not_everything(monkeypatch):
    """With room for 3 plans, a 4th evicts only the coldest (b); a, c, d are still cached."""
    monkeypatch.setattr(planner_module, "_PLAN_CACHE", 3)
    acc = Accountant(Budget(10.0))
    made = _plan_misses(monkeypatch, acc, ["a", "b", "c", "a", "d", "a", "c", "d", "b"])
    assert made == ["a", "b", "c", "d", "b"]


def test_negative_control_a_cache_cleared_when_full_replans_every_dataset(monkeypatch):
    """The old cache (cleared when full) re-made a, c and d too: the test above sees the
    difference."""
    monkeypatch.setattr(planner_module, "_PLAN_CACHE", 3)

    def cleared_when_full(cache, key, make):
        if key not in cache:
            if len(cache) >= planner_module._PLAN_CACHE:
                cache.clear()
            cache[key] = make()
        return cache[key]

    monkeypatch.setattr(planner_module, "_lru", cleared_when_full)
    acc = Accountant(Budget(10.0))
    made = _plan_misses(monkeypatch, acc, ["a", "b", "c", "a", "d", "a", "c", "d", "b"])
    assert made == ["a", "b", "c", "d", "a", "c", "b"]


def test_record_invariant_every_account_debited_with_the_records_cost(make):
    """Replays each record: for EVERY account it lists, rule.debit(previous state, cost) is the
    state it records. (The auditor relies on exactly this.)"""
    acc = make(POLICY)
    acc.release(Laplace(0.2, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    acc.release(AnalyticGaussian(0.3, delta=1e-7, sensitivity=1.0), 1.0, dataset=("adult", "census"), analyst="bob")
    with acc.pipeline("p", dataset="adult", analyst="alice", budget=Budget(0.3, 1e-8)) as p:
        p.release(Laplace(0.1, sensitivity=1.0), 1.0)
        with p.pipeline("q", budget=Budget(0.1)) as q:
            q.release(Laplace(0.05, sensitivity=1.0), 1.0)
    replay_ledger(acc.ledger)


# -- concurrent callers never overspend any limit a policy declares (the check and the debit of
# every applicable account are one ledger transaction)

CONCURRENT_POLICY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    [datasets.adult.analysts.alice]
    limit = { epsilon = 0.5 }
"""


def test_threads_on_two_accountants_share_one_analyst_limit(write, tmp_path):
    db = tmp_path / "budget.db"
    policy = write(CONCURRENT_POLICY)
    accs = [Accountant.from_policy(policy, ledger=db, rng=i, simulation=True) for i in range(2)]
    admitted = []

    def work(acc):
        n = 0
        while True:
            try:
                acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
            except BudgetExceededError as e:
                assert e.account == "dataset:adult/analyst:alice"
                break
            n += 1
        admitted.append(n)

    threads = [threading.Thread(target=work, args=(accs[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 50
    assert accs[0].spent("adult", analyst="alice").epsilon == pytest.approx(0.5)
    assert accs[1].spent("adult") == accs[0].spent("adult", analyst="alice")
    for acc in accs:
        acc.close()


def test_concurrent_pipelines_never_overspend_the_parent(write):
    acc = Accountant.from_policy(write(CONCURRENT_POLICY), rng=0)
    opened = []

    def work():
        try:
            with acc.pipeline("p", dataset="adult", analyst="alice", budget=Budget(0.2)) as p:
                opened.append(p.id)
        except BudgetExceededError:
            pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 2 and len(set(opened)) == 2  # 2 × 0.2 fit alice's 0.5; ids distinct


def test_policy_accounts_declares_one_account_per_limit_with_inheritance() -> None:
    """``policies.accounts``: every limit of a policy is one account under its documented key; a
    dataset's analyst inherits the dataset's rule and window, a top-level analyst the policy's;
    a windowed key maps back to its limit, and a key no limit declares has none (the negative
    control: a dataset the policy does not list, a pipeline's account)."""
    policy = Policy.model_validate(tomllib.loads(
        'limit = { epsilon = 10.0 }\ncomposition = "basic"\n'
        '[datasets.adult]\nlimit = { epsilon = 2.0 }\ncomposition = "advanced"\nperiod = "1d"\n'
        '[datasets.adult.analysts.alice]\nlimit = { epsilon = 1.0 }\n'
        '[analysts.bob]\nlimit = { epsilon = 3.0 }\n'))
    specs = policy_accounts(policy)
    assert set(specs) == {"global", "dataset:adult", "dataset:adult/analyst:alice", "analyst:bob"}
    alice, bob = specs["dataset:adult/analyst:alice"], specs["analyst:bob"]
    assert (alice.rule.name, alice.dataset, alice.period is not None) == ("advanced", "adult", True)
    assert (bob.rule.name, bob.dataset, bob.period) == ("basic", None, None)
    now = 1_795_255_200.0
    key = alice.key_at(now)
    assert key != alice.key and key.startswith(alice.key) and bob.key_at(now) == bob.key
    assert dataset_name(specs["dataset:adult"].key_at(now)) == "adult" and dataset_name(key) is None
    limits = PolicyLimits(policy)
    assert limits.limit_for(key) == Budget(1.0) and limits.limit_for("analyst:bob") == Budget(3.0)
    assert limits.limit_for("dataset:other") is None and limits.limit_for("pipeline:r#1") is None
