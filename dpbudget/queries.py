"""``dp.queries``: TRUE, NOT PRIVATE answers and their sensitivities, for a mechanism to release.

Nothing here is private: ``true_count(rows).value`` is the real number of rows. What these helpers
return is a ``Query``, which a mechanism releases with noise calibrated to the query's own
sensitivity (L1 for the Laplace family, L2 for the Gaussian family), so that no Δ is guessed:

>>> import dpbudget as dp
>>> acc = dp.Accountant(dp.Budget(1.0), rng=0)
>>> rows = [3, 1, 4, 1, 5]
>>> noisy = acc.release(dp.Laplace(0.5), dp.queries.true_count(rows), dataset="survey")
>>> acc.last_receipt.mechanism, acc.spent("survey")
('Laplace', Budget(epsilon=0.5, delta=0.0))
>>> dp.queries.true_clamped_sum(rows, 0, 10)
Query(value=<hidden: the TRUE, NOT PRIVATE answer>, l1_sensitivity=10.0, l2_sensitivity=10.0, \
neighbouring=<Neighbouring.ADD_REMOVE: 'add/remove'>)

The helpers are defined in ``dpbudget.mechanisms.queries``.
"""

from dpbudget.mechanisms.queries import (
    Neighbouring,
    Query,
    true_clamped_sum,
    true_count,
    true_histogram,
)

__all__ = ["Neighbouring", "Query", "true_clamped_sum", "true_count", "true_histogram"]
