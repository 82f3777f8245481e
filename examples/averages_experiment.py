"""Which private mean wins at small ε? The variants of the course notes, on the ages of
examples/data/people.csv (clamped to [0, 100]), root-mean-square error over repeated runs:

1. noisy sum / noisy count, ε split evenly (``noisy_mean``, add/remove neighbours: n private);
2. the same with the sum centred on the range's midpoint (half the sum's sensitivity);
3. noisy sum / true count (``noisy_mean`` with replace-one neighbours: n public, all of ε on the
   sum), clamped into the range;
4. sample-and-aggregate of the chunk means (``SampleAndAggregate``, 20 chunks);
5. **not private** — the mean of a bootstrap resample, no noise at all: resampling hides nothing
   (every value can land in the output), shown only as the floor of sampling error that some notes
   mistake for privacy.

Every private variant costs exactly ε (each run is debited on an accountant without a limit,
and the script checks the ledger). Run: ``python examples/averages_experiment.py [--plot out.png]``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dpbudget.accountant import Accountant
from dpbudget.mechanisms import Neighbouring, SampleAndAggregate, noisy_mean

DATA = Path(__file__).resolve().parent / "data" / "people.csv"
EPSILONS = (0.01, 0.03, 0.1, 0.3, 1.0)
LOWER, UPPER = 0.0, 100.0


def ages() -> np.ndarray:
    with DATA.open(newline="") as f:
        return np.array([float(row["age"]) for row in csv.DictReader(f)])


def variants(acc: Accountant, rng: np.random.Generator) -> dict[str, Callable[[np.ndarray, float],
                                                                             float]]:
    return {
        "sum/count, split": lambda x, e: noisy_mean(acc, x, LOWER, UPPER, epsilon=e,
                                                    centred=False),
        "sum/count, centred": lambda x, e: noisy_mean(acc, x, LOWER, UPPER, epsilon=e),
        "sum / true count (replace-one)": lambda x, e: noisy_mean(
            acc, x, LOWER, UPPER, epsilon=e, neighbouring=Neighbouring.REPLACE),
        "sample-and-aggregate (20 chunks)": lambda x, e: acc.release(
            SampleAndAggregate(e, function=np.mean, chunks=20, lower=LOWER, upper=UPPER), x),
        "NOT PRIVATE: bootstrap mean": lambda x, e: float(rng.choice(x, x.size).mean()),
    }


def run(trials: int, seed: int = 7) -> dict[str, dict[float, float]]:
    x = ages()
    truth = float(np.clip(x, LOWER, UPPER).mean())
    rng = np.random.default_rng(seed)
    acc = Accountant(None, rng=rng)
    out: dict[str, dict[float, float]] = {}
    for name, variant in variants(acc, rng).items():
        for epsilon in EPSILONS:
            before = acc.spent().epsilon
            errors = [variant(x, epsilon) - truth for _ in range(trials)]
            if not name.startswith("NOT PRIVATE"):  # each run cost exactly ε, no more
                assert abs(acc.spent().epsilon - before - trials * epsilon) < 1e-6 * trials
            out.setdefault(name, {})[epsilon] = float(np.sqrt(np.mean(np.square(errors))))
    return out


def report(results: dict[str, dict[float, float]]) -> str:
    lines = ["| variant | " + " | ".join(f"ε = {e}" for e in EPSILONS) + " |",
             "|---|" + "---:|" * len(EPSILONS)]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[e]:.3g}" for e in EPSILONS) + " |")
    private = {k: v for k, v in results.items() if not k.startswith("NOT")}
    smallest = EPSILONS[0]
    best = min(private, key=lambda k: private[k][smallest])
    lines.append(f"\nAt ε = {smallest} the smallest error is \"{best}\".")
    return "\n".join(lines)


def plot(results: dict[str, dict[float, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (name, row), marker in zip(results.items(), "osD^x"):
        ax.loglog(EPSILONS, [row[e] for e in EPSILONS], marker=marker, label=name,
                  linestyle=":" if name.startswith("NOT") else "-")
    ax.set_xlabel("ε")
    ax.set_ylabel("RMSE of the mean age (years)")
    ax.set_title("Private means on people.csv (n = 2,000, ages in [0, 100])")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--plot", help="write the figure to this PNG file")
    args: Any = parser.parse_args(argv)
    results = run(args.trials)
    print(report(results))
    if args.plot:
        plot(results, args.plot)
        print(f"figure: {args.plot}")


if __name__ == "__main__":
    main()
