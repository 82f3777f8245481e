"""Writing your own mechanism (docs/custom-mechanisms.md): the share of rows above a public
threshold, with the row count public (replace-one neighbours), through the same public surface as
every mechanism of the library — ``declare`` the cost in ``__init__``, ``params``, ``prepare``,
``draw``.

Run: ``python examples/custom_mechanism.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError, InvalidDataTypeError
from dpbudget.mechanisms import Laplace, Mechanism, Sampler


class ShareAbove(Mechanism):
    """The share of values above ``threshold`` among n rows (n public: replace-one neighbours).

    Changing one row moves the count above the threshold by at most 1, so the share by at most
    1/n: Laplace noise of scale 1/(nε) gives (ε, 0)-DP (Dwork et al. 2006). The noise is drawn by
    the library's exact Laplace mechanism on the count, then divided by n (post-processing).
    """

    def __init__(self, epsilon: float, threshold: float, n: int) -> None:
        if not (isinstance(n, int) and n >= 1):
            raise InvalidArgumentError("n", n, "a public row count >= 1")
        self.threshold, self.n = float(threshold), n
        self._count = Laplace(epsilon, sensitivity=1.0)  # validates epsilon
        self.epsilon = self._count.epsilon
        # The cost, from public parameters only; the noise is the library's exact Laplace.
        self.declare(Budget(self.epsilon), noise="exact")

    def params(self) -> dict[str, Any]:  # public, written to the ledger: never data
        return {"epsilon": self.epsilon, "threshold": self.threshold, "n": self.n}

    def prepare(self, value: Any) -> float:  # validate only; name the argument, never the data
        rows = np.asarray(value, dtype=float) if isinstance(value, (list, np.ndarray)) else None
        if rows is None or rows.ndim != 1:
            raise InvalidDataTypeError("value", value, "a list or 1-D array of numbers")
        if rows.size != self.n:
            raise InvalidDataError("value", value, f"exactly n = {self.n} rows")
        if np.isnan(rows).any():
            raise InvalidDataError("value", value, "free of NaN")
        return float((rows > self.threshold).sum())

    def draw(self, value: float, sampler: Sampler) -> float:  # only after the debit
        return self._count.draw(value, sampler) / self.n


def main() -> None:
    incomes = np.random.default_rng(7).lognormal(10.5, 0.6, size=2_000)
    acc = Accountant(Budget(1.0), rng=7)
    share = acc.release(ShareAbove(0.5, 50_000.0, n=2_000), list(incomes), dataset="incomes")
    print(f"share above 50,000: {share:.3f} (true {(incomes > 50_000).mean():.3f})")
    print(f"spent: {acc.spent('incomes')}")
    # Recorded under its module and class (a policy admits it by that name), never "Laplace".
    print(f"recorded as: {acc.last_receipt.mechanism if acc.last_receipt else None}")


if __name__ == "__main__":
    main()
