"""``dpbudget status`` on small and large ledgers: its cost must not grow with the records (issue 32).

Status reads each account's running state from the accounts table, never the records: it costs
O(number of accounts). This script generates ledgers of 10^3 and 10^5 records (``--large`` adds
10^6) through the public API (an in-memory accountant, two datasets, three analysts, exported to
JSONL and imported into SQLite, as benchmarks/audit_large.py does), then times
``dpbudget status LEDGER`` (and ``--json``) in fresh processes: the CPU time of the command alone,
imports excluded, median over ``--rounds``. It prints each size's time and the ratio to the
smallest; the ledgers all have the same accounts, so equal times mean no per-record cost.

Run: ``python benchmarks/status_large.py [--large] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

_STATUS = """
import contextlib, io, json, sys, time
from dpbudget.accountant.cli import main
import dpbudget.accountant.audit.status, dpbudget.accountant.audit.text  # (imports not timed)
import dpbudget.accountant.gate.policy_record, dpbudget.policies.policy
out = {}
for argv in (["status", sys.argv[1]], ["status", "--json", sys.argv[1]]):
    with contextlib.redirect_stdout(io.StringIO()):
        t = time.process_time()
        assert main(argv) == 0
        out[" ".join(argv[:-1])] = time.process_time() - t
print(json.dumps(out))
"""


def generate(n: int, db: Path) -> float:
    """A SQLite ledger of ``n`` release records at ``db``; the seconds it took."""
    from dpbudget.accountant import Accountant, Budget
    from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
    from dpbudget.accountant.ledger import SqliteLedger
    from dpbudget.mechanisms import AnalyticGaussian, Laplace

    t = time.perf_counter()
    acc = Accountant(limits={"visits": Budget(1e6, 1e-3), "people": Budget(1e6, 1e-3)},
                     composition="basic")
    mechs = [Laplace(1e-6, sensitivity=1.0), AnalyticGaussian(1e-6, delta=1e-12, sensitivity=1.0)]
    analysts = ["alice", "bob", "carol"]
    for i in range(n):
        acc.release(mechs[i % 2], 1.0, dataset="visits" if i % 3 else "people",
                    analyst=analysts[i % 3])
    jsonl = db.with_suffix(".jsonl")
    export_jsonl(acc.ledger, jsonl)
    with SqliteLedger(db) as ledger:
        import_jsonl(jsonl, ledger, progress=False)
    jsonl.unlink()
    return time.perf_counter() - t


def time_status(db: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    out = subprocess.run([sys.executable, "-c", _STATUS, str(db)], capture_output=True,
                         text=True, env=env, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", action="store_true", help="also 10^6 records (minutes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    sizes = args.sizes or [1_000, 100_000] + ([1_000_000] if args.large else [])
    rows: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dbs = {}
        for n in sizes:
            dbs[n] = Path(tmp) / f"ledger-{n}.db"
            print(f"generating {n:,} records: {generate(n, dbs[n]):.0f} s", file=sys.stderr)
        runs: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
        for _ in range(args.rounds):  # sizes alternate, so load on a shared machine hits all
            for n in sizes:
                runs[n].append(time_status(dbs[n]))
        for n in sizes:
            rows[n] = {k: statistics.median(r[k] for r in runs[n]) for k in runs[n][0]}
    base = rows[sizes[0]]
    print(f"`dpbudget status` CPU time (median of {args.rounds}, imports excluded), "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, 1-minute load "
          f"{os.getloadavg()[0]:.2f}\n")
    print("| records | status | status --json | ÷ smallest |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        r = rows[n]
        print(f"| {n:,} | {r['status'] * 1e3:.1f} ms | {r['status --json'] * 1e3:.1f} ms | "
              f"×{r['status'] / base['status']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
