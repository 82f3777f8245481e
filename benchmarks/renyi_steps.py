"""DP-SGD under a budget (issue 14): steps admitted and time per step, side by side with
dp-accounting's RDP and PLD accountants and with the bare floor, in one run.

(a) Steps of the Poisson-subsampled Gaussian admitted under (ε, δ) = (3, 1e-5), q = 0.01, σ = 1:
    dpbudget's "renyi" rule (planned order, no plan, the six orders it watched before issue 29),
    "pld", "advanced" and "basic"; dp-accounting's RdpAccountant and PldAccountant (offline
    calculators: the largest T whose ε ≤ 3, by bisection).
(a2) The same over (q, z) ∈ {0.01, 0.05, 0.1} × {1, 2, 4} and z = 0.8 (issue 29, item 4): with no
    plan before issue 29 (six orders, δ/6 each) and after (the order the first step fixes), the
    order planned (exact and float noise), and dp-accounting's RDP accountant offline; and the
    time of one "renyi" debit with six orders and with one.
(a3) The "pld" rule (issue 29, item 5: the step (q, z) declared with the budget) on the grid
    q ∈ {0.01, 0.05, 0.1} × z ∈ {1, 2, 4} at (3, 1e-5), float noise, beside "renyi" at its planned
    order and dp-accounting's PldAccountant (offline, 1e-4 grid).
(b) Full-batch noisy gradient descent (q = 1): "renyi" with its order planned vs "advanced".
(c) Time per DP-SGD step (n = 455 rows × d = 31, q = 0.05): the whole charged release through
    the accountant (in memory), beside the bare floor — the same clipping, Poisson mask, sum and
    float Gaussian noise in numpy, no accounting — and dp-accounting's per-step composition.

Run: ``python benchmarks/renyi_steps.py`` (needs the ``bench`` extra for dp-accounting).
"""

from __future__ import annotations

import math
import platform
import time

import numpy as np

from composition_tightness import largest  # (the benchmarks folder is on the path)

from dpbudget.accountant import Accountant, Budget, plan_order
from dpbudget.accountant.composition import RenyiComposition
from dpbudget.mechanisms import AnalyticGaussian, SubsampledGaussian

LIMIT = Budget(3.0, 1e-5)
Q, Z = 0.01, 1.0


def offline(accountant_cls: type, q: float, z: float, delta: float, eps: float) -> int:
    """The largest T whose ε (after T composed steps, fixed in advance) is within eps."""
    import logging

    import dp_accounting

    # Its fractional-order series does not converge at q = 0.1, z = 1 below α = 1.5; it drops
    # those orders (they are not the best there) with a warning per call.
    logging.getLogger("absl").setLevel(logging.ERROR)

    def fits(t: int) -> bool:
        acc = accountant_cls()
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)) \
            if q < 1 else dp_accounting.GaussianDpEvent(z)
        acc.compose(event, t)
        return bool(acc.get_epsilon(delta) <= eps)

    return largest(fits)


def old_default_orders(eps: float, delta: float) -> list[float]:
    """The six orders "renyi" watched with no plan before issue 29, each at δ/6."""
    scale = math.log(1.0 / delta) / eps
    return [float(f"{1.0 + scale * 1.1 * (8.0 / 1.1) ** (i / 5):.3g}") for i in range(6)]


def old_default(mech: SubsampledGaussian) -> int:
    rule = RenyiComposition(LIMIT, orders=old_default_orders(LIMIT.epsilon, LIMIT.delta))
    return rule.max_steps(rule.initial_state(), mech.charge)


def grid() -> list[tuple[float, float, int, int, int, int, int]]:
    """(q, z, old default, default, planned exact, planned float, dp-accounting RDP offline)."""
    from dp_accounting.rdp import rdp_privacy_accountant

    out = []
    for q, z in [(0.01, 0.8)] + [(q, z) for q in (0.01, 0.05, 0.1) for z in (1.0, 2.0, 4.0)]:
        exact, flt = SubsampledGaussian(z, sampling_rate=q, sensitivity=1.0), SubsampledGaussian(z, sampling_rate=q, noise="float", sensitivity=1.0)
        planned = Accountant(LIMIT, composition="renyi",
                             order=plan_order(LIMIT, exact)).max_releases(exact)
        planned_float = Accountant(LIMIT, composition="renyi",
                                   order=plan_order(LIMIT, flt)).max_releases(flt)
        out.append((q, z, old_default(exact),
                    Accountant(LIMIT, composition="renyi").max_releases(exact), planned,
                    planned_float, offline(rdp_privacy_accountant.RdpAccountant, q, z,
                                           LIMIT.delta, LIMIT.epsilon)))
    return out


