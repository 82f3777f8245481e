"""Exact noise samples per second, beside the peers and the floor, in one run (issue 10).

Rows (10^6-element vectors unless noted, noise from the OS CSPRNG):

* dpbudget discrete Laplace (scale 10), discrete Gaussian (σ = 10), and ``Laplace`` (scale 10)
  and ``AnalyticGaussian`` (σ = 10) on floats released on their grids: the exact samplers;
* the floor: numpy's ``Generator.laplace`` / ``normal`` (PCG64, insecure, float) and the raw
  ``os.urandom`` bytes the exact samplers consume;
* OpenDP's secure samplers when installed (``pip install -e ".[bench]"``): ``make_laplace`` on a
  float vector, ``make_gaussian`` on a float vector, ``make_laplace`` on an integer vector
  (discrete Laplace) and ``make_gaussian`` on an integer vector (discrete Gaussian);
* scalar ``Accountant.release(Laplace(1e-9), 1.0)`` and ``release(AnalyticGaussian(...), 1.0)``
  in memory (exact noise) against ``noise="float"``.

Each row is the median of ``--rounds`` timings (rows interleaved per round). Usage::

    python benchmarks/exact_noise.py --rounds 5 [--n 1000000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from dpbudget.accountant import Accountant, Budget
from dpbudget.mechanisms import AnalyticGaussian, Laplace
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.bits import RandomBits
from dpbudget.mechanisms.exact import discrete_gaussian_array, discrete_laplace_array
from dpbudget.mechanisms.sampling import Sampler


def _opendp_rows(n: int) -> dict[str, Callable[[], object]]:
    try:
        import opendp.prelude as dp
    except ImportError:
        return {}
    dp.enable_features("contrib")
    floats = [0.0] * n
    ints = [0] * n
    float_space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float)
    int_space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)
    lap_f = dp.m.make_laplace(*float_space, scale=10.0)
    lap_i = dp.m.make_laplace(*int_space, scale=10.0)
    gauss_f = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                                 dp.l2_distance(T=float), scale=10.0)
    gauss_i = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)),
                                 dp.l2_distance(T=int), scale=10.0)
    return {"OpenDP make_laplace, float vector": lambda: lap_f(floats),
            "OpenDP make_gaussian, float vector": lambda: gauss_f(floats),
            "OpenDP make_laplace, integer vector": lambda: lap_i(ints),
            "OpenDP make_gaussian, integer vector": lambda: gauss_i(ints)}


def _scalar_rows(k: int) -> dict[str, Callable[[], object]]:
    rows = {}
    for kind in ("Laplace", "AnalyticGaussian"):
        for noise in ("exact", "float"):
            acc = Accountant(Budget(1e9, 0.5))
            m = (Laplace(1e-9, noise=noise, sensitivity=1.0) if kind == "Laplace" else
                 AnalyticGaussian(1e-9, delta=1e-15, noise=noise, sensitivity=1.0))

            def run(acc: Accountant = acc, m: Mechanism = m) -> None:
                for _ in range(k):
                    acc.release(m, 1.0)
            rows[f"scalar release({kind}), noise={noise!r} ({k:,} releases)"] = run
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scalar", type=int, default=20_000)
    args = parser.parse_args()
    n = args.n
    bits = RandomBits(None)
    grid = Laplace(1.0, sensitivity=10.0)
    gauss = AnalyticGaussian(1.0, delta=1e-5, sensitivity=10.0 / AnalyticGaussian(1.0, delta=1e-5, sensitivity=1.0).sigma)
    zeros = np.zeros(n)
    generator = np.random.default_rng()
    rows: dict[str, Callable[[], object]] = {
        "dpbudget discrete Laplace (scale 10)": lambda: discrete_laplace_array(bits, 1, 10, n),
        "dpbudget discrete Gaussian (sigma 10)": lambda: discrete_gaussian_array(bits, 100, 1, n),
        "dpbudget Laplace on floats, grid (scale 10)": lambda: grid.draw(zeros, Sampler(None)),
        "dpbudget AnalyticGaussian on floats, grid (sigma 10)":
            lambda: gauss.draw(zeros, Sampler(None)),
        "floor: numpy Generator.laplace (insecure float)": lambda: generator.laplace(0, 10, n),
        "floor: numpy Generator.normal (insecure float)": lambda: generator.normal(0, 10, n),
        "floor: os.urandom, 8 bytes per sample": lambda: os.urandom(8 * n),
        **_opendp_rows(n),
    }
    scalar = _scalar_rows(args.scalar)
    times: dict[str, list[float]] = {name: [] for name in [*rows, *scalar]}
    for _ in range(args.rounds):
        for name, run in [*rows.items(), *scalar.items()]:
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"numpy {np.__version__}; median of {args.rounds} rounds; n = {n:,}\n")
    print(f"| row | samples/s | vs dpbudget discrete Laplace |\n|---|---:|---:|")
    base = n / statistics.median(times["dpbudget discrete Laplace (scale 10)"])
    for name in rows:
        rate = n / statistics.median(times[name])
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |")
    print()
    for name in scalar:
        exact = name.replace("noise='float'", "noise='exact'")
        exact_rate = args.scalar / statistics.median(times[exact])
        rate = args.scalar / statistics.median(times[name])
        print(f"| {name} | {rate:,.0f} releases/s | {rate / exact_rate:.2f} × exact |")


if __name__ == "__main__":
    main()
