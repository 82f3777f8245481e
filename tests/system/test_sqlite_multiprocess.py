"""Several processes on one SQLite ledger: each sees the others' debits, and together they never
overspend (``BEGIN IMMEDIATE`` makes check-and-debit one exclusive step across processes).

Workers are separate interpreters (``subprocess`` + ``sys.executable -c``) with ``PYTHONPATH`` set
to the repository root, so nothing is shared but the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerError
from dpbudget.accountant.ledger import SqliteLedger
from dpbudget.accountant.ledger import sqlite as sqlite_module
from dpbudget.mechanisms import Laplace
from tests.support import SEED, assert_chain

ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent("""
    import json, os, sys, time
    from dpbudget.accountant import Accountant, Budget, BudgetExceededError
    from dpbudget.mechanisms import Laplace

    path, releases, go, open_first = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    acc = None
    if open_first == "1":
        acc = Accountant(Budget(1.0), ledger="sqlite:///" + path)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.002)
    if acc is None:  # open concurrently with the other workers, on a file that may not exist yet
        acc = Accountant(Budget(1.0), ledger="sqlite:///" + path)
    admitted = refused = 0
    for _ in range(releases):
        try:
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult")
            admitted += 1
        except BudgetExceededError:
            refused += 1
    print(json.dumps({"admitted": admitted, "refused": refused}), flush=True)
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DPBUDGET_LEDGER_KEY", None)
    return env


