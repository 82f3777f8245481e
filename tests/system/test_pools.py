"""A refusal inside a process pool reaches the parent as itself (issue 32).

``multiprocessing.Pool.map`` (fork and spawn), ``concurrent.futures.ProcessPoolExecutor`` and joblib
send a worker's exception back pickled. Before ``PrivacyError.__reduce__`` the parent could not
rebuild a ``BudgetExceededError``: ``Pool.map`` waited for good (its result thread died) and the
executors reported ``BrokenProcessPool``, losing the refusal. Every wait here has a timeout, so a
hang fails the test instead of blocking CI. Each negative control re-creates the old behaviour in
the worker (Python's default reduce) and shows the pool hang or break.
"""

from __future__ import annotations

import copyreg
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.values.errors import PrivacyError
from dpbudget.mechanisms import Laplace

WAIT = 120  # seconds: a cold spawned worker imports the library on a slow, shared machine
CONTEXTS = ["spawn"] + (["fork"] if hasattr(os, "fork") else [])


def _release(job: tuple[str | None, float, bool]) -> float:
    """In the worker: one release of ε where 0.75 of a limit of 1 is spent (``old``: with
    Python's default exception reduce, the behaviour before the fix).

    The ledger is the SQLite file at ``url``, or (``None``) an in-memory one spent here: a child
    forked from a process that had opened SQLite refuses SQLite (``ledger.sqlite``), and the test
    process may have opened one in any earlier test."""
    url, epsilon, old = job
    if old:
        PrivacyError.__reduce__ = Exception.__reduce__  # type: ignore[method-assign]
        for cls in list(copyreg.dispatch_table):  # (a forked worker inherits reducers that a
            if isinstance(cls, type) and issubclass(cls, BaseException):  # library registered
                del copyreg.dispatch_table[cls]  # in its parent: distributed's tblib does)
    with Accountant(Budget(1.0), ledger=url) as acc:
        if url is None:
            acc.release(Laplace(0.75, sensitivity=1.0), 1.0, dataset="adult")
        return float(acc.release(Laplace(epsilon, sensitivity=1.0), 1.0, dataset="adult"))


def _ledger(tmp_path: Path, method: str) -> str | None:
    """For spawn, an SQLite ledger with 0.75 of its 1.0 spent: a release of 0.5 is refused."""
    if method == "fork":
        return None
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(0.75, sensitivity=1.0), 1.0, dataset="adult")
    return url


def _assert_the_refusal(err: BaseException, url: str | None, spent: float = 0.875) -> None:
    """``err`` is the refusal as the worker raised it; the ledger holds only what was answered
    (0.75, and 0.125 after the refusal): the refusal debited nothing."""
    assert type(err) is BudgetExceededError
    assert err.account == "dataset:adult" and err.dataset == "adult"
    assert err.requested == Budget(0.5) and err.remaining == Budget(0.25)
    if url is not None:
        with Accountant(Budget(1.0), ledger=url) as acc:
            assert acc.spent("adult") == Budget(spent)


def _kill_pool(pool: Any, before: set[Any]) -> None:
    try:  # a result thread that died unpickling the error: terminate() may assert so
        pool.terminate()
    except AssertionError:
        pass
    for worker in set(multiprocessing.active_children()) - before:
        worker.kill()
        worker.join()


@pytest.mark.parametrize("method", CONTEXTS)
def test_a_refusal_in_pool_map_reaches_the_parent_as_itself(tmp_path: Path,
                                                            method: str) -> None:
    url = _ledger(tmp_path, method)
    with multiprocessing.get_context(method).Pool(2) as pool:
        pending = pool.map_async(_release, [(url, 0.5, False)] * 2)
        with pytest.raises(BudgetExceededError) as caught:
            pending.get(timeout=WAIT)  # without a picklable error: a TimeoutError, not a hang
        assert pool.map(_release, [(url, 0.125, False)]) != []  # the pool still works
    _assert_the_refusal(caught.value, url)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("method", CONTEXTS)
def test_negative_control_pool_map_hangs_on_the_old_reduce(tmp_path: Path,
                                                          method: str) -> None:
    url = _ledger(tmp_path, method)
    before = set(multiprocessing.active_children())
    pool = multiprocessing.get_context(method).Pool(1)
    try:
        with pytest.raises(multiprocessing.TimeoutError):
            pool.map_async(_release, [(url, 0.5, True)]).get(timeout=20)
    finally:
        _kill_pool(pool, before)


@pytest.mark.parametrize("method", CONTEXTS)
def test_a_refusal_in_a_process_pool_executor_reaches_the_parent_as_itself(
        tmp_path: Path, method: str) -> None:
    url = _ledger(tmp_path, method)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
        with pytest.raises(BudgetExceededError) as caught:
            pool.submit(_release, (url, 0.5, False)).result(timeout=WAIT)
        assert pool.submit(_release, (url, 0.125, False)).result(timeout=WAIT) is not None
    _assert_the_refusal(caught.value, url)


@pytest.mark.parametrize("method", CONTEXTS)
def test_negative_control_the_executor_breaks_on_the_old_reduce(tmp_path: Path,
                                                               method: str) -> None:
    url = _ledger(tmp_path, method)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
        with pytest.raises(BrokenProcessPool):  # the refusal itself is lost
            pool.submit(_release, (url, 0.5, True)).result(timeout=WAIT)


def test_a_refusal_under_joblib_reaches_the_parent_as_itself(tmp_path: Path) -> None:
    joblib = pytest.importorskip("joblib")
    url = _ledger(tmp_path, "spawn")  # (loky starts its workers fresh, not forked)
    with pytest.raises(BudgetExceededError) as caught:
        joblib.Parallel(n_jobs=2, backend="loky", timeout=WAIT)(
            joblib.delayed(_release)((url, 0.5, False)) for _ in range(2))
    _assert_the_refusal(caught.value, url, spent=0.75)


def test_negative_control_joblib_loses_the_refusal_on_the_old_reduce(tmp_path: Path) -> None:
    joblib = pytest.importorskip("joblib")
    url = _ledger(tmp_path, "spawn")
    with pytest.raises(BrokenProcessPool):  # loky's, a subclass: "a result has failed to
        joblib.Parallel(n_jobs=2, backend="loky", timeout=WAIT)(  # un-serialize"
            [joblib.delayed(_release)((url, 0.5, True))] * 2)
