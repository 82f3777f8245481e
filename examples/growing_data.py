"""Growing data for 30 days: per-block budgets beside one lifetime budget and a daily renewal.

A table gains a day of events every day (synthetic: about 1,000 events a day, each with a
time). Every day the analysts ask the same mix: three counts over that day alone (ε = 0.1 each)
and two counts over the last 7 days (ε = 0.1 each). The same workload runs under three policies:

- **blocks**: the table is divided into daily blocks, each with a lifetime limit ε = 1; a query is
  charged to every day it reads (Sage, SOSP 2019, Thm 4.3). Every event is protected at ε = 1 for
  good.
- **lifetime**: one limit ε = 1 for the whole table, forever. Every event at ε = 1, but the budget
  is gone after ten queries, and later data is never usable.
- **period = "1d"**: ε = 1 renewed every day. Everything is answered, but the guarantee over 30
  days is only ε = 30 (basic composition over the windows), and grows every day.

Each query reads its rows with ``Accountant.block_rows`` (the blocks paid for are the rows read),
and the blocks policy's ledger is audited at the end: no block exceeds its limit.

Run: ``python examples/growing_data.py [--plot answered.png] [--heatmap blocks.png]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from dpbudget.accountant import Accountant, BudgetExceededError
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger import Ledger, MemoryLedger
from dpbudget.mechanisms import Laplace
from dpbudget.mechanisms.queries import true_count
from dpbudget.policies.blocks import block_of

START = 1_793_491_200.0  # 2026-11-01 00:00 UTC
DAY = 86_400.0
DAYS = 30
POLICIES = {
    "blocks": '[datasets.events]\n[datasets.events.blocks]\nby = "day"\n'
              'first = "2026-11-01"\nlimit = { epsilon = 1.0 }\n',
    "lifetime": '[datasets.events]\nlimit = { epsilon = 1.0 }\n',
    "period": '[datasets.events]\nlimit = { epsilon = 1.0 }\nperiod = "1d"\n',
}
GUARANTEE = {"blocks": "ε = 1 per event, for good", "lifetime": "ε = 1 per event, for good",
             "period": f"ε = {DAYS} over {DAYS} days (grows by 1 a day)"}


def events(rng: np.random.Generator) -> "object":
    import pandas as pd

    times = np.concatenate([START + d * DAY + np.sort(rng.uniform(0, DAY, rng.poisson(1000)))
                            for d in range(DAYS)])
    return pd.DataFrame({"time": pd.to_datetime(times, unit="s", utc=True)})


def simulate(name: str, table: object, folder: Path) -> tuple[list[int], Ledger]:
    """Answered queries per day under policy ``name``; returns them and the ledger.

    A simulation: its ledger is in memory, the only kind that takes a clock (a durable ledger
    keeps its own time, so that no caller can choose its windows or blocks)."""
    policy = folder / f"{name}.toml"
    policy.write_text(POLICIES[name])
    ledger = MemoryLedger()
    clock = [START]
    # A simulation, seeded to be reproducible: its ledger is created as a simulation ledger.
    acc = Accountant.from_policy(policy, ledger=ledger, rng=0, simulation=True,
                                 clock=lambda: clock[0])
    answered = []
    for day in range(DAYS):
        clock[0] = START + day * DAY + 23.5 * 3600  # the day's queries run at 23:30
        today = block_of(clock[0], "day")
        week = slice(block_of(clock[0] - 6 * DAY if day >= 6 else START, "day"), today)
        n = 0
        for blocks in [today] * 3 + [week] * 2:
            rows = acc.block_rows("events", table, "time", blocks) if name == "blocks" else \
                _rows(table, blocks, clock[0])
            try:
                kwargs = {"blocks": blocks} if name == "blocks" else {}
                query = true_count(rows)  # type: ignore[arg-type]
                acc.release(Laplace(0.1), query, dataset="events", **kwargs)
                n += 1
            except BudgetExceededError:
                pass
        answered.append(n)
    acc.close()
    return answered, ledger


def _rows(table: object, blocks: object, now: float) -> object:
    """The same rows without a block policy (the other two policies read them the same way)."""
    import pandas as pd

    frame: pd.DataFrame = table  # type: ignore[assignment]
    first = blocks if isinstance(blocks, str) else blocks.start  # type: ignore[attr-defined]
    start = pd.Timestamp(first, tz="UTC")
    return frame[(frame["time"] >= start) & (frame["time"] < pd.Timestamp(now, unit="s",
                                                                           tz="UTC"))]


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="write answered queries per day (PNG)")
    parser.add_argument("--heatmap", help="write the blocks ledger's per-block spend (PNG)")
    args = parser.parse_args(argv)
    table = events(np.random.default_rng(7))
    results, totals = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in POLICIES:
            results[name], ledger = simulate(name, table, Path(tmp))
            totals[name] = sum(results[name])
            if name == "blocks":
                report = audit(ledger, plot=args.heatmap is not None)
                blocks = [a for a in report.accounts if "/block:" in a.account]
                assert report.ok and blocks and not any(a.over_limit for a in blocks)
                worst = max(a.spent["epsilon"] for a in blocks)
                print(f"audit of the blocks ledger: clean, {len(blocks)} blocks, the most spent "
                      f"by any block ε = {worst:.2f} (limit 1)")
                if args.heatmap:
                    from dpbudget.accountant.audit.plot_blocks import plot_blocks

                    plot_blocks(report, args.heatmap)
    asked = 5 * DAYS
    print(f"\n| policy | queries answered (of {asked}) | guarantee |")
    print("|---|---:|---|")
    for name in POLICIES:
        print(f"| {name} | {totals[name]} | {GUARANTEE[name]} |")
    if args.plot:
        _plot(results, args.plot)
    return totals


def _plot(results: dict[str, list[int]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for name, marker in zip(results, "osx"):
        ax.plot(range(1, DAYS + 1), results[name], marker=marker, label=f"{name}: "
                f"{GUARANTEE[name]}")
    ax.set_xlabel("day")
    ax.set_ylabel("queries answered (of 5)")
    ax.set_ylim(-0.2, 5.5)
    ax.legend(fontsize="small")
    ax.set_title("The same daily workload under three policies")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
