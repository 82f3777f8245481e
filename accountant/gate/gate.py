"""The gate: the one path every noisy answer takes out of the library.

Invariant (docs/architecture.md, "the one rule"): validate everything → in one ledger transaction,
read each planned account's state, ask its composition rule whether the step fits
(``step_account``), append the record and the new states, commit → only then let the mechanism
draw noise. A refusal or a bad argument leaves the ledger and the random source exactly as they
were. ``release``, ``release_many``, ``open_session``, pipelines (``debit`` of an allocation) and
``afford`` (the same traversal as a dry run, outside any transaction) all go through
``Gate._charge``; the audit replays each account with the same ``step_account``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dpbudget.accountant.values import _validate
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.composition import CompositionRule, Refused, State
from dpbudget.accountant.gate.continuity import check_ledger
from dpbudget.accountant.values.errors import (BudgetExceededError, InvalidArgumentError, InvalidDataError,
                               InvalidDataTypeError, InvalidTypeError, LedgerStaleError,
                               MechanismNotAllowedError, PolicyChangedError, UnitRequiredError)
from dpbudget.accountant.ledger import Account, Ledger
from dpbudget.accountant.ledger.record import (ZERO_COST, RecordKind, accounts_member, canonical,
                                      noise_member)
from dpbudget.accountant.gate.planner import Plan, Planner, Target
from dpbudget.accountant.gate.receipt import Receipt
from dpbudget.accountant.gate.refusals import REFUSALS, log_refusal
from dpbudget.accountant.gate.session import NumericSession, Session
from dpbudget.accountant.gate.unnamed import NOT_GIVEN
from dpbudget.accountant.gate.step import Step, check_continues, check_unlocked, step_account
from dpbudget.mechanisms.base import Mechanism, StreamMechanism
from dpbudget.mechanisms.sensitivity import priced
from dpbudget.mechanisms.queries import bind
from dpbudget.mechanisms.sampling import OneShotSampler, Sampler
from dpbudget.policies.accounts import dataset_key, dataset_name
from dpbudget.policies.limits import DatasetLimit, folded_name, refusal
from dpbudget.policies.units import RAW, unit_refusal
from dpbudget.policies.stored import POLICY_KEY

__all__ = ["Gate", "Step", "Where", "check_continues", "step_account"]  # (re-exports Step's)

# Where a request is charged: a plan already made (a pipeline's), or (dataset, analyst[, blocks]) to plan.
Where = Plan | tuple[Any, ...]
# Read by every debit, written by none: in a ledger of lanes, debits share its lock and a policy
# change (which writes it) waits for them (``dpbudget.accountant.ledger.lanes``).
_SHARED = (POLICY_KEY,)


class Gate:
    """Plans, checks and debits; the only object that writes release records.

    Args:
        ledger: where debits are recorded.
        planner: maps (dataset, analyst) to accounts and checks.
        sampler: the source of noise handed to mechanisms after their debit commits.

    Time: the windows, blocks and unlock shares of a debit are those of its transaction's time
    (``Transaction.time``: the ledger's, never the caller's), which is its record's ``time``.
    """

    def __init__(self, ledger: Ledger, planner: Planner, sampler: Sampler) -> None:
        self.ledger = ledger
        self.planner = planner
        self.sampler = sampler
        self._local = threading.local()
        # The seq of the policy record the planner was built from (None: none stored). Each debit
        # and read re-checks the ledger's pointer: none goes on under limits since replaced.
        self.policy_seq: int | None = None
        # The ledger's datasets by folded name, and one not "default", as of ``_mark`` (_no_twin).
        self._folds: dict[str, set[str]] = {}
        self._named: str | None = None
        self._mark: Any = None
        self._folding = threading.Lock()

    # -- requests ------------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, value: Any, label: str | None, where: Where) -> Any:
        """Validate, debit ``mechanism``'s cost, then draw its noisy answer (a Query: ``bind``)."""
        mechanism, value = (mechanism, value) if type(value) is float else bind(mechanism, value)
        try:
            plan = self.validate(mechanism, label, where)
            prepared = mechanism.prepare(value)
            self.debit(Step.of(mechanism), plan, label)
        except REFUSALS as refusal:
            self.refused(refusal, mechanism.name, mechanism.charge.budget, where, label)
            raise
        return self.sampler.once(mechanism.draw, prepared)  # (a sampler dead once it returns)

    def release_many(self, items: Any, label: str | None, where: Where) -> list[Any]:
        """A batch fixed in advance: every item validated, one debit, then every draw."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise InvalidDataTypeError("items", items, "a sequence of (mechanism, value) pairs")
        pairs = tuple(items)
        if not pairs:
            raise InvalidDataError("items", items, "a non-empty sequence of (mechanism, value) "
                                   "pairs")
        bound = []  # (mechanism, prepared value): a Query item sets its mechanism's Δ (``bind``)
        plan: Plan | None = None
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidDataTypeError(f"items[{i}]", pair, "a (mechanism, value) pair")
            mechanism, value = bind(*pair)
            plan = self.validate(mechanism, label, where if plan is None else plan)
            bound.append((mechanism, mechanism.prepare(value)))
        assert plan is not None  # pairs is non-empty
        step = Step.batch(tuple(m for m, _ in bound))
        try:
            self.debit(step, plan, label)
        except REFUSALS as refusal:
            self.refused(refusal, "batch", step.cost, where, label)
            raise
        return self.sampler.once(lambda vs, s: [m.draw(v, s) for m, v in vs], bound)

    def open_session(self, mechanism: StreamMechanism, label: str | None, where: Where,
                     ends: float | None = None) -> Session:
        """Debit a sparse-vector mechanism's whole fixed cost once, then open its stream. A
        session charged to a renewal window (or opened in a pipeline that ``ends``) answers
        only until that window ends."""
        if not isinstance(mechanism, StreamMechanism):
            raise InvalidTypeError("mechanism", mechanism, "a sparse-vector mechanism "
                                   "(AboveThreshold, Sparse or NumericSparse)")
        try:
            plan = self.validate(mechanism, label, where)
            step = Step.of(mechanism)
            receipt = Receipt(*self.debit(step, plan, label, kind=RecordKind.SESSION))
            lanes = [a.key for a in self._local.charged]  # (this thread's debit, just made)
            ends = self.window_end(plan, ends)
        except REFUSALS as refusal:
            self.refused(refusal, mechanism.name, mechanism.charge.budget, where, label)
            raise
        sampler, stream = self.sampler.lease(mechanism._open)  # (ended when the session closes)
        cls = NumericSession if mechanism.releases_values else Session
        return cls(lambda s: self._close_session(s, step, plan, lanes, sampler), stream, receipt,
                   ends, self.ledger.now)

    def now(self) -> float:
        """The ledger's time now (``Ledger.now``): what windows and allocations end by."""
        return self.ledger.now()

    def window_end(self, plan: Plan, ends: float | None = None) -> float | None:
        """When an allocation just debited on ``plan`` (this thread's last debit) must stop
        answering: the end of the renewal window it was charged to — the one of its record's
        time — or ``ends`` if earlier (None: never)."""
        own = plan.window_end(self._local.time) if plan.windowed else None
        if own is None or ends is None:
            return own if ends is None else ends
        return min(own, ends)

    def refused(self, error: Exception, name: str, cost: Budget, where: Where,
                label: Any) -> None:
        """Log a refused request for security review (``dpbudget.accountant.gate.refusals``); never spend."""
        dataset, analyst = (where.dataset, where.analyst) if isinstance(where, Plan) else where[:2]
        analyst = self.planner.analyst or analyst  # (who asked: the ledger's analyst, if it knows)
        dataset = "default" if dataset is NOT_GIVEN else dataset  # (named: it refused the rest)
        log_refusal(error, name, cost, dataset, analyst, label)

    def afford(self, mechanism: Mechanism, where: Where) -> bool:
        """Whether a release of ``mechanism`` would be admitted now: the debit's own traversal,
        run on the committed states outside any transaction. Debits nothing."""
        self._check_policy_now()
        try:
            plan = self.validate(priced(mechanism), None, where, raw=False)  # (a table query's too)
            now = self._now(plan)
            self._charge(self.ledger.account, Step.of(mechanism), plan,
                         None if now is None else plan.begun(now))
        except BudgetExceededError:  # a per-query cap, or a limit
            return False
        return True

    def max_steps(self, mechanism: Mechanism, where: Where) -> int:
        """How many more releases of exactly ``mechanism`` fit now (each rule in closed form)."""
        plan = self.validate(priced(mechanism), None, where, raw=False)  # (a table query's too)
        now = self._now(plan)
        if now is not None:
            plan.begun(now)
        self._check_policy_now()
        return min(t.rule.max_steps(self._state(t, now), mechanism.charge)
                   for t in plan.targets)

    # -- the one debit path ---------------------------------------------------------------------

    def debit(self, step: Step, plan: Plan, label: str | None, *,
              kind: RecordKind = RecordKind.RELEASE,
              extra: Callable[[int], dict[str, str]] | None = None) -> tuple[Any, ...]:
        """Check and debit ``step`` from every account of ``plan`` in one ledger transaction.

        ``extra(seq)`` adds record members (canonical JSON) given the record's sequence number.
        Every account in the record is debited with exactly ``step.charge``, which is the
        record's ``cost`` (the auditor replays records on that invariant). Returns the
        receipt's fields (``Receipt(*fields)``).

        Raises:
            BudgetExceededError: some account refuses; nothing was written.
            LedgerConflictError: an account was recorded under another rule.
        """
        # The keys to lock depend on the time when the plan has windows: those of the ledger's
        # time now (an estimate), checked against the transaction's own once it has begun.
        now = self._now(plan)
        for attempt in (1, 2, 3):
            keys: Sequence[str] = plan.prefetch if now is None else plan.keys_at(now)
            if self.ledger.lanes:
                keys = self._with_folds(plan, keys)
            # Explicit begin/commit inside one try (not ``with``): an interrupt between the end
            # of a ``with`` block and its ``__exit__`` would leave it open (ledger/base.py).
            scope = self.ledger.transaction()
            try:
                tx = scope.begin(keys, _SHARED)
                if now is not None:
                    when, now = now, plan.begun(tx.time)
                    if plan.windowed and plan.keys(now) != plan.keys(when):
                        raise LedgerStaleError("the ledger's time is in another renewal window "
                                               "than the one locked; nothing was written")
                self._check_policy(tx.account(POLICY_KEY))
                accounts = self._charge(tx.account, step, plan, now)
                fields = self._fields(step, plan, label, kind, accounts)
                if extra is not None:
                    fields.update(extra(tx.next_seq))
                entry = tx.append(fields, accounts)
                scope.commit()
                break
            except BaseException as exc:
                scope.abandon()
                # Locked the keys of another renewal window than the transaction's time: redone
                # on the keys of its time (nothing was written).
                if attempt < 3 and isinstance(exc, LedgerStaleError):
                    continue
                raise
        # The receipt's fields, built into a Receipt only when asked for (this is the hot path;
        # states are never changed in place, so keeping a reference is safe until then).
        fields_ = (entry.seq, entry.hash, plan.dataset, plan.analyst, label, step.name,
                   step.cost, plan.targets[0].rule, accounts[0].state)
        self._local.receipt, self._local.charged = fields_, accounts
        if now is not None:  # (read by ``window_end``)
            self._local.time = now
        return fields_

    def _check_policy_now(self) -> None:
        """``_check_policy`` on the committed pointer (a read outside any transaction)."""
        self._check_policy(self.ledger.account(POLICY_KEY))

    def _check_policy(self, pointer: Account | None) -> None:
        if (None if pointer is None else pointer.seq) != self.policy_seq:
            raise PolicyChangedError(
                f"the ledger's policy changed (policy record {getattr(pointer, 'seq', None)}; "
                f"this accountant enforces record {self.policy_seq}); nothing was drawn or "
                "debited. Open the ledger again (Accountant.open) to use the policy in force")

    def _charge(self, read: Callable[[str], Account | None], step: Step, plan: Plan,
                now: float | None) -> list[Account]:
        """Every account of ``plan`` after ``step``, or ``BudgetExceededError``."""
        accounts = []
        charge = step.charge
        for target in plan.targets:
            rule = target.rule
            key = target.key if now is None else target.key_at(now)
            current = read(key)
            if current is None:
                self._no_twin(key)
            try:
                new = step_account(key, rule, current, charge)
                if target.unlock is not None and now is not None:
                    check_unlocked(*target.unlock, rule, new, now)
            except Refused as refusal:
                state = rule.initial_state() if current is None else current.state
                raise BudgetExceededError(step.cost, rule.remaining(state),
                                          plan.refused_dataset(key), key,
                                          refusal.reason) from None
            accounts.append(Account(key, rule.name, rule.describe(), new, 0))
        return accounts

    def _with_folds(self, plan: Plan, keys: Sequence[str]) -> Sequence[str]:
        """``keys`` and, per dataset under the default limit, the lane ``fold:<folded name>``,
        locked, never written: debits on variants of one new name (``_no_twin``) wait in turn."""
        names = (plan.dataset,) if isinstance(plan.dataset, str) else plan.dataset
        listed = self.planner.policy.datasets
        folds = [f"fold:{folded_name(n)}" for n in names if n not in listed]
        return (*keys, *folds) if folds else keys

    def _no_twin(self, key: str) -> None:
        """A dataset first charged under the default limit must not be a variant (``folded_name``)
        of one charged since this gate read the ledger (by this or another process), nor "default"
        beside a named one. In the debit's transaction: no race. Reads only the accounts created
        since the last check (``Ledger.created_since``), each name folded once into ``_folds``."""
        name = dataset_name(key)
        if name is None or name in self.planner.policy.datasets:
            return
        with self._folding:
            self._mark, keys = self.ledger.created_since(self._mark)
            for other in filter(None, map(dataset_name, keys)):
                self._folds.setdefault(folded_name(other), set()).add(other)
                self._named = self._named or (other if other != "default" else None)
            variants = self._folds.get(folded_name(name), set()) - {name}
        if name == "default" and self._named is not None:  # not beside a named one (unnamed)
            self.planner.know(self._named)
            raise InvalidArgumentError("dataset", name, f"named: this ledger holds the "
                                       f"dataset {self._named!r}, beside which no 'default' opens")
        if variants:
            self.planner.know(other := min(variants), instead_of=name)
            raise InvalidArgumentError("dataset", name, f"not a variant (in case or '_', '.', "
                                       f"'-') of the dataset {other!r} (one table, one budget)")

    def _fields(self, step: Step, plan: Plan, label: str | None, kind: RecordKind,
                accounts: list[Account]) -> dict[str, str]:
        """A record's members, encoded by ledger/record.py (which documents the format)."""
        fields = {"kind": kind.text, "label": canonical(label), **step.members,
                  "accounts": accounts_member(plan.targets, accounts),
                  **plan.fixed}
        if step.noise is not None:  # "exact-csprng", "exact-seeded", "float-csprng"...
            fields["noise"] = noise_member(step.noise, self.sampler.source)
        return fields

    def _close_session(self, session: Session, step: Step, plan: Plan,
                       lanes: list[str], sampler: OneShotSampler) -> None:
        """Append the zero-cost record of a session's answer counts; no account changes. In a
        ledger of lanes it is on the lanes of the accounts the session was charged to, so that it
        cannot be deleted unseen (``dpbudget.accountant.ledger.lanes``). Ends the session's sampler."""
        sampler.end()
        r = session.receipt
        fields = self._fields(step, plan, r.label, RecordKind.SESSION_CLOSE, [])
        fields.update(cost=ZERO_COST, session=canonical(r.seq),
                      answered=canonical(session.answered),
                      positives=canonical(session.positives))
        scope = self.ledger.transaction()
        try:
            scope.begin(lanes).append(fields, [], lanes)
            scope.commit()
        except BaseException:
            scope.abandon()
            raise

    # -- validation and reading -----------------------------------------------------------------

    def validate(self, mechanism: Mechanism, label: str | None, where: Where,
                 raw: bool = True) -> Plan:
        """The request's plan, after checking the mechanism, the label, the dataset and analyst
        (by planning) and the policy's stateless checks: for a ``raw`` value (not a table
        query's, ``release_bounded``; nor a dry run's) the privacy unit (``unit_refusal``),
        allowed mechanisms by class identity (``mechanism_name``), caps on the frozen charge the
        debit uses. Draws and debits nothing."""
        if Mechanism not in type(mechanism).__mro__:  # a real subclass (an ABC check is slow)
            raise InvalidTypeError("mechanism", mechanism, "a dpbudget Mechanism")
        _validate.text("label", label, optional=True)
        plan = self.plan(where)
        for name, limit in plan.checks if raw else ():  # (a dataset with a unit is a check)
            if (refused_unit := unit_refusal(name, limit, RAW, False)) is not None:
                raise UnitRequiredError(name, *refused_unit)
        refused = refusal(plan.checks, mechanism.name, mechanism.charge) if plan.checks else None
        if refused is not None:  # (the audit holds every record to the same checks)
            name = refused.dataset
            if refused.check == "allowed_mechanisms":
                raise MechanismNotAllowedError(refused.why + "; nothing was drawn and nothing "
                                               "was debited")
            account = self.planner.account(name, None)
            raise BudgetExceededError(mechanism.charge.budget, self.remaining(account), name,
                                      dataset_key(name), refused.why)
        return plan

    def plan(self, where: Where) -> Plan:
        """``where`` itself if it is a plan, else the planner's plan for (dataset, analyst)."""
        return where if isinstance(where, Plan) else self.planner.plan(*where)

    def state(self, target: Target, now: float | None = None) -> State:
        """An account's committed state (a read; takes no write lock), under the policy in force."""
        self._check_policy_now()
        return self._state(target, now)

    def _state(self, target: Target, now: float | None) -> State:
        key = target.key_at(self.ledger.now() if now is None else now)
        current = self.ledger.account(key)
        check_continues(key, target.rule, current)
        return target.rule.initial_state() if current is None else current.state

    def limit(self, dataset: str) -> DatasetLimit:
        """The limit the policy this gate enforces declares for ``dataset`` (checked in force)."""
        self._check_policy_now()
        return self.planner.limit(dataset)

    def spent(self, target: Target) -> Budget:
        return target.rule.spent(self.state(target))

    def remaining(self, target: Target) -> Budget:
        return target.rule.remaining(self.state(target))

    @property
    def last_receipt(self) -> Receipt | None:
        """This thread's last committed receipt, or None."""
        fields = getattr(self._local, "receipt", None)
        return None if fields is None else Receipt(*fields)

    def check_ledger(self) -> None:
        """``check_ledger`` for this gate's ledger and planner."""
        check_ledger(self.ledger, self.planner)

    def _now(self, plan: Plan) -> float | None:
        """The ledger's time now (an estimate, ``Ledger.now``) for a request whose accounts
        depend on the time (windows, blocks), else None."""
        return self.ledger.now() if plan.windowed or plan.opens is not None else None
