"""The charge of a batch: several steps, each item's mechanism and cost fixed in advance (its input
may be chosen adaptively, from earlier answers), presented to a rule as one step.

Invariant: ``batch_charge`` only adds up what every rule can read off the parts — the basic totals
(Σε_i, Σδ_i), the summed zCDP cost Σρ_i (Bun–Steinke 2016, Lemma 2.3) where every part has one, and
the composed Gaussian-DP parameter sqrt(Σμ_i²) (Dong–Roth–Su 2019, Cor. 3.3) where every part has
one — each rounded up. Which of them a rule uses, and why that is valid for a list whose costs are
fixed before any of it is released, is the rule's business (``docs/theory.md`` §2, "Batches").
"""

from __future__ import annotations

import math

from dpbudget.accountant.values import _numeric
from dpbudget.accountant.values.charge import Charge

__all__ = ["batch_charge"]


def batch_charge(parts: tuple[Charge, ...]) -> Charge:
    """One ``Charge`` for ``parts`` (non-empty), carrying the parts for the rule to compose.

    Its δ is the plain sum (it may reach 1; a rule refuses such a step, and ``Budget`` clips the
    batch's reported cost below 1).

    >>> c = batch_charge((Charge(0.5, 0.0, rho=0.125), Charge(0.25, 1e-6)))
    >>> c.epsilon, c.delta, c.rho, len(c.parts)
    (0.75, 1e-06, None, 2)
    """
    eps = dlt = 0.0
    for p in parts:
        eps, dlt = _numeric.add_up(eps, p.epsilon), _numeric.add_up(dlt, p.delta)
    rhos = [p.rho for p in parts]
    mus = [p.mu for p in parts]
    rho = None if None in rhos else math.nextafter(math.fsum(rhos), math.inf)  # type: ignore[arg-type]
    mu = (None if None in mus else
          _numeric.div_up(math.sqrt(math.fsum(m * m for m in mus)), 1.0))  # type: ignore[operator]
    return Charge(eps, dlt, rho, mu, f"a batch of {len(parts)}", parts)
