"""Start-up time: from a fresh interpreter to the first answer, this checkout beside a base revision.

A short script or a shell loop calling ``dpbudget`` pays the import time on every run, so SciPy
and the other heavy modules must load only when something needs them (issue 30). This script
times, in fresh subprocesses (wall clock, from start to exit), the median of ``--rounds`` runs of:

* ``import dpbudget``;
* ``dpbudget --version`` and ``dpbudget --help`` (what the installed console script runs:
  ``from dpbudget.accountant.cli import main``);
* ``import`` and the first release, ``Accountant(Budget(1.0)).release(Laplace(1.0), 1.0)``, on the
  in-memory ledger and on a new SQLite ledger (file in a temporary folder);

beside the floor (``python -c "pass"``, ``python -c "import numpy"``), for this checkout and for
``--base`` (default ``6c63c85``, the revision issue 30 started from), extracted with ``git
archive`` into a temporary folder. Both trees run with ``PYTHONPATH`` set to them, in alternating
order within each round, so that load from other processes hits both alike. Usage::

    python benchmarks/startup.py --rounds 11
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compare_revisions import _extract  # (the benchmarks folder is on the path)

ROOT = Path(__file__).resolve().parent.parent

# The console script's module: dpbudget.accountant.cli, or accountant.cli in a tree from before
# the one import name (there the editable install would map dpbudget.accountant to this checkout).
_CLI = "import sys\nfrom {{cli}} import main\nsys.exit(main({argv!r}))"
_RELEASE = ("import dpbudget as dp\n"
            "acc = dp.Accountant(dp.Budget(1.0){ledger})\n"
            "acc.release(dp.Laplace(1.0, sensitivity=1.0), 1.0)\n")

# (label, code, needs a tree): floor rows run once per round, not per tree.
CASES = [
    ('python -c "pass"', "pass", False),
    ('python -c "import numpy"', "import numpy", False),
    ("import dpbudget", "import dpbudget", True),
    ("dpbudget --version", _CLI.format(argv=["--version"]), True),
    ("dpbudget --help", _CLI.format(argv=["--help"]), True),
    ("import + first release (memory)", _RELEASE.format(ledger=""), True),
    ("import + first release (SQLite)",
     _RELEASE.format(ledger=", ledger='sqlite:///' + __import__('tempfile').mkdtemp() + '/l.db'"),
     True),
]


def _seconds(code: str, tree: Path | None) -> float:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        new = (tree / "dpbudget" / "accountant").exists()
        code = code.replace("{cli}", "dpbudget.accountant.cli" if new else "accountant.cli")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tempfile.gettempdir(),
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="6c63c85", help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=11, help="runs per case and tree")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": _extract(args.base, Path(tmp)), "this": ROOT}
        times: dict[tuple[str, str], list[float]] = {}
        for _, code, _ in CASES:  # warm the file cache and the bytecode of both trees
            for tree in trees.values():
                _seconds(code, tree)
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for label, code, per_tree in CASES:
                for name, tree in (order if per_tree else [("floor", None)]):
                    times.setdefault((label, name), []).append(_seconds(code, tree))
    print(f"median of {args.rounds} runs, wall clock, ms; base = {args.base}\n")
    print("| run | base | this checkout | this / base |")
    print("|---|---:|---:|---:|")
    for label, _, per_tree in CASES:
        if not per_tree:
            floor = statistics.median(times[(label, "floor")]) * 1e3
            print(f"| {label} | {floor:.0f} | {floor:.0f} | |")
            continue
        base = statistics.median(times[(label, "base")]) * 1e3
        this = statistics.median(times[(label, "this")]) * 1e3
        print(f"| {label} | {base:.0f} | {this:.0f} | {this / base:.2f} |")


if __name__ == "__main__":
    main()