def debit_time(repeats: int = 20000) -> dict[str, float]:
    """CPU time of one "renyi" debit of a DP-SGD step (curve values cached, as in training)."""
    charge = SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0).charge
    rules = {"six orders (no plan before issue 29)":
             RenyiComposition(LIMIT, orders=old_default_orders(LIMIT.epsilon, LIMIT.delta)),
             "one order (no plan now: fixed by the first step)": RenyiComposition(LIMIT)}
    out = {}
    for name, rule in rules.items():
        state = rule.debit(rule.initial_state(), charge)
        best = math.inf
        for _ in range(5):
            start = time.process_time()
            for _ in range(repeats):
                rule.debit(state, charge)
            best = min(best, (time.process_time() - start) / repeats)
        out[name] = best
    return out


def steps_table() -> list[tuple[str, int, str]]:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    sgm = SubsampledGaussian(Z, sampling_rate=Q, sensitivity=1.0)
    order = plan_order(LIMIT, sgm)
    float_sgm = SubsampledGaussian(Z, sampling_rate=Q, noise="float", sensitivity=1.0)
    float_order = plan_order(LIMIT, float_sgm)
    rows = [
        (f"dpbudget renyi, planned order ({float_order:g}), float noise",
         Accountant(LIMIT, composition="renyi", order=float_order).max_releases(float_sgm),
         "yes (filter)"),
        (f"dpbudget renyi, planned order ({order:g}), exact noise (the default)",
         Accountant(LIMIT, composition="renyi", order=order).max_releases(sgm), "yes (filter)"),
        ("dpbudget pld, step (q, z) declared with the budget, float noise",
         Accountant(LIMIT, composition="pld", step=(Q, Z)).max_releases(float_sgm),
         "yes: the step is fixed in advance (data and queries adaptive)"),
        ("dpbudget renyi, no plan (the order the first step fixes)",
         Accountant(LIMIT, composition="renyi").max_releases(sgm), "yes (filter)"),
        ("dpbudget renyi, no plan before issue 29 (six orders, δ/6 each)",
         old_default(sgm), "yes (filter)"),
        ("dpbudget advanced (zCDP, no amplification)",
         Accountant(LIMIT, composition="advanced").max_releases(sgm), "yes (filter)"),
        ("dpbudget basic", Accountant(LIMIT).max_releases(sgm), "yes (filter)"),
        ("dp-accounting RdpAccountant (offline)",
         offline(rdp_privacy_accountant.RdpAccountant, Q, Z, LIMIT.delta, LIMIT.epsilon),
         "no: T fixed in advance"),
        ("dp-accounting PldAccountant (offline)",
         offline(lambda: pld_privacy_accountant.PLDAccountant(
             value_discretization_interval=1e-3), Q, Z, LIMIT.delta, LIMIT.epsilon),
         "no: T fixed in advance (PLD filters are invalid in general)"),
    ]
    del dp_accounting
    return rows


def full_batch() -> list[tuple[float, int, int]]:
    out = []
    for z in (2.0, 5.0, 20.0, 50.0):
        mech = AnalyticGaussian(noise_multiplier=z, delta=1e-6, sensitivity=1.0)
        advanced = Accountant(LIMIT, composition="advanced").max_releases(mech)
        renyi = Accountant(LIMIT, composition="renyi",
                           order=plan_order(LIMIT, mech)).max_releases(mech)
        out.append((z, renyi, advanced))
    return out


def pld_grid() -> list[tuple[float, float, int, int, int]]:
    """(q, z, pld rule, renyi planned float, dp-accounting PLD offline at a 1e-4 grid)."""
    from dp_accounting.pld import pld_privacy_accountant

    out = []
    for q in (0.01, 0.05, 0.1):
        for z in (1.0, 2.0, 4.0):
            sgm = SubsampledGaussian(z, sampling_rate=q, noise="float", sensitivity=1.0)
            pld = Accountant(LIMIT, composition="pld", step=(q, z)).max_releases(sgm)
            renyi = Accountant(LIMIT, composition="renyi",
                               order=plan_order(LIMIT, sgm)).max_releases(sgm)
            oracle = offline(lambda: pld_privacy_accountant.PLDAccountant(
                value_discretization_interval=1e-4), q, z, LIMIT.delta, LIMIT.epsilon)
            out.append((q, z, pld, renyi, oracle))
    return out


