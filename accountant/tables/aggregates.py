"""One table statistic: the mechanisms that price it, the true values they draw on, and its answer.

Invariant: the mechanisms (and so the charge) are a function of the statistic's public parameters,
its ε and the bounds' ``Contribution`` alone — built before the debit; the true values come from
the bounded aggregates after it; the answer is a post-processing of the noisy values. Budget
splits are fixed here: a mean spends ε/2 on the count and ε/2 on the centred sum, a variance ε/3
on each of count, centred sum and centred sum of squares (``fitted``: never an ulp over ε).

No error can depend on the data after the debit: clamps beyond ``MAX_CLAMP`` in magnitude are
refused before it, and each true value is clipped into what its mechanism accepts (``clipped``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpbudget.accountant.composition.batch import batch_charge
from dpbudget.accountant.tables import sensitivities as sens
from dpbudget.accountant.tables.bounding import ROWS, SQUARES, SUM, UNITS
from dpbudget.accountant.tables.sensitivities import Contribution
from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.errors import InvalidArgumentError
from dpbudget.mechanisms.base import Mechanism
from dpbudget.mechanisms.discrete import DiscreteLaplace
from dpbudget.mechanisms.laplace import Laplace
from dpbudget.mechanisms.quantile import BinnedQuantile

__all__ = ["KINDS", "MAX_CLAMP", "Statistic", "clipped", "fitted", "plain", "present_keys",
           "released"]

# The largest clamp magnitude: with |l|, |u| <= 2^64 a kept row weighs at most 2^64 (2^128 for
# a centred square), so a sum over fewer than 2^40 rows stays below 2^168, never inf or NaN, and
# below the exact Laplace's limit MAX·min(g, 1)/4 for every ε <= 2^900 (g >= Δ₁/ε·2^-46, Δ₁ >=
# the row weight; ``dpbudget.mechanisms.grid``). Why refused before the debit, not after: a
# refusal after it would be a one-bit answer chosen by one unit's rows (44 rows at 1e306 pass,
# 45 do not), with the debit standing.
MAX_CLAMP = 2.0 ** 64
KINDS = ("count", "sum", "mean", "variance", "count_distinct_units", "quantile")
_Z95 = math.log(20.0)  # P(|Laplace(b)| > b·ln 20) = 5 %


class Statistic:
    """A statistic of a table: ``kind`` (one of ``KINDS``) of ``value`` clamped to [lower,
    upper] (``q`` and ``bins`` for a quantile), at ``epsilon``.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad parameter (nothing is read or debited).
    """

    def __init__(self, kind: str, epsilon: float, value: str | None = None,
                 lower: float | None = None, upper: float | None = None, q: float = 0.5,
                 bins: int = 1000) -> None:
        self.kind = kind
        self.epsilon = _validate.positive("epsilon", epsilon)
        self.value = value
        self.q, self.bins = q, bins
        self.lower = self.upper = 0.0
        if kind in ("count", "count_distinct_units"):
            return
        if not isinstance(value, str):
            raise InvalidArgumentError("column", value, "the name of a numeric column")
        if lower is None or upper is None:
            raise InvalidArgumentError("lower" if lower is None else "upper", None,
                                       "set: a public bound on the values, chosen without "
                                       "looking at the data")
        self.lower, self.upper = _validate.finite("lower", lower), _validate.finite("upper", upper)
        if not self.lower < self.upper:
            raise InvalidArgumentError("upper", upper, f"greater than lower ({lower})")
        for name, bound in (("lower", self.lower), ("upper", self.upper)):
            if abs(bound) > MAX_CLAMP:
                raise InvalidArgumentError(name, bound, "at most 2^64 in magnitude (a larger "
                                           "clamp could carry a sum past what the noise "
                                           "accepts, an error after the debit)")

    @property
    def centre(self) -> float:
        """m = (l + u)/2: a mean's and a variance's values are summed less m (half the weight)."""
        return (self.lower + self.upper) / 2 if self.kind in ("mean", "variance") else 0.0

    def mechanisms(self, c: Contribution) -> list[Mechanism]:
        """The mechanisms, with their sensitivities from ``c`` (see ``sensitivities``)."""
        eps = self.epsilon
        if self.kind == "count":
            return [DiscreteLaplace(eps, sensitivity=sens.count(c))]
        if self.kind == "count_distinct_units":
            return [DiscreteLaplace(eps, sensitivity=sens.distinct_units(c))]
        if self.kind == "quantile":
            return [BinnedQuantile(eps, q=self.q, lower=self.lower, upper=self.upper,
                                   bins=self.bins, rows_per_unit=sens.quantile_utility(c))]
        weight = sens.clamp(self.lower, self.upper, self.centre)
        if self.kind == "sum":
            return [Laplace(eps, sensitivity=sens.sum_of(c, weight))]
        share = eps / (2 if self.kind == "mean" else 3)
        out: list[Mechanism] = [DiscreteLaplace(share, sensitivity=sens.count(c)),
                                Laplace(share, sensitivity=sens.sum_of(c, weight))]
        if self.kind == "variance":
            out.append(Laplace(share, sensitivity=sens.sum_of(c, weight * weight)))
        return out

    def columns(self) -> tuple[str, ...]:
        """The aggregates (of ``bounding.per_group``) the mechanisms draw on, in their order."""
        return {"count": (ROWS,), "count_distinct_units": (UNITS,), "sum": (SUM,),
                "mean": (ROWS, SUM), "variance": (ROWS, SUM, SQUARES)}[self.kind]

    def values(self, found: dict[str, np.ndarray], scalar: bool,
               priced: Sequence[Mechanism]) -> list[Any]:
        """The true values, one per mechanism of ``priced`` (the statistic's, in order; counts
        as integers, sums ``clipped`` to what their mechanism accepts), from aggregates aligned
        to the released keys; ``scalar``: over the whole table (one number each)."""
        out: list[Any] = []
        for name, mechanism in zip(self.columns(), priced, strict=True):
            column = np.asarray(found[name], dtype=np.float64)
            if name in (ROWS, UNITS):
                ints = np.rint(column).astype(np.int64)
                out.append(int(ints[0]) if scalar else ints)
            else:
                out.append(clipped(float(column[0]) if scalar else column, mechanism))
        return out

    def answer(self, noisy: list[Any]) -> Any:
        """The released statistic from the noisy values: a number per key (an array), or for a
        mean or variance a dict of arrays (``mean``/``variance`` with the ``count`` and ``sum``
        it was computed from). That ``count`` is the noisy count raised to at least 1 (a mean
        divides by it: a noisy count below 1 would flip or blow up the mean), and ``sum`` is
        the noisy centred sum plus centre × that count: the three agree (mean = sum / count,
        before clamping into [lower, upper])."""
        if self.kind in ("count", "count_distinct_units", "sum", "quantile"):
            return noisy[0]
        used = np.maximum(noisy[0], 1)  # (an int, or an int array, as the noisy count)
        count = np.asarray(used, dtype=np.float64)
        centred = np.asarray(noisy[1], dtype=np.float64) / count
        mean = np.clip(self.centre + centred, self.lower, self.upper)
        if self.kind == "mean":
            return {"mean": mean, "count": used, "sum": noisy[1] + self.centre * count}
        half = (self.upper - self.lower) / 2
        variance = np.clip(np.asarray(noisy[2], dtype=np.float64) / count - centred ** 2,
                           0.0, half * half)
        return {"variance": variance, "mean": mean, "count": used}

    def per_key(self, noisy: list[Any], keys: Sequence[Any], selected: bool) -> dict[Any, Any]:
        """``{key: answer}``. ``selected``: ``noisy[0]`` is a ``PartitionSelection``'s output
        per present key (a count that cleared its threshold, >= 2; 0: not released), then come
        the statistic's values of the released keys only, in order (``released``) — none for
        a count, whose answer is the selection's own."""
        kept = [int(i) for i in np.flatnonzero(noisy[0])] if selected else range(len(keys))
        at = [(i, i) for i in kept]
        if selected and len(noisy) > 1:
            if not len(kept):
                return {}
            at, noisy = list(enumerate(kept)), noisy[1:]
        answer = self.answer(noisy)
        if isinstance(answer, dict):
            return {keys[i]: {n: plain(np.asarray(v)[j]) for n, v in answer.items()}
                    for j, i in at}
        return {keys[i]: plain(np.asarray(answer)[j]) for j, i in at}

    def accuracy(self, c: Contribution) -> dict[str, Any]:
        """The noise of each part before any release: its scale and the half-width of a 95 %
        interval (for a quantile, the rank error that holds with 95 %), without charging."""
        out: dict[str, Any] = {}
        names = ("candidate",) if self.kind == "quantile" else \
            tuple({ROWS: "rows", UNITS: "units", SUM: "sum", SQUARES: "squares"}[n]
                  for n in self.columns())
        for name, mechanism in zip(names, self.mechanisms(c)):
            if isinstance(mechanism, BinnedQuantile):
                k = len(mechanism.candidates)
                rank = 2 * mechanism.rows_per_unit * math.log(k / 0.05) / mechanism.epsilon
                out["rank"] = {"rows": rank, "spacing": (self.upper - self.lower) / self.bins}
                continue
            scale = float(getattr(mechanism, "scale"))
            out[name] = {"scale": scale, "interval95": scale * _Z95}
        return out


