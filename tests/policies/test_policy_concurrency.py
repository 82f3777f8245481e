"""Concurrent callers never overspend any limit a policy declares (the check and the debit of every
applicable account are one ledger transaction)."""

from __future__ import annotations

import threading

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.mechanisms import Laplace

POLICY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    [datasets.adult.analysts.alice]
    limit = { epsilon = 0.5 }
"""


def test_threads_on_two_accountants_share_one_analyst_limit(write, tmp_path):
    db = tmp_path / "budget.db"
    policy = write(POLICY)
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
    acc = Accountant.from_policy(write(POLICY), rng=0)
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