def timing(repeats: int = 400) -> dict[str, float]:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(455, 31))
    mech = SubsampledGaussian(2.0, sampling_rate=0.05, sensitivity=1.0)
    acc = Accountant(None, composition="renyi", rng=None)

    def ours() -> None:
        acc.release(mech, rows)

    def floor() -> None:
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        clipped = rows * np.minimum(1.0, 1.0 / norms)[:, None]
        keep = rng.random(len(rows)) < 0.05
        clipped[keep].sum(axis=0) + rng.normal(0.0, 2.0, size=31)

    def dpacc() -> None:
        import dp_accounting
        from dp_accounting.rdp import rdp_privacy_accountant
        a = rdp_privacy_accountant.RdpAccountant()
        a.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(2.0)))

    out = {}
    for name, fn in (("dpbudget release (renyi, in memory, exact noise)", ours),
                     ("bare floor: numpy clip + mask + sum + float noise", floor),
                     ("dp-accounting RdpAccountant.compose, one step", dpacc)):
        fn()
        start = time.process_time()
        for _ in range(repeats):
            fn()
        out[name] = (time.process_time() - start) / repeats
    return out


def main() -> None:
    start = time.time()
    print(f"Run on {platform.machine()}, Python {platform.python_version()}, "
          f"numpy {np.__version__}\n")
    print(f"### (a) Steps admitted at {LIMIT}, q = {Q}, noise multiplier {Z}\n")
    print("| accountant | steps | valid when steps are chosen adaptively? |")
    print("|---|---:|---|")
    table = steps_table()
    for name, n, valid in table:
        print(f"| {name} | {n:,} | {valid} |")
    best = dict((name, n) for name, n, _ in table)
    rdp_offline = best["dp-accounting RdpAccountant (offline)"]
    planned = max(n for name, n, _ in table if name.startswith("dpbudget renyi, planned"))
    print(f"\nplanned / offline RDP = {planned / rdp_offline:.4f}")
    print(f"\n### (a2) Steps admitted at {LIMIT}: no plan before and after issue 29, planned\n")
    print("| q | z | no plan, before (6 orders) | no plan, now | planned (exact) | "
          "now / planned | planned (float) | dp-accounting RDP (offline) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for q, z, old, now, planned, planned_float, rdp_off in grid():
        print(f"| {q:g} | {z:g} | {old:,} | {now:,} | {planned:,} | {now / planned:.3f} | "
              f"{planned_float:,} | {rdp_off:,} |")
    print("\n| one renyi debit (DP-SGD step, q = 0.01, z = 1) | CPU time |")
    print("|---|---:|")
    for name, t in debit_time().items():
        print(f"| {name} | {t * 1e6:.2f} µs |")
    print(f"\n### (a3) The pld rule on a grid of (q, z) at {LIMIT}, float noise\n")
    print("| q | z | pld rule | renyi planned | pld / renyi | dp-accounting PLD (offline, 1e-4) "
          "| pld / dp-accounting |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for q, z, pld, renyi, oracle in pld_grid():
        print(f"| {q:g} | {z:g} | {pld:,} | {renyi:,} | {pld / renyi:.3f} | {oracle:,} "
              f"| {pld / oracle:.4f} |")
    print(f"\n### (b) Full-batch Gaussian steps at {LIMIT}: renyi (planned order) vs advanced\n")
    print("| noise multiplier | renyi | advanced | ratio |")
    print("|---:|---:|---:|---:|")
    for z, renyi, advanced in full_batch():
        print(f"| {z:g} | {renyi:,} | {advanced:,} | {renyi / advanced:.3f} |")
    print("\n### (c) CPU time per DP-SGD step (455 × 31 rows, q = 0.05)\n")
    print("| what | time per step | × floor |")
    print("|---|---:|---:|")
    times = timing()
    floor = times["bare floor: numpy clip + mask + sum + float noise"]
    for name, t in times.items():
        print(f"| {name} | {t * 1e6:,.0f} µs | {t / floor:.1f} |")
    print(f"\n(took {time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
