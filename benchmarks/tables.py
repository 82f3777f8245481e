"""Five table queries per person, dpbudget against its peers (issue "Budgets per person").

The events table (``dpbudget.examples.events``, 200,000 persons, ~10^6 rows) is written once to
a Parquet file; each library then runs in its own interpreter (``--python-<lib> PATH``; the peers
conflict on pandas), reads that file into its own frame and opens its session (not timed), and
runs the five queries ``--seeds`` times, timing each (``benchmarks/table_peers.py``):

  Q1 count per region            Q2 sum and mean of amount per region (amount in [0, 1000])
  Q3 distinct persons per region (3 regions per person)
  Q4 median amount               Q5 count per day × region, keys selected privately (δ = 1e-6)

at ε = 1 per person per query, 20 rows per person. This process computes the exact answers
(all rows, no bound, no noise), the mean relative error over keys and runs (a key an answer
leaves out counts as 0), the median wall time, and the lines of user code (the query
function's source, without blank lines, comments and the ``def`` line; the library's setup is
reported apart).

Run: ``python benchmarks/tables.py [--quick] [--only dpbudget,opendp] [--python-tumult PATH]``.
``--quick``: 1 seed, 20,000 persons. ``--json FILE`` writes the raw results.
``--engine spark [--cores 1,2] [--only dpbudget,tumult,copy]``: the five queries on one local
SparkSession per core count, dpbudget beside Tumult, the raw ``groupBy().agg()`` (always) and
with ``copy`` the raw aggregate on a read-once copy of the columns (``benchmarks/table_spark.py``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import table_peers as peers  # noqa: E402  (a sibling module, importable in every interpreter)

QUERIES = ("q1", "q2", "q3", "q4", "q5")
ROWS_SHOWN = ("Q1", "Q2 sum", "Q2 mean", "Q3", "Q4", "Q5")


def worker(lib: str, path: str, seeds: int) -> dict[str, Any]:
    """Run ``lib``'s five queries ``seeds`` times on the Parquet file at ``path``."""
    out: dict[str, Any] = {"setup_seconds": [], "queries": {}, "failed": {}}
    for seed in range(seeds):
        start = time.perf_counter()
        context = getattr(peers, f"setup_{lib}")(path, seed)
        out["setup_seconds"].append(time.perf_counter() - start)
        for q in QUERIES:
            function = getattr(peers, f"{lib}_{q}", None)
            if function is None:
                continue
            if q in out["failed"]:
                continue
            start = time.perf_counter()
            try:
                answers = function(context)
            except Exception as error:  # (a peer that cannot run a query: say why, go on)
                out["failed"][q] = f"{type(error).__name__}: {error}"[:160].replace("\n", " ")
                continue
            seconds = time.perf_counter() - start
            runs = out["queries"].setdefault(q, [])
            runs.append({"seconds": seconds, "answers": answers})
            print(f"{lib} seed {seed} {q}: {seconds:.3f} s", file=sys.stderr, flush=True)
    return out


def exact(path: Path) -> dict[str, dict[str, float]]:
    """The true answers: every row, no bound, no noise."""
    import pandas as pd
    frame = pd.read_parquet(path)
    by_region = frame.groupby("region")
    day_region = frame.groupby(["day", "region"]).size()
    return {"Q1": {k: float(v) for k, v in by_region.size().items()},
            "Q2 sum": {k: float(v) for k, v in by_region["amount"].sum().items()},
            "Q2 mean": {k: float(v) for k, v in by_region["amount"].mean().items()},
            "Q3": {k: float(v) for k, v in by_region["person_id"].nunique().items()},
            "Q4": {"": float(frame["amount"].median())},
            "Q5": {f"{d}|{r}": float(v) for (d, r), v in day_region.items()}}


def relative_error(answer: dict[str, float], truth: dict[str, float]) -> float:
    """Mean over the true keys of |answer - truth| / truth (a missing key answers 0)."""
    return statistics.fmean(abs(float(answer.get(k, 0.0)) - t) / t for k, t in truth.items())


def user_lines(lib: str, q: str) -> int | None:
    """Lines of the query function the user writes (and of the helper it calls, if any)."""
    function = getattr(peers, f"{lib}_{q}", None)
    if function is None:
        return None
    helpers = [getattr(peers, f"_{lib}")] if hasattr(peers, f"_{lib}") else []
    return sum(_code_lines(f) for f in (function, *helpers))


def _code_lines(function: Any) -> int:
    body = inspect.getsource(function).splitlines()[1:]
    return sum(1 for line in body if line.strip() and not line.strip().startswith("#"))


