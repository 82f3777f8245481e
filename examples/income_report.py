"""A budgeted pipeline: an income report that makes two releases inside a child budget.

The report runs in a pipeline (``Accountant.budgeted``): when it starts, its whole allocation
(ε = 0.4, δ = 1e-7) is debited from every limit the policy applies (the ``people`` dataset's and the
analyst's), as one step; the two releases inside are then charged to the pipeline's own account,
which can never overspend its allocation. Whatever the report leaves unused is not refunded.

Run it on its own with ``python -m dpbudget.examples.income_report`` (after install).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpbudget.accountant import Accountant, Budget, Pipeline
from dpbudget.mechanisms import AnalyticGaussian, Laplace
from dpbudget.mechanisms.queries import true_clamped_sum, true_histogram

POLICY = Path(__file__).with_name("policy.toml")
EDUCATION = ("primary", "secondary", "bachelor", "master", "doctorate")
REPORT_BUDGET = Budget(0.4, 1e-7)


def income_report(acc: Accountant, people: list[dict[str, Any]], *,
                  analyst: str | None = "alice") -> dict[str, Any]:
    """The noisy education histogram and total income, released in one pipeline.

    Returns:
        ``{"pipeline": the pipeline's id, "education": [...], "income": float}``.
    """

    @acc.budgeted("income-report", dataset="people", analyst=analyst, budget=REPORT_BUDGET)
    def report(p: Pipeline) -> dict[str, Any]:
        h = true_histogram([row["education"] for row in people], EDUCATION)
        s = true_clamped_sum([row["income"] for row in people], 0, 150_000)
        return {
            "pipeline": p.id,
            # Each Query sets its mechanism's sensitivity: L1 for Laplace, L2 for the Gaussian.
            "education": p.release(Laplace(0.2), h, label="education histogram"),
            "income": p.release(AnalyticGaussian(0.2, delta=1e-7), s, label="total income"),
        }

    return report()


def main() -> int:
    from .demo import load_people

    acc = Accountant.from_policy(POLICY)
    result = income_report(acc, load_people())
    print(f"pipeline {result['pipeline']}: education {[round(v) for v in result['education']]}, "
          f"total income {result['income']:,.0f}")
    print(f"people: spent {acc.spent('people')}, "
          f"alice: spent {acc.spent('people', analyst='alice')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
