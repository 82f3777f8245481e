"""The first release on a new dataset at 10 and at 10^4 existing datasets (issue 31).

A dataset under the default limit is checked, on its first release, against every dataset the
ledger holds (name twins: "people", "People", "peo-ple"). The gate keeps an index of folded
names and reads only the accounts created since it last looked (``Ledger.created_since``); the
old check listed and folded every account. This script builds ledgers of N datasets through the
public API, then times ``--rounds`` first releases on new names (each one a new dataset), the
index beside the old scan (``created_since`` replaced by the base class's, which lists every
account: the old cost) in alternating order. Median per release, CPU time in memory, wall time on
SQLite (durable: WAL + ``synchronous=FULL``). Usage::

    python benchmarks/first_release.py --rounds 40
"""

from __future__ import annotations

import argparse
import gc
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpbudget.accountant import Accountant, Budget  # noqa: E402
from dpbudget.accountant.ledger import MemoryLedger, SqliteLedger  # noqa: E402
from dpbudget.accountant.ledger.base import Ledger  # noqa: E402
from dpbudget.mechanisms import Laplace  # noqa: E402


def _filled(kind: str, n: int, folder: Path) -> Accountant:
    ledger = MemoryLedger() if kind == "memory" else SqliteLedger(folder / f"{n}.db")
    acc = Accountant(Budget(1e6), ledger=ledger, rng=0, simulation=True)
    for i in range(n):
        acc.release(Laplace(1e-6, sensitivity=1.0), 1.0, dataset=f"d{i}")
    return acc


def _time(acc: Accountant, name: str, clock: str) -> float:
    tick = time.thread_time if clock == "CPU" else time.perf_counter
    gc.collect()  # (the garbage of the cell before, a scan's 10^4 accounts, is not this one's)
    start = tick()
    acc.release(Laplace(1e-6, sensitivity=1.0), 1.0, dataset=name)
    return tick() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 10_000])
    args = parser.parse_args()
    print(f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
          f"{platform.machine()}, {args.rounds} first releases per cell")
    with tempfile.TemporaryDirectory() as tmp:
        for kind, clock in (("memory", "CPU"), ("sqlite", "wall")):
            accs = {n: _filled(kind, n, Path(tmp)) for n in args.sizes}
            times: dict[tuple[int, str], list[float]] = {}
            for r in range(args.rounds):
                for n, acc in accs.items():
                    for how in ("index", "scan"):
                        ledger, mark = acc.ledger, acc._gate._mark
                        if how == "scan":  # the old cost: every account listed and folded
                            ledger.created_since = (  # type: ignore[method-assign]
                                lambda mark=None, _l=ledger: Ledger.created_since(_l))
                        times.setdefault((n, how), []).append(_time(acc, f"{how}{r}", clock))
                        if how == "scan":  # (the index brought up to date, untimed)
                            del ledger.created_since
                            acc._gate._mark = ledger.created_since(mark)[0]
            for how in ("index", "scan"):
                cells = [f"N={n:,}: {statistics.median(times[n, how]) * 1e3:.3f} ms"
                         for n in args.sizes]
                print(f"{kind:7} {clock:4} {how:5} " + "  ".join(cells))
            for acc in accs.values():
                acc.close()


if __name__ == "__main__":
    main()
