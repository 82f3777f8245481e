"""The audit of a JSONL log beside a base revision, and beside a parse-and-hash floor (issue 31).

A log is audited in ``seq`` order (lines of one process may be out of order locally), so each line
was parsed by the source to find its ``seq`` and again by the chain check: twice, where one parse
and one hash of the record's text are the floor. This script writes a log of ``--records``
releases (an in-memory accountant, three datasets, exported with ``export_jsonl``), then times in
fresh subprocesses, alternating, ``--rounds`` times each: ``audit(path)`` on this checkout and on
``--base`` (extracted with ``git archive``), and the floor (per line: ``json.loads`` of the line,
SHA-256 of its record part). Median CPU time of the process's audit call. Usage::

    python benchmarks/audit_jsonl.py --records 100000 --rounds 5 --base d185650
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compare_revisions import _extract  # (the benchmarks folder is on the path)

ROOT = Path(__file__).resolve().parent.parent

_AUDIT = """
import json, sys, time
from dpbudget.accountant.audit.run import audit
start = time.process_time()
report = audit(sys.argv[1])
assert report.ok, report.problems[:3]
print(json.dumps(time.process_time() - start))
"""

_FLOOR = """
import hashlib, json, sys, time
start = time.process_time()
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        line = line.rstrip("\\n")
        json.loads(line)
        hashlib.sha256(line[84:-1].encode("utf-8")).hexdigest()
print(json.dumps(time.process_time() - start))
"""


def _write_log(path: Path, records: int) -> None:
    sys.path.insert(0, str(ROOT))
    from dpbudget.accountant import Accountant, Budget
    from dpbudget.accountant.audit.transfer import export_jsonl
    from dpbudget.mechanisms import Laplace

    acc = Accountant(Budget(1e9))
    for i in range(records):
        acc.release(Laplace(1e-6, sensitivity=1.0), 1.0, dataset=f"d{i % 3}")
    export_jsonl(acc.ledger, path)


def _seconds(code: str, tree: Path, log: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code, str(log)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", default="d185650")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        _write_log(log, args.records)
        base = _extract(args.base, Path(tmp))
        runs: dict[str, list[float]] = {"floor": [], "base": [], "this": []}
        for _ in range(args.rounds):
            runs["floor"].append(_seconds(_FLOOR, ROOT, log))
            runs["base"].append(_seconds(_AUDIT, base, log))
            runs["this"].append(_seconds(_AUDIT, ROOT, log))
        floor = statistics.median(runs["floor"])
        print(f"{args.records:,} records, {log.stat().st_size / 1e6:.1f} MB, median of "
              f"{args.rounds} rounds (CPU seconds)")
        for name, label in (("floor", "parse + hash floor"), ("base", f"audit, {args.base}"),
                            ("this", "audit, this checkout")):
            t = statistics.median(runs[name])
            print(f"| {label} | {t:.2f} s | {t / args.records * 1e6:.1f} µs/record | "
                  f"×{t / floor:.2f} floor |")


if __name__ == "__main__":
    main()
