"""``Charge``: the cost declaration of one step, as a composition rule reads it.

Invariant: a ``Charge`` is plain immutable data (a ``NamedTuple``, like every internal value the
library builds on each release: cheap to make, impossible to change) built from a mechanism's public
parameters; it knows nothing of ledgers or rules. A mechanism declares it, a composition rule
interprets it, the ledger encodes it (``dpbudget.accountant.ledger.record``). Bottom layer: imports nothing
of ours but ``Budget``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dpbudget.accountant.values.budget import Budget

__all__ = ["Charge"]


class Charge(NamedTuple):
    """What a composition rule needs to know about one step.

    Attributes:
        epsilon, delta: the step's (ε, δ)-DP cost.
        rho: its zero-concentrated DP cost where it has a tighter one (Bun–Steinke 2016), else None.
        mu: its Gaussian-DP parameter where it has one (Dong–Roth–Su 2019), else None.
        mechanism: the mechanism's name, for error messages.
        rdp: its Rényi-DP curve where it has one beyond what ρ or a pure ε give (a tuple: the
            kind and its public parameters, ``dpbudget.accountant.values.rdp``), else None.
        parts: for a batch (``Accountant.release_many``), the charges of its items, fixed before
            any of them is released; empty for a single release. ``epsilon``/``delta`` of a batch
            are then the basic-composition totals, and each rule composes ``parts`` itself.

    >>> Charge(0.5, 0.0, rho=0.125, mechanism="Laplace").budget
    Budget(epsilon=0.5, delta=0.0)
    """

    epsilon: float
    delta: float
    rho: float | None = None
    mu: float | None = None
    mechanism: str = ""
    parts: tuple["Charge", ...] = ()
    rdp: tuple[Any, ...] | None = None

    @property
    def budget(self) -> Budget:
        return Budget(self.epsilon, self.delta)
