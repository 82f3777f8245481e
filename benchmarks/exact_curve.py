"""Exact noise vs float noise in DP-SGD steps (issue 29, item 3): what the exact-noise curve costs.

For each (q, z, limit), the steps a planned-order "renyi" accountant admits for a
``SubsampledGaussian`` with exact noise (the default, curve ``poisson-discrete-gaussian``), with
the curve exact noise had before issue 29 (``poisson-zcdp``: any zCDP base, a Taylor bound on the
add direction), and with float noise (``poisson-gaussian``, MTZ's fractional series).

Settings: (q, z) ∈ {0.01, 0.05, 0.1} × {1, 2, 4} at (3, 1e-5); Abadi et al. 2016's medium noise
(q = 0.01, σ = 4, (2, 1e-5)); TF-Privacy's MNIST tutorial (batch 256 of 60,000, z = 1.1,
(3, 1e-5)); Opacus's MNIST example (q = 0.004, z = 1.0, (3, 1e-5)).

Run: ``python benchmarks/exact_curve.py`` (no extra needed; about a minute).
"""

from __future__ import annotations

import itertools

from dpbudget.accountant import Accountant, Budget, plan_order
from dpbudget.mechanisms import SubsampledGaussian

SETTINGS = [(q, z, Budget(3.0, 1e-5), "") for q, z in itertools.product((0.01, 0.05, 0.1),
                                                                          (1.0, 2.0, 4.0))]
SETTINGS += [(0.01, 4.0, Budget(2.0, 1e-5), "Abadi et al., medium noise"),
             (256 / 60000, 1.1, Budget(3.0, 1e-5), "TF-Privacy MNIST"),
             (0.004, 1.0, Budget(3.0, 1e-5), "Opacus MNIST")]


class _OldCurve(SubsampledGaussian):
    """Exact noise charged the curve it declared before issue 29."""

    @property
    def rdp(self) -> tuple[str, float, float]:
        return ("poisson-zcdp", self.sampling_rate, self.noise_multiplier)


def planned_steps(mech: SubsampledGaussian, limit: Budget) -> tuple[float, int]:
    order = plan_order(limit, mech)
    return order, Accountant(limit, composition="renyi", order=order).max_releases(mech)


def main() -> None:
    print("| q | z | limit | setting | float planned | exact planned (now) | ratio "
          "| exact, old curve | ratio |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for q, z, limit, name in SETTINGS:
        _, floating = planned_steps(SubsampledGaussian(z, sampling_rate=q, noise="float", sensitivity=1.0), limit)
        order, exact = planned_steps(SubsampledGaussian(z, sampling_rate=q, sensitivity=1.0), limit)
        _, before = planned_steps(_OldCurve(z, q), limit)
        print(f"| {q:.4g} | {z:g} | ({limit.epsilon:g}, {limit.delta:g}) | {name} "
              f"| {floating:,} | {exact:,} (order {order:g}) | {exact / floating:.4f} "
              f"| {before:,} | {before / floating:.4f} |")


if __name__ == "__main__":
    main()
