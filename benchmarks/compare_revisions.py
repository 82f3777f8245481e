"""Release rate of this checkout beside another revision, measured in the same run.

A refactor must not slow the gate down. This script extracts ``--base`` (a git revision, default
``main``) into a temporary folder with ``git archive``, then times the same workloads on both trees
in alternating subprocesses (``PYTHONPATH`` set to each tree; the rest of the environment shared),
so that load from other processes on a shared machine hits both alike:

* ``memory``: ``Accountant(Budget(1e9)).release(Laplace(1e-9), 1.0)`` after 1,000 untimed
  releases, timed by the process's CPU time over ``--n`` releases;
* ``memory-fresh``: the same with a new ``Laplace`` built per release (the common usage);
* ``policy``: ``Accountant.from_policy`` with a dataset, an analyst and a global limit, so every
  release debits three accounts;
* ``sqlite``: the default durable SQLite ledger (WAL, synced before each draw), wall clock over
  ``--n-sqlite`` releases.

It prints the median over ``--rounds`` rounds per workload and revision, and the ratio
(this checkout / base). Usage::

    python benchmarks/compare_revisions.py --base main --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_WORKER = r'''
import json, os, sys, tempfile, time
import dpbudget as dp  # the one name every revision has (its layers were top-level names before)

Accountant, Budget, Laplace = dp.Accountant, dp.Budget, dp.Laplace
code = sys.modules[Accountant.__module__].__file__
assert os.path.realpath(code).startswith(os.path.realpath(os.getcwd())), code  # the tree measured

kind, n = sys.argv[1], int(sys.argv[2])
tmp = tempfile.mkdtemp()
if kind == "policy":
    path = os.path.join(tmp, "p.toml")
    with open(path, "w") as f:
        f.write("limit = { epsilon = 1e9 }\n[datasets.d]\nlimit = { epsilon = 1e9 }\n"
                "[datasets.d.analysts.a]\nlimit = { epsilon = 1e9 }\n")
    acc = Accountant.from_policy(path)
    kw = {"dataset": "d", "analyst": "a"}
elif kind == "sqlite":
    acc = Accountant(Budget(1e9), ledger="sqlite:///" + os.path.join(tmp, "b.db"))
    kw = {"dataset": "d"}
else:
    acc = Accountant(Budget(1e9))
    kw = {"dataset": "d"}
m = Laplace(1e-9, sensitivity=1.0)
for _ in range(1000 if kind != "sqlite" else 50):
    acc.release(m, 1.0, **kw)
clock = time.perf_counter if kind == "sqlite" else time.process_time
start = clock()
if kind == "memory-fresh":
    for _ in range(n):
        acc.release(Laplace(1e-9, sensitivity=1.0), 1.0, **kw)
else:
    for _ in range(n):
        acc.release(m, 1.0, **kw)
print(json.dumps(n / (clock() - start)))
'''


def _extract(revision: str, into: Path) -> Path:
    archive = into / "base.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive),
                    revision], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def _rate(tree: Path, kind: str, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _WORKER, kind, str(n)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="main", help="the git revision to compare against")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--n", type=int, default=20_000, help="timed in-memory releases per round")
    p.add_argument("--n-sqlite", type=int, default=1_000, help="timed SQLite releases per round")
    args = p.parse_args(argv)
    kinds = {"memory": args.n, "memory-fresh": args.n, "policy": args.n, "sqlite": args.n_sqlite}
    with tempfile.TemporaryDirectory() as tmp:
        base = _extract(args.base, Path(tmp))
        trees = {"this checkout": ROOT, f"base ({args.base})": base}
        rates: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for kind, n in kinds.items():
                order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
                for name, tree in order:
                    rates.setdefault((kind, name), []).append(_rate(tree, kind, n))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    names = list(trees)
    print(f"| workload | {names[0]} (releases/s) | {names[1]} (releases/s) | ratio |")
    print("|---|---:|---:|---:|")
    for kind in kinds:
        a = statistics.median(rates[(kind, names[0])])
        b = statistics.median(rates[(kind, names[1])])
        print(f"| {kind} | {a:,.0f} | {b:,.0f} | {a / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
