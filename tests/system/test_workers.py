"""Worker processes: every dpbudget error reaches the parent as itself, and the multi-process
patterns docs/getting-started.md documents ("Several processes") run as shown.

``multiprocessing`` sends a worker's exception back pickled. Python rebuilds an exception by
calling its class with ``args`` (its message), which fails for a class whose ``__init__`` takes
other arguments: ``Pool.map`` then waits for the result for good (the result handler thread dies).
Each test that could hang has a timeout, so it fails instead.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dpbudget.accountant.values.errors as errors
from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.mechanisms import Laplace

ROOT = Path(__file__).resolve().parents[2]

# One instance of every error class in accountant/values/errors.py, built as the library builds it.
INSTANCES: dict[type[BaseException], BaseException] = {
    errors.PrivacyError: errors.PrivacyError("root"),
    errors.InvalidArgumentError: errors.InvalidArgumentError("epsilon", -1.0, "> 0", "hint"),
    errors.InvalidTypeError: errors.InvalidTypeError("budget", 3, "a Budget"),
    errors.InvalidDataError: errors.InvalidDataError("data", [1.0, 2.0], "finite", "; data[1]"),
    errors.InvalidDataTypeError: errors.InvalidDataTypeError("data", {"a": 1}, "a sequence"),
    errors.UnknownDatasetError: errors.UnknownDatasetError("adult", ("census",)),
    errors.UnknownAnalystError: errors.UnknownAnalystError("eve", "datasets.adult", ("ann",)),
    errors.AnalystMismatchError: errors.AnalystMismatchError("eve", "ann"),
    errors.PolicyError: errors.PolicyError("datasets.adult.limit", "must be finite", "p.toml"),
    errors.BudgetExceededError: errors.BudgetExceededError(
        Budget(0.5), Budget(0.25), "adult", "analyst:ann", "a reason"),
    errors.MechanismNotAllowedError: errors.MechanismNotAllowedError("not allowed"),
    errors.WindowEndedError: errors.WindowEndedError("ended", 1_700_000_000.0),
    errors.MechanismExhaustedError: errors.MechanismExhaustedError("spent", 7, 3),
    errors.SamplerSpentError: errors.SamplerSpentError("spent"),
    errors.LedgerError: errors.LedgerError("cannot open"),
    errors.LedgerUnconfirmedError: errors.LedgerUnconfirmedError("committed, not confirmed"),
    errors.LedgerStaleError: errors.LedgerStaleError("stale"),
    errors.LedgerCorruptedError: errors.LedgerCorruptedError("broken chain"),
    errors.LedgerConflictError: errors.LedgerConflictError("other rule"),
    errors.OwnerKeyError: errors.OwnerKeyError("no key"),
    errors.PolicyChangedError: errors.PolicyChangedError("changed"),
    errors.UnitRequiredError: errors.UnitRequiredError("events", "a raw value"),
}


def _error_classes() -> list[type[BaseException]]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == errors.__name__]


def test_every_error_class_has_an_instance_here() -> None:
    assert set(_error_classes()) == set(INSTANCES)
    assert len(INSTANCES) >= 20


@pytest.mark.parametrize("cls", list(INSTANCES), ids=lambda c: c.__name__)
def test_every_error_pickles_with_its_attributes(cls: type[BaseException]) -> None:
    err = INSTANCES[cls]
    err.add_note("a note")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert back.args == err.args and str(back) == str(err)
    assert vars(back) == vars(err)  # every attribute, the note included


def test_negative_control_the_default_reduce_does_not_round_trip(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``PrivacyError.__reduce__`` (Python's default), 9 of the classes fail to unpickle:
    the failure the tests above would miss if they tested nothing."""
    monkeypatch.setattr(errors.PrivacyError, "__reduce__", Exception.__reduce__)
    broken = []
    for cls, err in INSTANCES.items():
        try:
            pickle.loads(pickle.dumps(err))
        except TypeError:
            broken.append(cls.__name__)
    assert "BudgetExceededError" in broken and len(broken) >= 9


