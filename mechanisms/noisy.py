"""Noisy helpers for the seed workloads: a private mean and private quantiles, each released
through an accountant, a pipeline or a budgeted function's handle, in one debit.

Unlike ``dpbudget.mechanisms.queries`` (true answers, which are never private), what these return is private:
each helper validates all its arguments, then makes one call to ``release_many`` (or ``release``)
that is debited before any noise is drawn, all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataError, InvalidTypeError
from dpbudget.mechanisms.laplace import Laplace
from dpbudget.mechanisms.quantile import Quantile
from dpbudget.mechanisms.queries import Neighbouring, _relation, true_clamped_sum, true_count
from dpbudget.mechanisms.rows import clamp_range

__all__ = ["Releaser", "noisy_mean", "noisy_quantiles"]


class Releaser(Protocol):
    """What a query helper releases through: an ``Accountant``, a ``Pipeline``, or the handle a
    ``@acc.budgeted`` function is given (a ``Pipeline``). Both take these keywords; a pipeline
    admits only its own dataset and analyst, and charges its own allocation.

    A helper validates all its arguments, then makes one call (``release`` or ``release_many``,
    one debit): a bad argument or a refusal debits nothing, wherever it runs.
    """

    def release(self, mechanism: Any, value: Any, *, dataset: Any = ...,
                analyst: str | None = ..., label: str | None = ...) -> Any: ...

    def release_many(self, items: Any, *, dataset: Any = ..., analyst: str | None = ...,
                     label: str | None = ...) -> list[Any]: ...


def _releaser(accountant: Any) -> Releaser:
    """``accountant`` if it can release; checked first, before anything is computed or debited."""
    if not (callable(getattr(accountant, "release", None))
            and callable(getattr(accountant, "release_many", None))):
        raise InvalidTypeError("accountant", accountant,
                               "an Accountant or a Pipeline (what the helper releases through)")
    return accountant  # type: ignore[no-any-return]


def _where(dataset: str | None, analyst: str | None) -> dict[str, Any]:
    """Where a helper's release is charged, as ``release``'s keywords: ``dataset`` only when the
    caller named one, so that an accountant uses its default dataset and a pipeline its own."""
    return {"analyst": analyst} if dataset is None else {"dataset": dataset, "analyst": analyst}


def noisy_mean(accountant: Releaser, data: Sequence[float], lower: float, upper: float, *,
               epsilon: float, dataset: str | None = None, count_share: float = 0.5,
               centred: bool = True, neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
               analyst: str | None = None, label: str | None = None) -> float:
    """A differentially private mean of values clamped into [lower, upper], costing ``epsilon``.

    Under add/remove neighbours the mean is a noisy sum over a noisy count, ε split between them
    (``count_share`` to the count), two Laplace releases debited through ``accountant`` as one
    batch (``release_many``): both or neither, ε in total under basic composition. With ``centred`` the sum is taken around the
    midpoint, halving its sensitivity. Under replace neighbours n is public and only the sum is
    noised (all of ε). The noisy count is floored at 1 and the result clamped back into
    [lower, upper] — post-processing, which costs no privacy (Dwork–Roth 2014, Prop. 2.1).

    Args:
        accountant: the ``Accountant`` that debits both releases, or a ``Pipeline`` (the
            handle of a ``@budgeted`` function too), which debits its own allocation.
        dataset: the dataset charged (None: the accountant's default, or the pipeline's own).
        data, lower, upper: the values and the clamping range (chosen without looking at data).
        epsilon: total ε for the mean.
        count_share: the fraction of ε spent on the count, in (0, 1).
        dataset: as for ``Accountant.release``; ``None`` (left out): left out there too, so
            the accountant's rule for an unnamed dataset applies (``dpbudget.accountant.gate.unnamed``).

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=1)
    >>> 30 <= noisy_mean(acc, [40] * 1000, 0, 100, epsilon=1.0) <= 50
    True
    >>> acc.spent()
    Budget(epsilon=1.0, delta=0.0)
    """
    releaser = _releaser(accountant)
    eps = _validate.positive("epsilon", epsilon)
    share = _validate.probability("count_share", count_share, low_open=True)
    relation = _relation(neighbouring)
    lo, hi = clamp_range(lower, upper)
    total = true_clamped_sum(data, lo, hi, centred=centred, neighbouring=relation)
    common = _where(dataset, analyst)
    tag = label or "mean"
    if relation is Neighbouring.REPLACE:
        n = float(len(data))
        if n == 0:
            raise InvalidDataError("data", data, "non-empty under replace neighbours")
        noisy_n = n
        noisy_sum = releaser.release(Laplace(eps, sensitivity=total.l1_sensitivity), total.value,
                                       label=f"{tag}: sum", **common)
    else:
        n_query = true_count(data)
        # All or nothing: the count and the sum are one batch, debited in one transaction, so
        # a mean that does not fit spends nothing (released one at a time, a refused sum would
        # leave the count's ε spent on an answer nobody gets).
        noisy_n, noisy_sum = releaser.release_many(
            [(Laplace(eps * share, sensitivity=n_query.l1_sensitivity), n_query.value),
             (Laplace(eps * (1.0 - share), sensitivity=total.l1_sensitivity), total.value)],
            label=tag, **common)
    noisy_n = max(noisy_n, 1.0)
    estimate = ((lo + hi) / 2.0 if centred else 0.0) + noisy_sum / noisy_n
    return float(min(max(estimate, lo), hi))


def noisy_quantiles(accountant: Releaser, data: Sequence[float], qs: Sequence[float],
                    lower: float, upper: float, *, epsilon: float, dataset: str | None = None,
                    analyst: str | None = None, label: str | None = None,
                    bins: int = 1000) -> list[float]:
    """Several quantiles of values clamped into [lower, upper], costing ``epsilon`` in total.

    Each quantile is a ``Quantile`` of ε/m (m = ``len(qs)``) over the same public grid of
    ``bins + 1`` candidates, released as one batch (``release_many``): all or none, debited in
    one transaction. Under basic composition the batch costs ε (Dwork–Roth 2014, Thm 3.16: the
    m releases read the same rows); the batch rule may charge less for a list fixed in advance
    (docs/theory.md §2, "Batches"). Joint methods (Gillenwater et al., ICML 2021) are more
    accurate for many quantiles; this is the simple, standard one.

    >>> from dpbudget.accountant import Accountant, Budget
    >>> acc = Accountant(Budget(1.0), rng=4)
    >>> lo, hi = noisy_quantiles(acc, list(range(1000)), [0.1, 0.9], 0, 1000, epsilon=1.0)
    >>> 50 <= lo <= 150 and 850 <= hi <= 950
    True
    """
    releaser = _releaser(accountant)
    if isinstance(qs, (str, bytes)) or not hasattr(qs, "__len__") or len(qs) == 0:
        raise InvalidArgumentError("qs", qs, "a non-empty sequence of quantiles in [0, 1]")
    share = _validate.positive("epsilon", epsilon) / len(qs)
    items = [(Quantile(share, q=q, lower=lower, upper=upper, bins=bins), data) for q in qs]
    return [float(v) for v in releaser.release_many(items, label=label or "quantiles",
                                                     **_where(dataset, analyst))]
