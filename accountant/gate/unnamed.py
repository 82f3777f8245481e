"""``dataset=`` left out of a request: the dataset ``"default"``, or refused.

Invariant: a request that names no dataset is charged to ``"default"`` only while the accountant
knows no other dataset — none in its policy, none charged in its ledger when it was opened, none
named through it since. Otherwise it is refused (``InvalidArgumentError`` naming ``dataset`` and
listing the known ones) before anything is drawn or debited: after
``release(m, x, dataset="survey")``, a ``release(m, x)`` meant for "survey" would otherwise be
admitted on a fresh "default" budget, doubling what "survey" can lose. Reads (``spent``,
``remaining``, ``limit``) follow the same rule, so that no figure of the wrong budget is read as
the one meant.

Datasets charged by another accountant or process after this one opened its ledger are seen by
the debit itself: the account "dataset:default" is never opened in a ledger that holds another
dataset's (``Gate._no_twin``, in the debit's transaction), named "default" or not — it is the
budget of a ledger with no named dataset, never a second one beside them. The audit lists every
dataset with the record that first charged it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from dpbudget.accountant.values.errors import InvalidArgumentError

__all__ = ["NOT_GIVEN", "named"]


class _NotGiven:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<dataset not given>"

    def __reduce__(self) -> str:
        return "NOT_GIVEN"  # (copied or pickled: the one marker, ``named`` compares identity)


#: The default of every ``dataset=`` parameter: "not given" (``named``).
NOT_GIVEN: Any = _NotGiven()


def named(dataset: Any, known: Collection[str]) -> Any:
    """``dataset`` itself; for ``NOT_GIVEN``, ``"default"`` if ``known`` (the datasets the
    accountant knows) holds no other name.

    Raises:
        InvalidArgumentError: ``dataset`` not given while other datasets are known; the message
            lists them (at most 10).
    """
    if dataset is not NOT_GIVEN:
        return dataset
    others = sorted(set(known) - {"default"})  # (a copy: another thread may add a name)
    if others:
        listed = ", ".join(repr(n) for n in others[:10]) + (", ..." if others[10:] else "")
        raise InvalidArgumentError("dataset", dataset, f"given (this accountant knows the "
                                   f"datasets [{listed}]: a request without dataset= is taken "
                                   "for 'default' only while no other is known)",
                                   "Nothing was drawn or debited.")
    return "default"
