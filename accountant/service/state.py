"""What a query service process holds: ONE accountant on the ledger, the registered tables, the
tokens of the policy in force — and the one function that runs a query for an analyst.

The process rule (docs/threat-model.md): a ledger belongs to the process that opened it, so a
server process opens its accountant once and every request thread uses it (the gate is safe
across threads: each debit is one ledger transaction). The policy in force is the ledger's: each
request reads its pointer (one row) and, when the owner changed the policy (a token issued or
revoked, a limit changed), reopens the accountant on the same ledger before authenticating; a
policy changed between that read and the debit is refused by the gate's own check inside the
transaction (``PolicyChangedError``), and the query is authenticated again under the new policy,
so a revoked token is never charged. The accountant and the tokens are one immutable pair: a
request authenticates and is charged under the same policy, whatever another thread swaps in.

A request's ``Deadline`` is shared by the request, which gives up at it, and its worker, which
debits only if the request has not given up: a query still queued (behind the worker pool) when
its client is answered is refused with nothing spent. Releases run concurrently: each table
query's DuckDB step runs on a connection of its own (``dpbudget.accountant.tables.frames.keyed``).

Invariant: a query is charged to ``tokens.analyst_of(token)`` under the policy the debit's
transaction checks, and nothing else the request carries names an analyst, a dataset, a clock,
a seed, a sensitivity or a mechanism.
"""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.service import tokens
from dpbudget.accountant.service.data import Postgres, Registered, read_postgres
from dpbudget.accountant.service.wire import Query
from dpbudget.accountant.tables.builder import table
from dpbudget.accountant.values.errors import (InvalidArgumentError, PolicyChangedError,
                                               PrivacyError, ServiceError)
from dpbudget.policies.stored import POLICY_KEY

__all__ = ["Admitted", "Deadline", "GAVE_UP", "Held", "RateLimit", "UNAUTHENTICATED"]

UNAUTHENTICATED = "no valid token: a missing, malformed, unknown, expired or revoked token " \
                  "(Authorization: Bearer dpb_...); nothing was drawn or debited"


GAVE_UP = "the query waited past the service's time limit before its debit: nothing was " \
          "drawn or debited (a retry pays once)"


