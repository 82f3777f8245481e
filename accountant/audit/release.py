"""Whether a release record can be what it claims: seeded noise only in a simulation ledger, and
a record that names one of the library's mechanisms one that mechanism could write.

The gate records a mechanism under its class identity (``dpbudget.mechanisms.base.mechanism_name``): only
the library's own ``Laplace`` is ever recorded as ``"Laplace"``, a custom class under its
module-qualified name. The audit holds every release record (a single release, each item of a
batch, a sparse-vector session) that names a library mechanism to that: its recorded parameters
must rebuild the mechanism (its constructor, given the parameters it takes), and the rebuilt
mechanism must declare exactly the recorded cost (ε, δ, ρ, μ, RDP curve) and noise kind. A record
that does not — a custom class recorded under a library name with parameters of its own, a cost
or a noise kind that the parameters do not give — is a ``release`` problem (exit bit 16).

What the audit cannot see: the record of a look-alike (a custom class that took a library name)
whose parameters, cost and noise kind are exactly those of a genuine release is, byte for byte,
what the library writes. Older versions, which recorded a mechanism by its bare class name, could
write such a record; the present gate cannot, so it can only come from an old ledger (or from
someone who can write the ledger, which the chain and its key reveal).

Rebuilding needs no data: collection-valued parameters that are recorded as counts (candidates,
categories) are rebuilt as that many stand-ins, and a function (``SampleAndAggregate``) as a
stand-in, since no cost depends on them. Each distinct description is rebuilt once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["LibraryRecords"]

_RELEASES = ("release", "session")
_STAND_INS: dict[str, Callable[[Any], Any]] = {
    "candidates": lambda n: tuple(range(int(n))), "categories": lambda n: tuple(range(int(n))),
    "function": lambda name: len}


class LibraryRecords:
    """Checks records that name library mechanisms; remembers each description's verdict."""

    def __init__(self) -> None:
        self.verdicts: dict[Any, str | None] = {}
        self.classes: dict[str, type] | None = None

    def check(self, record: dict[str, Any], seeded_ok: bool) -> str | None:
        """Why ``record`` cannot be the release it claims, or None: seeded noise where
        ``seeded_ok`` is false (a ledger not created for simulation, whose first record does not
        say so: anyone who knows the seed subtracts it), or not a release of the library
        mechanism it names."""
        noise = record.get("noise")
        if not seeded_ok and isinstance(noise, str) and noise.endswith("-seeded"):
            return (f"seeded noise ({noise}) on a ledger not created for simulation (its first "
                    "record does not say so): anyone who knows the seed subtracts it")
        if record.get("kind") not in _RELEASES:
            return None
        mechanism = record.get("mechanism") or {}
        if mechanism.get("name") == "batch":
            items = (mechanism.get("params") or {}).get("items") or []
            # The replay charges each item's whole recorded cost (``cost.parts``: ρ, μ, the RDP
            # curve), so that is what each must rebuild to, not only its (ε, δ) (found by review:
            # a forged curve in a batch was otherwise replayed unchecked).
            parts = (record.get("cost") or {}).get("parts")
            if parts is not None and (not isinstance(parts, list) or len(parts) != len(items)):
                return "its cost's parts do not match its items one for one"
            for i, item in enumerate(items):
                cost = item.get("cost") if parts is None else parts[i]
                why = self._item(item.get("name"), item.get("params"), cost, None)
                if why is not None:
                    return f"its item {i}: {why}"
            return None
        return self._item(mechanism.get("name"), mechanism.get("params"), record.get("cost"),
                          noise)

    def _item(self, name: Any, params: Any, cost: Any, noise: Any) -> str | None:
        """``noise`` is the record's member ("exact-csprng"...), None for a batch item."""
        cls = (self.classes or self._library()).get(name) if type(name) is str else None
        if cls is None:
            return None
        # Records of one mechanism repeat one description: its verdict is computed once.
        try:
            key: Any = (name, noise, *params.items(), None, *cost.items())
            verdict = self.verdicts.get(key, self)
        except (AttributeError, TypeError):  # a list among them, or not a dict at all
            key = repr((name, params, cost, noise))
            verdict = self.verdicts.get(key, self)
        if verdict is self:
            if len(self.verdicts) > 4096:
                self.verdicts.clear()
            kind = None if noise is None else str(noise).split("-")[0]
            verdict = self.verdicts[key] = _verdict(cls, params, cost, kind)
        return verdict  # type: ignore[return-value]

    def _library(self) -> dict[str, type]:
        if self.classes is None:
            from dpbudget import mechanisms
            from dpbudget.mechanisms.base import Mechanism, mechanism_name

            found = (getattr(mechanisms, n) for n in mechanisms.__all__)
            self.classes = {c.__name__: c for c in found if isinstance(c, type)
                            and issubclass(c, Mechanism) and not inspect.isabstract(c)
                            and mechanism_name(c) == c.__name__}
        return self.classes


def _verdict(cls: Any, params: Any, cost: Any, noise: str | None) -> str | None:
    """Why ``params`` do not rebuild ``cls`` with exactly ``cost`` and ``noise``, or None."""
    from dpbudget.accountant.ledger.record import charge_record

    name = cls.__name__
    if not isinstance(params, dict) or not isinstance(cost, dict):
        return f"it names the library mechanism {name} without its parameters and cost"
    signature = inspect.signature(cls.__init__)  # (the metaclass's __call__ takes anything)
    given = {}
    for p in list(signature.parameters.values())[1:]:
        if p.name in _STAND_INS and p.default is p.empty:
            given[p.name] = _STAND_INS[p.name](params.get(p.name, 1))
        elif p.name in params and p.name not in _STAND_INS:
            given[p.name] = params[p.name]
    # Some constructors take one of several parameters (AnalyticGaussian: epsilon or sigma) and
    # record both: each optional one is also tried left out, and is then what the rebuilt
    # mechanism must compute. The first way that gives the recorded cost and noise kind wins.
    optional = [p.name for p in signature.parameters.values()
                if p.name in given and p.default is not p.empty]
    tries = [(given, None)] + [({k: v for k, v in given.items() if k != drop}, drop)
                               for drop in optional]
    wanted = dict(cost)
    failure = "they do not rebuild it"
    for kwargs, left_out in tries:
        try:
            rebuilt = cls(**kwargs)
        except Exception:  # noqa: BLE001 - any refusal is the verdict's reason, reported below
            continue
        if left_out is not None and rebuilt.params().get(left_out) != params[left_out]:
            continue
        if rebuilt.query_norm is not None and getattr(rebuilt, "sensitivity", 0) is None:
            # (the gate refuses to release a mechanism whose Δ is unstated: issue 30)
            failure = "they leave its sensitivity unstated, which no release records"
            continue
        declared = charge_record(rebuilt.charge)
        if wanted.keys() <= {"epsilon", "delta"}:  # a batch item states its (ε, δ) only
            declared = {k: declared[k] for k in ("epsilon", "delta")}
        if declared != wanted:
            failure = f"they give the cost {declared}, not the recorded {wanted}"
            continue
        if noise is not None and rebuilt.noise != noise:
            failure = f"they give {rebuilt.noise!r} noise, not the recorded {noise!r}"
            continue
        return None
    return (f"it names the library mechanism {name}, but its recorded parameters do not rebuild "
            f"it with its recorded cost and noise ({failure}): it was not released by the "
            "library's own mechanism")