def _run_workers(path: Path, tmp_path: Path, workers: int, releases: int,
                 open_first: bool) -> list[dict[str, int]]:
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(path), str(releases), str(go),
                               "1" if open_first else "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(), cwd=tmp_path) for _ in range(workers)]
    try:
        for p in procs:  # wait until every worker has imported (and maybe opened): then start all
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read()
        go.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_second_process_sees_first_processes_debits(tmp_path: Path) -> None:
    path = tmp_path / "budget.db"
    parent = Accountant(Budget(1.0), ledger=f"sqlite:///{path}", rng=SEED, simulation=True)
    for _ in range(3):
        parent.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult")
    child = textwrap.dedent("""
        import json, sys
        from dpbudget.accountant import Accountant, Budget, BudgetExceededError
        from dpbudget.mechanisms import Laplace
        acc = Accountant(Budget(1.0), ledger="sqlite:///" + sys.argv[1])
        out = {"spent": acc.spent("adult").epsilon, "seq": acc.ledger.head()[0]}
        try:
            acc.release(Laplace(0.75, sensitivity=1.0), 1.0, dataset="adult")
            out["big"] = "admitted"
        except BudgetExceededError as exc:
            out["big"] = "refused"
            out["remaining"] = exc.remaining.epsilon
        acc.release(Laplace(0.7, sensitivity=1.0), 1.0, dataset="adult")
        out["after"] = acc.spent("adult").epsilon
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True,
                          text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["seq"] == 4  # record 1 states the ledger's policy
    assert seen["spent"] == pytest.approx(0.3, rel=1e-12) and seen["spent"] >= 0.3
    assert seen["big"] == "refused" and seen["remaining"] == pytest.approx(0.7, rel=1e-12)
    assert seen["after"] == pytest.approx(1.0, rel=1e-12)
    # ... and the first process, on its still-open connection, sees the child's debit.
    assert parent.spent("adult").epsilon == seen["after"]
    assert not parent.can_afford(Laplace(0.01, sensitivity=1.0), dataset="adult")
    with pytest.raises(BudgetExceededError):
        parent.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="adult")
    assert assert_chain(parent.ledger) == 4
    parent.close()


@pytest.mark.slow  # ~5 s: four interpreters start (numpy, scipy, pydantic) on two cores
def test_concurrent_processes_never_overspend(tmp_path: Path) -> None:
    """4 processes × 40 releases of ε = 0.01 against a limit of 1.0 (exactly 100 fit), all
    starting at the same moment. The ledger file is created first (creating it concurrently is
    tested deterministically in test_ledger.py)."""
    path = tmp_path / "budget.db"
    SqliteLedger(path).close()
    start = time.monotonic()
    results = _run_workers(path, tmp_path, workers=4, releases=40, open_first=True)
    assert time.monotonic() - start < 60
    assert sum(r["admitted"] for r in results) == 100
    assert sum(r["refused"] for r in results) == 60
    ledger = SqliteLedger(path)
    try:
        assert assert_chain(ledger) == 100
        (account,) = [a for a in ledger.accounts() if a.key != "policy"]
        assert account.seq == 101  # record 1 states the ledger's policy
        assert account.state["epsilon"] <= 1.0 * (1 + 1e-9)
        total = sum(e.record["cost"]["epsilon"] for e in ledger.entries())
        assert total <= 1.0 * (1 + 1e-9)
    finally:
        ledger.close()


# -- a -shm file deleted while the ledger is open (the reliability sweep's fault) -------------

STEPPED = textwrap.dedent("""
    import sys
    from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerError
    from dpbudget.accountant.ledger import sqlite
    from dpbudget.mechanisms import Laplace

    if sys.argv[2] == "old":  # the checks this test is about, switched off (negative control)
        sqlite._FILES = ("",)
        sqlite.SqliteLedger._shm_deleted = lambda self: False
    try:
        acc = Accountant(Budget(50.0), ledger="sqlite:///" + sys.argv[1])
    except LedgerError:
        print("refused", flush=True)
        sys.exit(0)
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            acc.release(Laplace(1.0, sensitivity=1.0), 1.0)
            print("answer", flush=True)
        except (BudgetExceededError, LedgerError) as exc:
            print(type(exc).__name__, flush=True)
""")


def _after_the_shm_is_deleted(tmp_path: Path, old: bool) -> tuple[int, int, str]:
    """Process A (this one) opens a ledger whose limit allows 50 answers; the -shm file is
    deleted; process B (a worker) opens the ledger; then A and B each ask for a release in turn,
    100 times. Returns the answers released, the release records the ledger then holds, and how
    B's open went. ``old``: without the checks, in both processes."""
    db = tmp_path / f"{old}.db"
    with pytest.MonkeyPatch.context() as mp:
        if old:
            mp.setattr(sqlite_module, "_FILES", ("",))
        acc = Accountant(Budget(50.0), ledger=f"sqlite:///{db}")
        return _in_turn(acc, db, old)


def _in_turn(acc: Accountant, db: Path, old: bool) -> tuple[int, int, str]:
    os.unlink(f"{db}-shm")
    worker = subprocess.Popen([sys.executable, "-c", STEPPED, str(db), "old" if old else "new"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=_env(), cwd=db.parent)
    assert worker.stdin is not None and worker.stdout is not None
    answers = 0
    try:
        opened = worker.stdout.readline().strip()
        for _ in range(100):
            try:
                acc.release(Laplace(1.0, sensitivity=1.0), 1.0)
                answers += 1
            except (BudgetExceededError, LedgerError):
                pass
            if opened == "ready":
                worker.stdin.write("release\n")
                worker.stdin.flush()
                answers += worker.stdout.readline().strip() == "answer"
        worker.stdin.close()
        assert worker.wait(timeout=120) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        worker.stdout.close()
    acc.close()
    with SqliteLedger(db, create=False) as reader:
        records = sum(e.record["kind"] == "release" for e in reader.entries())
    return answers, records, opened


def test_a_deleted_shm_file_lets_no_answer_past_the_limit_or_its_record(tmp_path: Path) -> None:
    """A refuses every debit (its -shm is not the file's any more) and B refuses to open a
    ledger whose -wal has lost its -shm: nothing is released, so nothing lacks its record."""
    answers, records, opened = _after_the_shm_is_deleted(tmp_path, old=False)
    assert opened == "refused"
    assert answers <= 50 and records == answers


def test_negative_control_without_the_checks_a_deleted_shm_overspends(tmp_path: Path) -> None:
    """The old behaviour (only the database file checked): each process locks its own -shm,
    both debit "under the write lock", and each overwrites the other's frames in the WAL —
    the sweep's figure: 100 answers under a limit of 50, half of them without a record."""
    answers, records, opened = _after_the_shm_is_deleted(tmp_path, old=True)
    assert opened == "ready"
    assert answers > 50 and records < answers
