"""The course notes' local-sensitivity workloads on examples/data/people.csv, each a budgeted
mechanism, under a limit of ε = 3 (δ = 1e-5) for the dataset, which the five analyses spend:

- the median age by the exponential mechanism (``Median``) and three income quantiles at once
  (``noisy_quantiles``, one batch);
- the median income by propose–test–release (``ProposeTestRelease``): a proposed bound on the
  local sensitivity, tested privately first;
- the mean log income by sample-and-aggregate
  (``SampleAndAggregate``): any function, run on disjoint random chunks;
- hours per week by education level (``group_by``): one debit for the whole table.

Run: ``python examples/course_workloads.py``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms import Median, ProposeTestRelease, SampleAndAggregate, group_by, noisy_quantiles

DATA = Path(__file__).resolve().parent / "data" / "people.csv"


def load() -> dict[str, list[str]]:
    with DATA.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {column: [row[column] for row in rows] for column in rows[0]}


def main() -> None:
    people = load()
    age = np.array(people["age"], dtype=float)
    income = np.array(people["income"], dtype=float)
    hours = np.array(people["hours_per_week"], dtype=float)
    acc = Accountant(Budget(3.0, 1e-5), rng=2024)

    median_age = acc.release(Median(0.5, lower=0.0, upper=100.0, bins=100), age, dataset="people",
                             label="median age")
    q = noisy_quantiles(acc, income, [0.25, 0.5, 0.75], 0.0, 200_000.0, epsilon=0.5,
                        dataset="people", label="income quartiles")
    ptr = acc.release(ProposeTestRelease(1.0, delta=1e-6, bound=3_000.0, statistic="median",
                                         lower=0.0, upper=200_000.0), income,
                      dataset="people", label="median income (PTR)")
    log_mean = acc.release(SampleAndAggregate(0.5, function=lambda rows: float(np.mean(np.log1p(rows))),
                                              chunks=40, lower=5.0, upper=13.0),
                           income, dataset="people", label="mean log income (S&A)")
    levels = ["primary", "secondary", "bachelor", "master", "doctorate"]  # public: the schema's
    by_education = group_by(acc, people["education"], levels, values=hours, statistic="mean",
                            lower=0.0, upper=80.0, epsilon=0.5, dataset="people",
                            label="hours by education")

    print(f"median age (exponential mechanism): {median_age:.0f}   true {np.median(age):.0f}")
    print("income quartiles: " + ", ".join(f"{v:,.0f}" for v in q)
          + "   true " + ", ".join(f"{v:,.0f}" for v in np.quantile(income, [0.25, 0.5, 0.75])))
    print(f"median income (PTR): {ptr if not isinstance(ptr, float) else f'{ptr:,.0f}'}   "
          f"true {np.median(income):,.0f}")
    print(f"mean log income (sample-and-aggregate): {log_mean:.3f}   "
          f"true {np.mean(np.log1p(income)):.3f}")
    print("mean hours by education: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                   by_education.items()))
    spent = acc.spent("people")
    print(f"spent: ε = {spent.epsilon:.4f}, δ = {spent.delta:g} of the limit (3, 1e-05)")


if __name__ == "__main__":
    main()
