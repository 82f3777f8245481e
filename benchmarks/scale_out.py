"""Releases per second from 1, 2, 4 and 8 processes, on one dataset and on distinct datasets, for
the SQLite and the PostgreSQL ledger, beside each backend's raw floor, in one run (issue 12).

Rows (each cell: the median of ``--rounds`` interleaved runs; every process does ``--releases``
operations after a barrier; rate = all operations / (last finish − first start)):

* dpbudget: ``Accountant.open(url).release(Laplace(1e-6), 1.0, dataset=...)``, durable defaults;
  "one dataset": every process on ``d0``; "distinct": process i on ``d<i>``.
* raw floor, SQLite: one durable transaction per operation on the same disk, no dpbudget code:
  ``BEGIN IMMEDIATE``, one INSERT of a 520-character record, one single-row UPDATE, ``COMMIT``,
  WAL + ``synchronous=FULL``.
* raw floor, PostgreSQL, pgbench: the server's own C client running the same transaction (BEGIN,
  single-row UPDATE, INSERT of 520 characters, END) with ``synchronous_commit`` on.
* raw floor, PostgreSQL, psycopg: the same transaction from Python, in one round trip.

Then: an overspend check (8 processes racing one dataset's last releases, on each backend: the
number admitted must be exactly what the limit admits, and the audit must pass), and the
in-memory gate beside its essential floor (one dict update, SHA-256 of a 520-byte record, one
CSPRNG draw of 8 bytes), by CPU time.

``--parts threads --backends postgres`` runs only the threads sharing one accountant (1, 2, 4, 8
threads, ``--threads``); with ``PYTHONPATH`` set to another revision's tree it times that revision.

Run from a checkout: ``PYTHONPATH=. python benchmarks/scale_out.py`` (PostgreSQL rows need the
server binaries and psycopg; the script starts a throw-away server as the tests do).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import platform
import queue
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.audit.run import audit
from dpbudget.mechanisms import Laplace

_RECORD = "x" * 520
_CTX = mp.get_context("forkserver")  # (a fork of this process, which opened SQLite, is refused it)


# -- workers (run in child processes) ------------------------------------------------------------

def _dpbudget(url: str, i: int, distinct: bool, n: int) -> Callable[[], None]:
    acc = Accountant.open(url)
    mechanism = Laplace(1e-6, sensitivity=1.0)
    dataset = f"d{i}" if distinct else "d0"
    acc.release(mechanism, 1.0, dataset=dataset)  # opened, account created: not timed
    return lambda: acc.release(mechanism, 1.0, dataset=dataset)


def _sqlite_raw(path: str, i: int, distinct: bool, n: int) -> Callable[[], None]:
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    key = f"k{i}" if distinct else "k0"

    def step() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO ent (k, rec) VALUES (?, ?)", (key, _RECORD))
        conn.execute("UPDATE acc SET v = v + 1 WHERE k = ?", (key,))
        conn.execute("COMMIT")
    return step


def _psycopg_raw(dsn: str, i: int, distinct: bool, n: int) -> Callable[[], None]:
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    cursor = psycopg.ClientCursor(conn)
    key = f"k{i}" if distinct else "k0"
    sql = ("BEGIN; UPDATE acc SET v = v + 1 WHERE k = %s; INSERT INTO ent (k, rec) VALUES "
           "(%s, %s); COMMIT")
    return lambda: cursor.execute(sql, (key, key, _RECORD))


def _child(make: Any, target: str, i: int, distinct: bool, n: int, barrier: Any,
           out: Any) -> None:
    step = make(target, i, distinct, n)
    barrier.wait()
    start = time.perf_counter()
    for _ in range(n):
        step()
    out.put((start, time.perf_counter()))


def _run(make: Any, target: str, processes: int, distinct: bool, n: int) -> float:
    barrier, out = _CTX.Barrier(processes), _CTX.Queue()
    children = [_CTX.Process(target=_child, args=(make, target, i, distinct, n, barrier, out))
                for i in range(processes)]
    for child in children:
        child.start()
    times: list[tuple[float, float]] = []
    while len(times) < processes:  # (a worker that died says so at once, never a 10-minute wait)
        try:
            times.append(out.get(timeout=1.0))
        except queue.Empty:
            if any(child.exitcode not in (None, 0) for child in children):
                raise RuntimeError("a worker failed before it finished its releases") from None
    for child in children:
        child.join()
        if child.exitcode:
            raise RuntimeError(f"a worker failed (exit code {child.exitcode})")
    return processes * n / (max(t[1] for t in times) - min(t[0] for t in times))


def threads(url: str, count: int, n: int) -> float:
    """Releases per second from ``count`` threads sharing one accountant on one dataset (group
    commit within a process: the threads' commits share syncs)."""
    import threading

    acc = Accountant.open(url)
    mechanism = Laplace(1e-6, sensitivity=1.0)
    acc.release(mechanism, 1.0, dataset="d0")
    barrier = threading.Barrier(count + 1)

    def work() -> None:
        barrier.wait()
        for _ in range(n):
            acc.release(mechanism, 1.0, dataset="d0")

    workers = [threading.Thread(target=work) for _ in range(count)]
    for worker in workers:
        worker.start()
    barrier.wait()
    start = time.perf_counter()
    for worker in workers:
        worker.join()
    rate = count * n / (time.perf_counter() - start)
    acc.close()
    return rate


# -- backends --------------------------------------------------------------------------------------

class _Sqlite:
    name = "SQLite"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.count = 0

    def dpbudget_target(self, limit: float = 1e6) -> str:
        self.count += 1
        url = f"sqlite:///{self.directory / f'ledger{self.count}.db'}"
        Accountant(Budget(limit), ledger=url).close()
        return url

    def raw_target(self) -> str:
        self.count += 1
        path = str(self.directory / f"raw{self.count}.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE acc (k TEXT PRIMARY KEY, v INTEGER)")
        conn.execute("CREATE TABLE ent (id INTEGER PRIMARY KEY, k TEXT, rec TEXT)")
        conn.executemany("INSERT INTO acc VALUES (?, 0)", [(f"k{i}",) for i in range(64)])
        conn.close()
        return path

    def floors(self) -> list[tuple[str, Any]]:
        return [("raw floor: 1 durable transaction per operation (Python sqlite3)",
                 lambda p, d, n: _run(_sqlite_raw, self.raw_target(), p, d, n))]


class _Postgres:
    name = "PostgreSQL"

    def __init__(self, maintenance_dsn: str) -> None:
        from tests import _postgres

        self.fresh = lambda: _postgres.fresh_database(maintenance_dsn)
        self.pgbench = _postgres._bin("pgbench")

    def dpbudget_target(self, limit: float = 1e6) -> str:
        url = self.fresh()
        Accountant(Budget(limit), ledger=url).close()
        return url

    def raw_target(self) -> str:
        import psycopg

        dsn = self.fresh()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE acc (k TEXT PRIMARY KEY, v BIGINT)")
            conn.execute("CREATE TABLE ent (id BIGSERIAL PRIMARY KEY, k TEXT, rec TEXT)")
            for i in range(64):
                conn.execute("INSERT INTO acc VALUES (%s, 0)", (f"k{i}",))
        return dsn

    def floors(self) -> list[tuple[str, Any]]:
        rows = [("raw floor: the same transaction from psycopg, one round trip",
                 lambda p, d, n: _run(_psycopg_raw, self.raw_target(), p, d, n))]
        if self.pgbench is not None:
            rows.insert(0, ("raw floor: pgbench (C client), the same transaction", self._pgbench))
        return rows

    def _pgbench(self, processes: int, distinct: bool, n: int) -> float:
        key = "'k' || :client_id" if distinct else "'k0'"
        script = Path(tempfile.mkdtemp()) / "tx.sql"
        script.write_text(f"BEGIN;\nUPDATE acc SET v = v + 1 WHERE k = {key};\n"
                          f"INSERT INTO ent (k, rec) VALUES ({key}, '{_RECORD}');\nEND;\n")
        result = subprocess.run([str(self.pgbench), "-n", "-f", str(script), "-c",
                                 str(processes), "-j", str(processes), "-t", str(n),
                                 self.raw_target()], capture_output=True, text=True, check=True)
        shutil.rmtree(script.parent)
        found = re.search(r"tps = ([0-9.]+) \(without initial", result.stdout)
        if found is None:
            raise RuntimeError(f"cannot read pgbench's output: {result.stdout[-300:]}")
        return float(found.group(1))


# -- the run -----------------------------------------------------------------------------------------

def scale(backend: Any, processes: list[int], n: int, rounds: int) -> dict[str, dict[int, float]]:
    rows: dict[str, dict[int, list[float]]] = {}
    subjects: list[tuple[str, Any]] = [
        ("dpbudget, one dataset", lambda p, d, n: _run(_dpbudget, backend.dpbudget_target(),
                                                       p, False, n)),
        ("dpbudget, distinct datasets", lambda p, d, n: _run(_dpbudget, backend.dpbudget_target(),
                                                             p, True, n)),
    ]
    for label, floor in backend.floors():
        subjects += [(f"{label}, one row", lambda p, d, n, f=floor: f(p, False, n)),
                     (f"{label}, distinct rows", lambda p, d, n, f=floor: f(p, True, n))]
    for _ in range(rounds):
        for p in processes:
            for label, run in subjects:
                rows.setdefault(label, {}).setdefault(p, []).append(run(p, None, n))
                print(f"  {backend.name} {label} p={p}: {rows[label][p][-1]:,.0f}/s",
                      file=sys.stderr, flush=True)
    return {label: {p: statistics.median(v) for p, v in cells.items()}
            for label, cells in rows.items()}


def _race(url: str, i: int, distinct: bool, n: int) -> Callable[[], None]:
    acc = Accountant.open(url)

    def step() -> None:
        try:
            acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="d0")
        except BudgetExceededError:
            pass
    return step


