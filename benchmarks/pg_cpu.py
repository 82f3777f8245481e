"""CPU time per release on PostgreSQL, the client's and the server's, beside the raw single-row
floor, in one run (issue 12): what bounds releases per second once the machine's cores are busy.

One process makes ``--releases`` releases on one dataset through ``Accountant.open(url)`` (durable
defaults), then the raw floor runs the same number of its single-row transactions (psycopg, one
round trip: BEGIN, single-row UPDATE, INSERT of 520 characters, COMMIT), alternately for
``--rounds`` rounds. Client CPU: this process's ``time.process_time()``. Server CPU: user + system
time of the server processes serving the connections (``/proc/<pid>/stat``, so the server must run
on this machine: the script starts a throw-away one as the tests do). Background processes (WAL
writer, checkpointer) are left out of both.

A third row, for diagnosis only, repeats dpbudget's releases on a second throw-away ledger whose
server-side checks (the triggers on its entries and accounts, ``ledger/postgres/schema.sql``)
are disabled by its owner: what those checks cost the server. A ledger is never run so.

With ``c`` cores and ``t`` µs of CPU per release (client + server), no number of processes can
exceed ``c / t`` releases per second: the CPU ceiling printed for both.

Run from a checkout: ``PYTHONPATH=. python benchmarks/pg_cpu.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms import Laplace

_TICK = os.sysconf("SC_CLK_TCK")
_RECORD = "x" * 520
_BARE = "diagnosis: dpbudget, server checks disabled"


def _cpu(pids: list[int]) -> float:
    """User + system seconds of processes ``pids`` so far."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _backends(conn: Any) -> list[int]:
    return [row[0] for row in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> "
        "pg_backend_pid()")]


def _timed(step: Any, n: int, pids: list[int]) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) µs per call of ``step``."""
    server, client, wall = _cpu(pids), time.process_time(), time.perf_counter()
    for _ in range(n):
        step()
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - client) / n * 1e6,
            (_cpu(pids) - server) / n * 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--releases", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import psycopg

    from tests import _postgres

    if _postgres.available() is not None:
        print(f"PostgreSQL unavailable: {_postgres.available()}")
        return 1
    cores = os.cpu_count() or 1
    print(f"Run at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {cores} cores; "
          f"1-minute load {os.getloadavg()[0]:.2f} at the start.\n")
    with _postgres.server() as dsn:
        url = _postgres.fresh_database(dsn)
        Accountant(Budget(1e9), ledger=url).close()
        acc = Accountant.open(url)
        mechanism = Laplace(1e-6, sensitivity=1.0)
        for _ in range(300):  # (the account exists, the plan cache settled)
            acc.release(mechanism, 1.0, dataset="d0")
        bare_url = _postgres.fresh_database(dsn)
        Accountant(Budget(1e9), ledger=bare_url).close()
        bare = Accountant.open(bare_url)
        # (Disabled once it is open: opening a ledger whose triggers are off sets them again.)
        with psycopg.connect(bare_url, autocommit=True) as owner:
            for table in ("dpbudget_entries", "dpbudget_accounts"):
                owner.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        for _ in range(300):
            bare.release(mechanism, 1.0, dataset="d0")
        raw = psycopg.connect(_postgres.fresh_database(dsn), autocommit=True)
        raw.execute("CREATE TABLE acc (k TEXT PRIMARY KEY, v BIGINT)")
        raw.execute("CREATE TABLE ent (id BIGSERIAL PRIMARY KEY, k TEXT, rec TEXT)")
        raw.execute("INSERT INTO acc VALUES ('k0', 0)")
        cursor = psycopg.ClientCursor(raw)
        sql = ("BEGIN; UPDATE acc SET v = v + 1 WHERE k = %s; INSERT INTO ent (k, rec) VALUES "
               "(%s, %s); COMMIT")
        with psycopg.connect(dsn, autocommit=True) as watcher:
            pids = _backends(watcher)
        rows: dict[str, list[tuple[float, float, float]]] = {
            "dpbudget": [], "raw floor": [], _BARE: []}
        for _ in range(args.rounds):
            rows["dpbudget"].append(_timed(
                lambda: acc.release(mechanism, 1.0, dataset="d0"), args.releases, pids))
            rows[_BARE].append(_timed(
                lambda: bare.release(mechanism, 1.0, dataset="d0"), args.releases, pids))
            rows["raw floor"].append(_timed(
                lambda: cursor.execute(sql, ("k0", "k0", _RECORD)), args.releases, pids))
        acc.close()
        bare.close()
        raw.close()
    print("| µs per release (median of rounds) | wall | client CPU | server CPU | CPU total "
          f"| CPU ceiling on {cores} cores |")
    print("|---|---:|---:|---:|---:|---:|")
    totals = {}
    for label, runs in rows.items():
        wall, client, server = (statistics.median(r[i] for r in runs) for i in range(3))
        totals[label] = client + server
        print(f"| {label} | {wall:.0f} | {client:.0f} | {server:.0f} | {client + server:.0f} "
              f"| {cores / (client + server) * 1e6:,.0f}/s |")
    print(f"\nCPU per release, the raw floor's ÷ dpbudget's: "
          f"{totals['raw floor'] / totals['dpbudget']:.2f}× (the most a CPU-bound run of "
          "dpbudget can reach of the floor's rate on the same machine).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