def run_library(lib: str, python: str, path: Path, seeds: int) -> dict[str, Any]:
    """One library in its own interpreter; its JSON on stdout."""
    start = time.perf_counter()
    done = subprocess.run([python, __file__, "--worker", lib, "--data", str(path), "--seeds",
                           str(seeds)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:]
        return {"crashed": " / ".join(tail)[:200], "total_seconds": time.perf_counter() - start}
    result: dict[str, Any] = json.loads(done.stdout)
    result["total_seconds"] = time.perf_counter() - start
    return result


def summarise(results: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Per library and row: mean relative error, median seconds, runs, lines."""
    table: dict[str, Any] = {}
    for lib, result in results.items():
        for q in QUERIES:
            runs = result.get("queries", {}).get(q)
            names = [n for n in ROWS_SHOWN if n.split()[0] == q.upper()]
            for name in names:
                cell: dict[str, Any] = {"lines": user_lines(lib, q)}
                if runs:
                    cell["error"] = statistics.fmean(relative_error(r["answers"][name],
                                                                    truth[name]) for r in runs)
                    cell["kept"] = statistics.fmean(len(r["answers"][name]) for r in runs)
                    cell["seconds"] = statistics.median(r["seconds"] for r in runs)
                    cell["runs"] = len(runs)
                else:
                    cell["missing"] = peers.UNSUPPORTED.get((lib, q)) or \
                        result.get("failed", {}).get(q) or result.get("crashed", "not run")
                table.setdefault(name, {})[lib] = cell
    return table


def markdown(table: dict[str, Any], libs: list[str]) -> str:
    """The table: error, seconds and lines per library, and each peer's ratio to dpbudget."""
    head = "| query | " + " | ".join(libs) + " |\n|---|" + "---:|" * len(libs) + "\n"
    lines = []
    for name, cells in table.items():
        base = cells.get("dpbudget", {})
        row = []
        for lib in libs:
            c = cells.get(lib, {})
            if "error" not in c:
                row.append(f"— ({c.get('missing', 'not run')})")
                continue
            text = f"{c['error']:.2%}, {c['seconds']:.3f} s, {c['lines']} lines"
            if lib != "dpbudget" and "seconds" in base and base["seconds"] > 0:
                text += f" (×{c['seconds'] / base['seconds']:.0f} dpbudget's time)"
            if name == "Q5":
                text += f", {c['kept']:.0f} keys"
            row.append(text)
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return head + "\n".join(lines) + "\n"


def targets(table: dict[str, Any]) -> list[str]:
    """Per row: error no worse than the best peer's, time ≥ 5× below the fastest peer's."""
    out = []
    for name, cells in table.items():
        ours = cells.get("dpbudget", {})
        peers_run = {lib: c for lib, c in cells.items() if lib != "dpbudget" and "error" in c}
        if "error" not in ours or not peers_run:
            continue
        best = min(peers_run, key=lambda lib: peers_run[lib]["error"])
        fastest = min(peers_run, key=lambda lib: peers_run[lib]["seconds"])
        error_met = ours["error"] <= peers_run[best]["error"]
        speedup = peers_run[fastest]["seconds"] / ours["seconds"]
        out.append(f"{name}: error {ours['error']:.2%} vs best peer {best} "
                   f"{peers_run[best]['error']:.2%} ({'met' if error_met else 'missed'}); "
                   f"time {speedup:.1f}× below fastest peer {fastest} "
                   f"({'met' if speedup >= 5 else 'missed'})")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 20,000 persons")
    parser.add_argument("--persons", type=int, default=200_000)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seeds-tumult", type=int, default=None,
                        help="fewer runs for Tumult alone, if its time forces it")
    parser.add_argument("--only", default=",".join(peers.LIBRARIES))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--engine", choices=("spark",), default=None,
                        help="spark: dpbudget, Tumult and the raw aggregate on one local "
                        "SparkSession (benchmarks/table_spark.py)")
    parser.add_argument("--cores", default="1,2", help="with --engine spark: local[N] each")
    for lib in peers.LIBRARIES:
        parser.add_argument(f"--python-{lib}", default=sys.executable)
    parser.add_argument("--worker", choices=peers.LIBRARIES, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        json.dump(worker(args.worker, args.data, args.seeds), sys.stdout)
        return {}
    if args.quick:
        args.seeds, args.persons = 1, 20_000
    if args.engine == "spark":
        import table_spark
        libs = tuple(lib for lib in args.only.split(",") if lib in ("dpbudget", "tumult", "copy"))
        return table_spark.main(args.persons, [int(c) for c in args.cores.split(",")],
                                args.seeds, (*libs, "raw"))
    libs = [lib for lib in args.only.split(",") if lib]
    unknown = sorted(set(libs) - set(peers.LIBRARIES))
    if unknown:
        parser.error(f"--only: unknown library {unknown[0]}")
    from dpbudget.examples.events import write_events
    path = write_events(Path(tempfile.mkdtemp()) / "events.parquet", args.persons)
    truth = exact(path)
    rows = sum(truth["Q1"].values())
    print(f"{rows:,.0f} rows, {args.persons:,} persons, {args.seeds} seeds; data {path}")
    results = {}
    for lib in libs:
        seeds = args.seeds_tumult if lib == "tumult" and args.seeds_tumult else args.seeds
        results[lib] = run_library(lib, getattr(args, f"python_{lib}"), path, seeds)
        print(f"{lib}: {results[lib]['total_seconds']:.0f} s in all"
              + (f"; CRASHED: {results[lib]['crashed']}" if "crashed" in results[lib] else ""),
              flush=True)
    table = summarise(results, truth)
    print(markdown(table, libs))
    for line in targets(table):
        print("- " + line)
    setup = {lib: statistics.median(r["setup_seconds"]) for lib, r in results.items()
             if r.get("setup_seconds")}
    print("setup (read + session, median s): "
          + ", ".join(f"{lib} {s:.2f}" for lib, s in setup.items()))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "table": table, "truth": truth,
                                         "args": {k: str(v) for k, v in vars(args).items()}}))
    return table


if __name__ == "__main__":
    main()
