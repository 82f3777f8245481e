"""The demo pipeline behind ``dpbudget demo``: a small analysis of the bundled people table, run
end to end against an SQLite ledger, ending with a request the budget refuses.

Run it with ``dpbudget demo`` (or ``python -m dpbudget_examples.demo`` after install).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from accountant import Accountant, Budget, BudgetExceededError
from accountant.report import budget_table
from mechanisms import AnalyticGaussian, Laplace, clamped_sum, count, histogram, noisy_mean

DATA = Path(__file__).with_name("data") / "people.csv"
EDUCATION = ("primary", "secondary", "bachelor", "master", "doctorate")


def load_people(path: Path = DATA) -> list[dict[str, Any]]:
    with path.open(newline="") as f:
        return [{"age": int(r["age"]), "sex": r["sex"], "education": r["education"],
                 "income": int(r["income"]), "hours_per_week": int(r["hours_per_week"])}
                for r in csv.DictReader(f)]


def run(ledger: str, *, seed: int | None = None, out: TextIO = sys.stdout) -> Accountant:
    """Run the pipeline; returns the accountant (its ledger holds the demo's records)."""
    people = load_people()
    ages = [p["age"] for p in people]
    incomes = [p["income"] for p in people]
    acc = Accountant(limits={"people": Budget(1.0, 1e-6)}, ledger=ledger, rng=seed)

    def show(label: str, noisy: Any, true: Any, cost: Budget | None = None) -> None:
        cost = cost or acc.last_receipt.cost
        print(f"  {label:<34} {_fmt(noisy):>28}   (true {_fmt(true)}; "
              f"cost ε={cost.epsilon:g}, δ={cost.delta:g})", file=out)

    print(f"dpbudget demo: {len(people)} synthetic people, ledger {ledger}", file=out)
    print("Releases, each debited from the 'people' limit before its noise is drawn "
          "(true values shown only because the data are synthetic):", file=out)

    n = count(people)
    show("count of people", acc.release(Laplace(0.1, n.l1_sensitivity), n.value,
                                        dataset="people", label="count"), n.value)

    mean_age = noisy_mean(acc, ages, 18, 95, epsilon=0.2, dataset="people", label="mean age")
    show("mean age (clamped to 18..95)", mean_age, sum(ages) / len(ages), Budget(0.2))

    h = histogram([p["education"] for p in people], EDUCATION)
    noisy_h = acc.release(Laplace(0.2, h.l1_sensitivity), h.value, dataset="people",
                          label="education histogram")
    show("education histogram", noisy_h, h.value)

    s = clamped_sum(incomes, 0, 150_000)
    show("total income (clamped to 0..150k)",
         acc.release(AnalyticGaussian(0.3, 1e-7, s.l2_sensitivity), s.value, dataset="people",
                     label="total income"), s.value)

    print("\nBudget per dataset:", file=out)
    print(budget_table(acc.ledger), file=out)

    print("\nOne more release, ε = 0.5, on 'people':", file=out)
    try:
        acc.release(Laplace(0.5, s.l1_sensitivity), s.value, dataset="people",
                    label="one too many")
    except BudgetExceededError as refused:
        print(f"  refused: {refused}", file=out)
    print(f"\nAudit it: dpbudget status {ledger}", file=out)
    return acc


def _fmt(x: Any) -> str:
    if isinstance(x, (int, float)):
        return f"{x:,.1f}"
    return "[" + ", ".join(f"{v:,.0f}" for v in x) + "]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dpbudget demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", help="SQLite ledger file (default: a new one in a temp dir)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed the noise for a reproducible run (never for real releases)")
    args = parser.parse_args(argv)
    ledger = args.ledger or str(Path(tempfile.mkdtemp(prefix="dpbudget-demo-")) / "budget.db")
    run(ledger, seed=args.seed).close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
