"""Range queries answered only when large, with one NumericSparse session.

The seed's ``range_query_svt`` (Near & Abuah, "Programming Differential Privacy", ch. "The Sparse
Vector Technique"): of many random range-count queries ("how many people are aged a..b?",
sensitivity 1), only those whose count is large are worth answering. A ``NumericSparse`` session
(Lyu–Su–Li 2017 Alg. 1 with numeric answers) tests each against a threshold and, for at most c of
them, releases the count with fresh Laplace noise; the whole session costs its declared ε once,
however many small ranges it skips.

Run: ``python examples/range_query_svt.py`` after ``pip install -e .`` (or with
``PYTHONPATH=.``; seeded; use ``rng=None`` for a real release).
"""

from __future__ import annotations

import numpy as np

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms import NumericSparse


def range_query_svt(acc: Accountant, ages: np.ndarray, ranges: list[tuple[int, int]], *,
                    threshold: float, c: int, epsilon: float,
                    dataset: str) -> list[tuple[tuple[int, int], float]]:
    """The (range, noisy count) pairs of up to ``c`` ranges whose count passed ``threshold``."""
    answers = []
    mechanism = NumericSparse(epsilon=epsilon, threshold=threshold, max_positives=c,
                              sensitivity=1.0)  # (a count: one person moves it by at most 1)
    with acc.session(mechanism, dataset=dataset, label="large range counts") as svt:
        for lo, hi in ranges:
            noisy = svt.query(float(np.count_nonzero((ages >= lo) & (ages < hi))))
            if noisy is not None:
                answers.append(((lo, hi), noisy))
                if svt.positives == c:
                    break
    return answers


def main() -> None:
    rng = np.random.default_rng(7)
    ages = np.clip(rng.normal(40, 14, size=20_000), 18, 95).astype(int)  # synthetic, inline
    starts = rng.integers(18, 90, size=300)
    ranges = [(int(a), int(a + w)) for a, w in zip(starts, rng.integers(1, 12, size=300))]
    acc = Accountant(Budget(1.0), rng=rng)
    answers = range_query_svt(acc, ages, ranges, threshold=4_000.0, c=5, epsilon=1.0,
                              dataset="census")
    for (lo, hi), noisy in answers:
        true = np.count_nonzero((ages >= lo) & (ages < hi))
        print(f"ages [{lo:2d}, {hi:2d}): noisy count {noisy:8.1f}   true {true}")
    closing = list(acc.ledger.entries())[-1].record
    print(f"{closing['answered']} ranges tested, {closing['positives']} answered; "
          f"spent {acc.spent('census')}")


if __name__ == "__main__":
    main()