class RateLimit:
    """A token bucket per token id, in this process's memory: ``rate`` requests a second on
    average, ``burst`` at once. A server of several processes gives each its own buckets."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, now: float) -> bool:
        """One request for ``key`` at ``now`` (a monotonic clock): admitted or not."""
        with self._lock:
            level, at = self._buckets.get(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - at) * self.rate)
            if level < 1.0:
                self._buckets[key] = (level, now)
                return False
            self._buckets[key] = (level - 1.0, now)
            return True


class Admitted(NamedTuple):
    """An authenticated request: the token's ``analyst`` and ``token`` id, and the
    ``accountant`` of the policy they were authenticated under (the one it is charged by)."""

    analyst: str
    token: str
    accountant: Accountant


class Deadline:
    """One request's time limit (``at``, a monotonic clock), and who got there first: the
    request giving up (``give_up``) or its worker starting the debit (``start_debit``)."""

    def __init__(self, at: float) -> None:
        self.at = at
        self._lock = threading.Lock()
        self._state: str | None = None  # None, then "debiting" or "gone" (never both)

    def give_up(self) -> bool:
        """The request answers without its answer: True if nothing was or will be debited."""
        with self._lock:
            if self._state is None:
                self._state = "gone"
            return self._state == "gone"

    def start_debit(self) -> bool:
        """The worker is about to debit: False (and nothing may be debited) if the request gave
        up or its time is past."""
        with self._lock:
            if self._state is None:
                self._state = "debiting" if time.monotonic() < self.at else "gone"
            return self._state == "debiting"


class Held:
    """The accountant, tables and tokens one server process holds."""

    def __init__(self, accountant: Accountant, tables: dict[str, Registered],
                 limit: RateLimit) -> None:
        self.tables, self.limit = tables, limit
        self._lock = threading.Lock()
        self._use(accountant)

    def _use(self, accountant: Accountant) -> None:
        self._pair = (accountant, tokens.entries(accountant.policy))  # (swapped whole, never
        # in parts: a request reads one pair)

    @property
    def accountant(self) -> Accountant:
        return self._pair[0]

    @property
    def ledger(self) -> Any:
        return self.accountant.ledger

    def refresh(self) -> None:
        """Reopen the accountant on the same ledger if the policy stored there changed."""
        pointer = self.ledger.account(POLICY_KEY)
        seq = None if pointer is None else pointer.seq
        if seq == self.accountant._gate.policy_seq:
            return
        with self._lock:  # (one reopening, however many requests notice the change)
            if seq != self.accountant._gate.policy_seq:
                self._use(Accountant.open(self.ledger))

    def admit(self, presented: str | None) -> Admitted:
        """The token's analyst under the policy in force (after ``refresh``), or a 401."""
        self.refresh()
        accountant, entries = self._pair  # (one read: tokens and accountant of one policy)
        found = None if presented is None else tokens.analyst_of(presented, entries, time.time())
        if found is None or presented is None:
            raise ServiceError(401, UNAUTHENTICATED)
        return Admitted(found, str(tokens.token_id(presented)), accountant)

    def rate(self, who: Admitted) -> None:
        """The token's rate: a 429 when it is over it."""
        if not self.limit.take(who.token, time.monotonic()):
            raise ServiceError(429, f"token {who.token}: over its rate of {self.limit.rate:g} "
                               f"requests a second (burst {self.limit.burst}); nothing was drawn "
                               "or debited")

    def query(self, presented: str | None, who: Admitted, spec: Query,
              deadline: Deadline) -> tuple[Any, Any]:
        """Run ``spec`` for ``who`` (admitted from ``presented``): (answer, receipt) —
        (accuracy, None) for an accuracy request. A policy changed under the debit:
        authenticated again, run once more."""
        try:
            return self._run(who, spec, deadline)
        except PolicyChangedError:
            return self._run(self.admit(presented), spec, deadline)

    def _run(self, who: Admitted, spec: Query, deadline: Deadline) -> tuple[Any, Any]:
        registered = self.tables.get(spec.table)
        if registered is None:  # (the other names are not the analyst's to learn)
            raise InvalidArgumentError("table", spec.table, "a table this service serves")
        acc = who.accountant
        frame: Any = str(registered.source)
        if isinstance(registered.source, Postgres):  # (only the columns the query names)
            frame = read_postgres(registered.source, _named(acc, registered.dataset, spec))
        t = table(acc, frame, dataset=registered.dataset, analyst=who.analyst)
        for f in spec.filters:
            t = t.filter(f.column, f.op, f.value)
        if spec.group_by:
            keys = None if spec.keys is None else [tuple(k) if isinstance(k, list) else k
                                                   for k in spec.keys]
            t = t.group_by(*spec.group_by, keys=keys)
        query = _statistic(t, spec)
        if spec.action == "accuracy":
            return query.accuracy(), None
        def ready() -> None:  # (checked after the read, right before the debit: a request
            if not deadline.start_debit():  # gone or past its time spends nothing for an
                raise ServiceError(503, GAVE_UP)  # answer no one will receive)

        answer = query.release(label=spec.label, _ready=ready)
        return answer, acc.last_receipt  # (this thread's debit, just made)


def _named(acc: Accountant, dataset: str, spec: Query) -> list[str]:
    """The columns ``spec`` names, with the dataset's privacy unit (none: the table API
    refuses the dataset by name)."""
    try:
        unit = acc._gate.planner.limit(dataset).privacy_unit  # (as dp.table finds it)
    except PrivacyError:  # (a dataset the policy refuses: refused by the table API, typed)
        unit = None
    return [c for c in (unit, *(f.column for f in spec.filters), *spec.group_by, spec.column)
            if isinstance(c, str)]


def _statistic(t: Any, spec: Query) -> Any:
    """The builder call ``spec`` describes; a parameter it lacks is refused by name."""
    kwargs: dict[str, Any] = {str(k): v for k, v in spec.bounds.items()}
    kwargs["epsilon"] = spec.epsilon
    unused = ("delta", "selection_share") if spec.statistic == "quantile" else ("q", "bins")
    for name in unused:  # (a parameter the statistic does not take is refused, not ignored)
        if getattr(spec, name) is not None:
            raise InvalidArgumentError(name, getattr(spec, name),
                                       f"left out for a {spec.statistic}")
    if spec.delta is not None:
        kwargs["delta"] = spec.delta
    if spec.selection_share is not None:
        kwargs["selection_share"] = spec.selection_share
    if spec.statistic in ("count", "count_distinct_units"):
        return getattr(t, spec.statistic)(**kwargs)
    for name in ("column", "lower", "upper") + (("q",) if spec.statistic == "quantile" else ()):
        if getattr(spec, name) is None:
            raise InvalidArgumentError(name, None, f"set for a {spec.statistic}")
    kwargs.update(lower=spec.lower, upper=spec.upper)
    if spec.statistic == "quantile":
        if spec.bins is not None:
            kwargs["bins"] = spec.bins
        return t.quantile(spec.column, spec.q, **kwargs)
    return getattr(t, spec.statistic)(spec.column, **kwargs)