def test_an_attribute_that_cannot_be_pickled_travels_as_its_description() -> None:
    err = errors.InvalidTypeError("mechanism", lambda: None, "a Mechanism")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.InvalidTypeError and str(back) == str(err)
    assert back.value == "a function" and back.argument == "mechanism"


# -- a refusal inside Pool.map (spawn) reaches the parent as itself ----------------------------

_worker: Accountant | None = None


def _open(url: str) -> None:
    global _worker
    _worker = Accountant(Budget(1.0), ledger=url)


def _release(epsilon: float) -> float:
    assert _worker is not None
    return float(_worker.release(Laplace(epsilon, sensitivity=1.0), 1.0, dataset="adult"))


def test_a_refusal_in_a_spawned_pool_reaches_the_parent_as_itself(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(0.75, sensitivity=1.0), 1.0, dataset="adult")
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1, initializer=_open, initargs=(url,)) as pool:
        pending = pool.map_async(_release, [0.5])
        with pytest.raises(BudgetExceededError) as caught:
            pending.get(timeout=120)  # without a picklable error: a TimeoutError here, not a hang
    assert caught.value.account == "dataset:adult" and caught.value.dataset == "adult"
    assert caught.value.requested == Budget(0.5)
    with Accountant(Budget(1.0), ledger=url) as acc:
        assert acc.spent("adult") == Budget(0.75)  # the refusal debited nothing


def _open_with_default_reduce(url: str) -> None:
    errors.PrivacyError.__reduce__ = Exception.__reduce__  # type: ignore[method-assign]
    _open(url)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_negative_control_an_unpicklable_refusal_never_reaches_the_parent(
        tmp_path: Path) -> None:
    """The worker sends the refusal with Python's default reduce: the parent cannot rebuild it,
    and ``Pool.map`` would wait for good (bounded here by the timeout)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(0.75, sensitivity=1.0), 1.0, dataset="adult")
    spawn = multiprocessing.get_context("spawn")
    before = set(multiprocessing.active_children())
    pool = spawn.Pool(1, initializer=_open_with_default_reduce, initargs=(url,))
    try:
        with pytest.raises(multiprocessing.TimeoutError):
            pool.map_async(_release, [0.5]).get(timeout=20)
    finally:
        try:  # the pool's result thread died unpickling the error: terminate() may assert so
            pool.terminate()
        except AssertionError:
            pass
        for worker in set(multiprocessing.active_children()) - before:
            worker.kill()
            worker.join()


# -- the documented patterns run as shown -------------------------------------------------------

_SCRIPT = re.compile(r"```python\n# (\S+\.py), run as:[^\n]*\n(.*?)```\n\n```text\n(.*?)```",
                     re.S)


def _documented() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = text[text.index("## Several processes"):]
    return {name: (code, out) for name, code, out in _SCRIPT.findall(section)}


def test_the_docs_show_each_pattern() -> None:
    assert set(_documented()) == {"spawn_workers.py", "postgres_workers.py",
                                  "fork_then_open.py", "unsupported.py"}


def _run(tmp_path: Path, name: str, url: str) -> None:
    code, expected = _documented()[name]
    script = tmp_path / name
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DPBUDGET_LEDGER_KEY", None)
    done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True,
                          timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == expected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork patterns need POSIX fork")
@pytest.mark.parametrize("name", ["spawn_workers.py", "fork_then_open.py", "unsupported.py"])
def test_a_documented_sqlite_pattern_runs_as_shown(tmp_path: Path, name: str) -> None:
    _run(tmp_path, name, f"sqlite:///{tmp_path / 'budget.db'}")


@pytest.mark.postgres
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork patterns need POSIX fork")
def test_the_documented_postgres_pattern_runs_as_shown(tmp_path: Path,
                                                       postgres_database: str) -> None:
    from tests.conftest import _fresh_schema

    _run(tmp_path, "postgres_workers.py", _fresh_schema(postgres_database))