def overspend(backend: Any, limit: float = 1.0, processes: int = 8, attempts: int = 40) -> str:
    """``processes`` × ``attempts`` releases of ε = 0.01 racing for one dataset limited to ε =
    ``limit``: exactly what the limit admits must be admitted, and the audit must pass."""
    url = backend.dpbudget_target(limit)
    expected = Accountant(Budget(limit)).max_releases(Laplace(0.01, sensitivity=1.0), dataset="d0")
    _run(_race, url, processes, False, attempts)
    acc = Accountant.open(url)
    report = audit(acc.ledger)
    admitted = sum(1 for e in acc.ledger.entries() if e.record.get("kind") == "release")
    acc.close()
    verdict = "no overspend" if admitted == expected and report.ok else "OVERSPEND OR AUDIT FAILURE"
    return (f"{backend.name}: {processes} processes × {attempts} attempts of ε = 0.01 on one "
            f"dataset limited to ε = {limit}: {admitted} admitted (the limit admits {expected}), "
            f"audit {'passes' if report.ok else 'FAILS'}: {verdict}")


def in_memory(n: int = 20000) -> tuple[float, float]:
    """CPU µs per release: the in-memory gate, and its essential floor."""
    acc = Accountant(Budget(1e9))
    mechanism = Laplace(1e-9, sensitivity=1.0)
    for _ in range(1000):
        acc.release(mechanism, 1.0, dataset="d")
    start = time.process_time()
    for _ in range(n):
        acc.release(mechanism, 1.0, dataset="d")
    ours = (time.process_time() - start) / n * 1e6
    state: dict[str, float] = {"d": 0.0}
    record = _RECORD.encode()
    start = time.process_time()
    for _ in range(n):
        state["d"] = state["d"] + 1e-9
        hashlib.sha256(record).hexdigest()
        os.urandom(8)
    floor = (time.process_time() - start) / n * 1e6
    return ours, floor


