"""Generate the bundled synthetic sample data set, ``examples/data/people.csv``.

A small person-level table (one row per person: age, sex, education, income, hours per week)
drawn from a seeded generator, so the file is reproducible byte for byte. It describes nobody: it
exists so the demo and the examples have something realistic to protect.

Run: ``python examples/make_sample_data.py`` (rewrites the file).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

EDUCATION = ("primary", "secondary", "bachelor", "master", "doctorate")
COLUMNS = ("age", "sex", "education", "income", "hours_per_week")


def make_people(n: int = 2000, seed: int = 20261121) -> list[dict[str, object]]:
    """``n`` synthetic people, the same for the same seed."""
    rng = np.random.default_rng(seed)
    age = np.clip(rng.normal(44, 15, n), 18, 95).round().astype(int)
    sex = rng.choice(["F", "M"], n)
    edu = rng.choice(len(EDUCATION), n, p=[0.1, 0.4, 0.3, 0.15, 0.05])
    # Income grows with education and age, with a log-normal spread and a long right tail.
    log_income = 9.8 + 0.25 * edu + 0.012 * (age - 18) + rng.normal(0, 0.55, n)
    income = np.round(np.exp(log_income), -2).astype(int)
    hours = np.clip(rng.normal(38, 9, n), 4, 80).round().astype(int)
    return [
        {"age": int(a), "sex": str(s), "education": EDUCATION[e], "income": int(i),
         "hours_per_week": int(h)}
        for a, s, e, i, h in zip(age, sex, edu, income, hours)
    ]


def main() -> None:
    path = Path(__file__).with_name("data") / "people.csv"
    path.parent.mkdir(exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(make_people())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
