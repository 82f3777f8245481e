"""Refused requests, logged for security review: who asked for what, and which limit said no.

A refused request is never spend — nothing was drawn and nothing was debited, so it has no place
in the ledger's chain — but a run of refusals is exactly what a security review wants to see (an
analyst probing a limit, a pipeline configured past its allocation). The gate reports each one on
the logger ``dpbudget.ledger.refusals`` at WARNING level, with the request attached as
``record.dpbudget_refusal`` (a dict): ``time``, ``analyst``, ``dataset``, ``label``,
``mechanism`` (its name), ``cost`` (the declared ε and δ), ``refused_by`` (the account, when a
limit refused), ``reason`` (the error's type) and ``message``. ``dpbudget.accountant.audit.logs.JsonlHandler``
writes them into the same JSONL log as the records (``{"refused": {...}}`` lines), and
``dpbudget audit`` counts them per analyst without mixing them into the chain or the spend.

No data: the request's public description only (names, the declared cost, the policy's limits in
the error message), never the value the release was asked about.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from dpbudget.accountant.values.errors import (
    BudgetExceededError,
    MechanismNotAllowedError,
    UnitRequiredError,
    UnknownAnalystError,
    UnknownDatasetError,
)

__all__ = ["REFUSALS", "REFUSAL_LOGGER", "log_refusal"]

REFUSAL_LOGGER = "dpbudget.ledger.refusals"
#: The errors that mean "the policy says no" (not "the request is malformed").
REFUSALS = (BudgetExceededError, MechanismNotAllowedError, UnknownDatasetError,
            UnknownAnalystError, UnitRequiredError)

_LOG = logging.getLogger(REFUSAL_LOGGER)
# A library never prints on its own: without this, Python's last-resort handler would write every
# refusal to stderr in a program that configured no logging.
logging.getLogger("dpbudget").addHandler(logging.NullHandler())


def log_refusal(error: Exception, mechanism: str, cost: Any, dataset: Any, analyst: Any,
                label: Any) -> None:
    """Report one refused request (called by the gate, then the error propagates)."""
    if not _LOG.isEnabledFor(logging.WARNING):
        return
    entry = {
        "time": datetime.now(timezone.utc).isoformat(),
        "analyst": _name(analyst), "dataset": _name(dataset), "label": _name(label),
        "mechanism": mechanism,
        "cost": None if cost is None else {"epsilon": cost.epsilon, "delta": cost.delta},
        "refused_by": getattr(error, "account", None) or None,
        "reason": type(error).__name__, "message": str(error),
    }
    _LOG.warning("refused: %s asked for %s on %s (%s)", entry["analyst"], mechanism,
                 entry["dataset"], entry["reason"], extra={"dpbudget_refusal": entry})


def _name(value: Any) -> str | None:
    # Names are the caller's own strings; anything else is named by its type only (a DataFrame
    # passed where a dataset name belongs must not end up in a log).
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return ",".join(value)  # a join's datasets
    return f"<{type(value).__name__}>"