def table(name: str, rows: dict[str, dict[int, float]], processes: list[int]) -> str:
    head = ("| " + name + " | " + " | ".join(f"{p} proc." for p in processes)
            + f" | {processes[-1]} vs {processes[0]} |")
    lines = [head, "|---|" + "---:|" * (len(processes) + 1)]
    for label, cells in rows.items():
        lines.append(f"| {label} | " + " | ".join(f"{cells[p]:,.0f}/s" for p in processes)
                     + f" | ×{cells[processes[-1]] / cells[processes[0]]:.2f} |")
    ratios = []
    for kind in ("one", "distinct"):
        ours = rows[f"dpbudget, {'one dataset' if kind == 'one' else 'distinct datasets'}"]
        for label, cells in rows.items():
            if label.startswith("raw floor") and label.endswith(kind + (" row" if kind == "one"
                                                                         else " rows")):
                ratios.append(f"- dpbudget, {kind} dataset(s) ÷ {label}: " + ", ".join(
                    f"{ours[p] / cells[p]:.2f}× at {p}" for p in processes))
    return "\n".join(lines + [""] + ratios)


_PARTS = ("scale", "threads", "overspend", "memory")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--releases", type=int, default=300, help="per process and cell")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--parts", nargs="+", default=list(_PARTS), choices=_PARTS,
                        help="what to run (default: all)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args(argv)
    started = time.time()
    print(f"Run at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} "
          f"cores, {platform.platform()}, Python {platform.python_version()}, SQLite "
          f"{sqlite3.sqlite_version}; 1-minute load {os.getloadavg()[0]:.2f} at the start.\n")
    with tempfile.TemporaryDirectory() as directory:
        backends: list[Any] = []
        if "sqlite" in args.backends:
            backends.append(_Sqlite(Path(directory)))
        server = None
        if "postgres" in args.backends:
            from tests import _postgres

            if _postgres.available() is None:
                server = _postgres.server()
                backends.append(_Postgres(server.__enter__()))
            else:
                print(f"(PostgreSQL skipped: {_postgres.available()})\n")
        try:
            for backend in backends if "scale" in args.parts else ():
                rows = scale(backend, args.processes, args.releases, args.rounds)
                print(table(backend.name, rows, args.processes) + "\n")
            for backend in backends if "threads" in args.parts else ():
                counts = args.threads
                cells = {t: statistics.median(threads(backend.dpbudget_target(), t,
                                                      args.releases) for _ in range(args.rounds))
                         for t in counts}
                print(f"- {backend.name}, threads sharing one accountant on one dataset: "
                      + ", ".join(f"{cells[t]:,.0f}/s with {t}" for t in counts)
                      + f" (×{cells[counts[-1]] / cells[counts[0]]:.2f})")
            for backend in backends if "overspend" in args.parts else ():
                print("- " + overspend(backend))
        finally:
            if server is not None:
                server.__exit__(None, None, None)
    if "memory" in args.parts:
        ours, floor = in_memory()
        print(f"\nIn memory, by CPU time: a release costs {ours:.1f} µs, the essential floor "
              f"{floor:.1f} µs: {floor / ours:.2f}× the floor.")
    print(f"\nTook {time.time() - started:.0f} s; 1-minute load {os.getloadavg()[0]:.2f} at the end.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