def fitted(total: float, kind: str, epsilon: float, args: tuple[Any, ...], c: Contribution,
           selection: Mechanism | None = None) -> Statistic:
    """The statistic at the largest ε' <= ``epsilon`` whose mechanisms' ε, with ``selection``'s,
    add up to at most ``total`` as the gate adds them (``batch_charge``, each sum rounded up):
    ε/3 three times, or ε·share and then ε − ε·share, can round one ulp over ``total``."""
    while True:
        statistic = Statistic(kind, epsilon, *args)
        parts = [*([selection] if selection is not None else []), *statistic.mechanisms(c)]
        if batch_charge(tuple(m.charge for m in parts)).epsilon <= total:
            return statistic
        epsilon = math.nextafter(epsilon, 0.0)


def clipped(value: Any, mechanism: Mechanism) -> Any:
    """A float ``value`` (or array) clipped into ±the largest magnitude ``mechanism.prepare``
    accepts (the exact Laplace's grid limit, for any length: ``limit_for`` a long vector, the
    smallest), so that no true value can make it refuse after the debit. ``MAX_CLAMP`` makes
    this a no-op on tables under 2^40 rows; it is the proof that holds whatever the table.
    Clipping each entry moves no two values further apart: the sensitivity is unchanged."""
    grid = getattr(mechanism, "grid", None)
    if not isinstance(mechanism, Laplace) or grid is None:
        return value
    limit = grid.limit_for(1 << 62)
    return np.clip(value, -limit, limit) if isinstance(value, np.ndarray) else \
        min(max(value, -limit), limit)


def present_keys(found: dict[str, Any], groups: Sequence[str]) -> list[Any]:
    """The keys of the aggregate rows, in their order (a value per key, a tuple for several)."""
    keys = list(zip(*(found[g].tolist() for g in groups)))
    return [k[0] for k in keys] if len(groups) == 1 else keys


def released(values: np.ndarray, answers: tuple[Any, ...]) -> np.ndarray | None:
    """``values`` of the keys a selection released — the first of ``answers``, as
    ``release_bounded`` hands it: the positions it released, in order; None when it released
    none (nothing to draw). Drawn on |S| entries, a length the selection's output fixes — not on
    every present key (docs/theory.md §4f)."""
    kept = answers[0]
    return values[kept] if kept.size else None


def plain(x: Any) -> Any:
    """A numpy number as a Python one (dicts of them too)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x.item() if isinstance(x, np.generic) else x
