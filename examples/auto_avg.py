"""Automatic clipping bound for a private mean, chosen with AboveThreshold.

The seed's ``auto_avg`` (Near & Abuah, "Programming Differential Privacy", ch. "The Sparse Vector
Technique"): a third of ε finds a clipping bound b with AboveThreshold — query b asks
``clipped_sum(b) - clipped_sum(b + 1)``, which is 0 once no value exceeds b, and has sensitivity 1
(adding or removing one row changes it by at most 1) — then a third each releases the clipped sum
(sensitivity b) and the count (sensitivity 1) with Laplace noise. The AboveThreshold session is
debited once, however many candidate bounds it tests.

Run: ``python examples/auto_avg.py`` after ``pip install -e .`` (or with ``PYTHONPATH=.``).
Seeded: the same output every time; for a real release use the default ``rng=None`` (OS CSPRNG).
"""

from __future__ import annotations

import numpy as np

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms import AboveThreshold, Laplace


def auto_avg(acc: Accountant, values: np.ndarray, epsilon: float, *, dataset: str,
             bounds: range) -> tuple[int, float]:
    """(the chosen clipping bound, the private mean), spending ``epsilon`` on ``dataset``.

    All or nothing: the whole ε is allocated to a pipeline before anything is released, so an
    average that does not fit spends nothing; the noisy sum and count are then one batch."""
    third = epsilon / 3

    def clipped_sum(b: float) -> float:
        return float(np.clip(values, 0, b).sum())

    chosen = bounds[-1]  # if no bound is reported ⊤, the largest candidate
    with acc.pipeline("auto_avg", dataset=dataset, budget=Budget(epsilon)) as p:
        with p.session(AboveThreshold(epsilon=third, threshold=0.0, sensitivity=1.0),
                       label="auto_avg: clipping bound") as svt:
            for b in bounds:
                if svt.test(clipped_sum(b) - clipped_sum(b + 1)):  # no further debit
                    chosen = b
                    break
        noisy_sum, noisy_count = p.release_many(
            [(Laplace(third, sensitivity=chosen), clipped_sum(chosen)),
             (Laplace(third, sensitivity=1.0), float(len(values)))],
            label="auto_avg: clipped sum and count")
    return chosen, noisy_sum / noisy_count


def main() -> None:
    rng = np.random.default_rng(2024)
    incomes = np.round(rng.lognormal(mean=10.5, sigma=0.6, size=5_000))  # synthetic, inline
    acc = Accountant(Budget(1.0), rng=rng)
    bound, mean = auto_avg(acc, incomes, 1.0, dataset="incomes",
                           bounds=range(1_000, 400_001, 1_000))
    print(f"chosen clipping bound: {bound:,}  (true max {incomes.max():,.0f}, "
          f"99th percentile {np.percentile(incomes, 99):,.0f})")
    print(f"private mean: {mean:,.1f}   true mean: {incomes.mean():,.1f}")
    print(f"spent: {acc.spent('incomes')}   ledger: "
          f"{[e.record['kind'] for e in acc.ledger.entries()]}")


if __name__ == "__main__":
    main()
