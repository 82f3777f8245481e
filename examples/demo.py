"""The demo pipeline behind ``dpbudget demo``: a small analysis of the bundled people table under
the bundled policy (``policy.toml``), run end to end against an SQLite ledger by the analyst alice,
partly inside a budgeted pipeline, ending with a request her limit refuses.

Run it with ``dpbudget demo`` (or ``python -m dpbudget.examples.demo`` after install).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from dpbudget.accountant import Accountant, Budget, BudgetExceededError
from dpbudget.accountant.audit.status import budget_table
from dpbudget.mechanisms import Laplace, noisy_mean
from dpbudget.mechanisms.queries import true_count

from .income_report import POLICY, REPORT_BUDGET, income_report

DATA = Path(__file__).with_name("data") / "people.csv"
ANALYST = "alice"


def load_people(path: Path = DATA) -> list[dict[str, Any]]:
    with path.open(newline="") as f:
        return [{"age": int(r["age"]), "sex": r["sex"], "education": r["education"],
                 "income": int(r["income"]), "hours_per_week": int(r["hours_per_week"])}
                for r in csv.DictReader(f)]


def run(ledger: str, *, seed: int | None = None, out: TextIO = sys.stdout) -> Accountant:
    """Run the pipeline; returns the accountant (its ledger holds the demo's records)."""
    people = load_people()
    ages = [p["age"] for p in people]
    # A seed makes the run reproducible, and makes the ledger a simulation ledger, for good: its
    # first record says so (anyone who knows the seed could subtract the noise).
    acc = Accountant.from_policy(POLICY, ledger=ledger, rng=seed, simulation=seed is not None)
    mine = {"dataset": "people", "analyst": ANALYST}

    def show(label: str, noisy: Any, true: Any, cost: Budget) -> None:
        print(f"  {label:<34} {_fmt(noisy):>28}   (true {_fmt(true)}; "
              f"cost ε={cost.epsilon:g}, δ={cost.delta:g})", file=out)

    print(f"dpbudget demo: {len(people)} synthetic people, policy {POLICY.name}, ledger {ledger}",
          file=out)
    print(f"Analyst {ANALYST}'s releases, each debited from the 'people' limit and from "
          f"{ANALYST}'s own before its noise is drawn\n(true values shown only because the data "
          f"are synthetic):", file=out)
    n = true_count(people)
    # The Query itself is released: Laplace takes its sensitivity (Δ₁ = 1) from it.
    show("count of people", acc.release(Laplace(0.1), n, label="count", **mine), n.value,
         Budget(0.1))
    show("mean age (clamped to 18..95)",
         noisy_mean(acc, ages, 18, 95, epsilon=0.2, label="mean age", **mine),
         sum(ages) / len(ages), Budget(0.2))

    print(f"Pipeline 'income-report': its allocation ε={REPORT_BUDGET.epsilon:g}, "
          f"δ={REPORT_BUDGET.delta:g} is debited once when it opens; its releases are charged "
          f"to it alone:", file=out)
    report = income_report(acc, people, analyst=ANALYST)
    show("education histogram", report["education"], _true_histogram(people), Budget(0.2))
    show("total income (clamped to 0..150k)", report["income"],
         sum(min(max(p["income"], 0), 150_000) for p in people), Budget(0.2, 1e-7))

    print("\nBudget per limit:", file=out)
    print(budget_table(acc.ledger), file=out)

    print(f"\nOne more release by {ANALYST}, ε = 0.2, on 'people':", file=out)
    try:
        acc.release(Laplace(0.2, sensitivity=n.l1_sensitivity), n.value, label="one too many", **mine)
    except BudgetExceededError as refused:
        print(f"  refused: {refused}", file=out)
    print(f"\nInspect it: dpbudget status {ledger}\n"
          f"Audit it:   dpbudget audit {ledger}\n"
          "(the policy is stored in the ledger; add --policy FILE to compare with a reviewed "
          "file)", file=out)
    return acc


def _true_histogram(people: list[dict[str, Any]]) -> list[int]:
    from .income_report import EDUCATION

    return [sum(p["education"] == e for p in people) for e in EDUCATION]


def _fmt(x: Any) -> str:
    if isinstance(x, (int, float)):
        return f"{x:,.1f}"
    return "[" + ", ".join(f"{v:,.0f}" for v in x) + "]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dpbudget demo", description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--ledger", help="SQLite ledger file (default: a new one in a temp dir)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed the noise for a reproducible run; the ledger is then created "
                        "as a simulation ledger (never for real releases)")
    args = parser.parse_args(argv)
    ledger = args.ledger or str(Path(tempfile.mkdtemp(prefix="dpbudget-demo-")) / "budget.db")
    run(ledger, seed=args.seed).close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
