"""The query service under load (issue 35): answered queries a second and p50/p99 latency for 1, 8
and 32 concurrent clients, beside the same queries in-process.

A table of ``--persons`` persons (5 rows each, 3 cities) is written to Parquet; a policy with a
large limit and one token per client is stored in a fresh SQLite ledger; ``dpbudget serve`` runs
in a subprocess on a loopback port. Each client (a thread with its own ``dp.connect``) releases
``--queries`` counts per city (public keys, ε = 0.001 per person). In-process: the same queries
through ``dp.table`` on one accountant, by the same numbers of threads.

Run: ``python benchmarks/serve.py [--queries 50] [--persons 20000]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

import dpbudget as dp
from dpbudget.accountant.service.tokens import new_token, with_token
from dpbudget.policies.policy import parse_policy

POLICY = """
[datasets.visits]
limit = { epsilon = 1000000.0 }
privacy_unit = "pid"
bounds = { max_rows_per_unit = 5, max_groups_per_unit = 3, max_rows_per_group = 5 }
"""


def _site(folder: Path, persons: int, clients: int) -> tuple[str, list[str]]:
    rng = np.random.default_rng(0)
    n = persons * 5
    pd.DataFrame({"pid": np.repeat(np.arange(persons), 5), "city": rng.choice(["a", "b", "c"], n),
                  "amount": rng.uniform(0, 100, n)}).to_parquet(folder / "visits.parquet")
    (folder / "data.toml").write_text('[tables.visits]\ndataset = "visits"\n'
                                      'source = "visits.parquet"\n')
    (folder / "policy.toml").write_text(POLICY)
    from dpbudget.accountant.gate.owner_key import new_key_file

    new_key_file(folder / "owner.pem")
    policy, tokens = parse_policy(POLICY, "toml"), []
    for i in range(clients):
        token, entry = new_token(4_000_000_000)
        policy, _ = with_token(policy, f"a{i}", entry), tokens.append(token)
    url = f"sqlite:///{folder / 'ledger.db'}"
    dp.Accountant.from_policy(policy, ledger=url, owner_key=folder / "owner.pem").close()
    return url, tokens


def _timed(threads: int, queries: int, one: Callable[[int], Any]) -> dict[str, float]:
    latencies: list[float] = []

    def client(i: int) -> None:
        for _ in range(queries):
            start = time.perf_counter()
            one(i)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(client, range(threads)))
    wall = time.perf_counter() - start
    latencies.sort()
    return {"qps": len(latencies) / wall, "p50": statistics.median(latencies) * 1000,
            "p99": latencies[int(0.99 * (len(latencies) - 1))] * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=50, help="per client")
    parser.add_argument("--persons", type=int, default=20000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dpbudget-serve-bench-"))
    url, tokens = _site(folder, args.persons, 32)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "dpbudget.accountant.cli", "serve", "--policy",
                             str(folder / "policy.toml"), "--ledger", url, "--data",
                             str(folder / "data.toml"), "--port", str(port), "--rate", "1e6",
                             "--burst", "1000000", "--log", os.devnull])
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        service = [dp.connect(f"http://127.0.0.1:{port}", token=t) for t in tokens]

        def remote(i: int) -> Any:
            return service[i].table("visits").group_by("city", keys=["a", "b", "c"]).count(
                epsilon=0.001).release()

        served = {n: _timed(n, args.queries, remote) for n in (1, 8, 32)}
    finally:
        proc.terminate()
        proc.wait(30)
    acc = dp.Accountant.open(url)
    source = str(folder / "visits.parquet")

    def local(i: int) -> Any:
        return dp.table(acc, source, dataset="visits", analyst=f"a{i}").group_by(
            "city", keys=["a", "b", "c"]).count(epsilon=0.001).release()

    inproc = {n: _timed(n, args.queries, local) for n in (1,)}
    acc.close()
    print(f"{args.persons} persons, {args.queries} queries per client, SQLite ledger")
    print("| clients | served q/s | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    for n, r in served.items():
        print(f"| {n} | {r['qps']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} |")
    for n, r in inproc.items():
        print(f"| {n} in-process | {r['qps']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} |")


if __name__ == "__main__":
    main()
