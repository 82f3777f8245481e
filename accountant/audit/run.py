"""Audit a ledger from its records alone: replay, verify, recompute, report.

Invariant: the audit trusts nothing the running process computed. It re-derives every record's
hash and link, replays every debit through the record's own composition rule starting from an
empty state — independently of the states stored in the records and in the ledger's account table
— and compares. It streams (memory does not grow with the number of records, except for the
optional plot series, which is thinned), and a corrupted ledger never ends in a traceback: the
report says what verified and where the problems are, by record number.

The report and its exit bits are defined in ``dpbudget.accountant.audit.findings``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from dpbudget.accountant.values._numeric import within_budget
from dpbudget.accountant.audit.chain import ChainCheck
from dpbudget.accountant.audit.policy import InForce, PolicyRecords
from dpbudget.accountant.audit.release import LibraryRecords
from dpbudget.accountant.audit.tally import Tallies
from dpbudget.accountant.audit.findings import EXIT_BITS, AccountReport, AuditReport, Problem, Tally
from dpbudget.accountant.audit.times import TimeCheck
from dpbudget.accountant.values.charge import Charge
from dpbudget.accountant.composition import CompositionRule, Refused, rule_from_config
from dpbudget.accountant.values.errors import InvalidArgumentError, LedgerConflictError, PrivacyError
from dpbudget.accountant.gate.step import step_account
from dpbudget.accountant.ledger import Account, Ledger
from dpbudget.accountant.ledger.record import charge_from_record, key_from_env
from dpbudget.accountant.audit.sources import (
    REORDER_WINDOW,
    Item,
    MergedSource,
    Source,
    open_source,
    progress_items,
)
from dpbudget.policies.accounts import PolicyLimits
from dpbudget.policies.stored import POLICY_KEY

__all__ = ["EXIT_BITS", "AccountReport", "AuditReport", "Problem", "Tally", "audit"]

_MAX_PROBLEMS = 1000  # beyond this only the count grows: a wholly corrupt file stays readable
_PLOT_POINTS = 5000
_CHARGED = ("release", "session", "pipeline")  # kinds the gate always charges to some account


def audit(source: str | Ledger | Sequence[str], policy: Any = None, *,
          key: bytes | str | None = None, since: str | None = None, until: str | None = None,
          expected_head: str | None = None, plot: bool = False,
          progress: bool | None = None, complete: bool = False) -> AuditReport:
    """Replay and verify every record of a ledger or JSONL export/log.

    A JSONL log of one process is a subsequence of the chain: it audits on its own, with the
    records other writers wrote reported as ``absent`` rather than as tampering, and several
    logs given together are merged (``dpbudget.accountant.audit.chain``).

    Args:
        source: a ledger, its URL, an SQLite file, a JSONL file, or a list of JSONL files to
            merge.
        policy: a policy file or ``dpbudget.policies.Policy`` (or any object with a
            ``limit_for(account_key)`` method); the limits it declares now are checked against
            the replayed spend as well as the limits recorded with each release.
        key: the HMAC key, when the ledger is keyed (default: ``DPBUDGET_LEDGER_KEY``). With a key,
            unkeyed records are reported as forged.
        since, until: ISO 8601 times; the per-group tallies count only records in [since, until]
            and the account report is the state as of ``until``. The chain is always verified whole.
        expected_head: the head hash kept elsewhere (from ``dpbudget status`` or a receipt); if the
            ledger ends anywhere else, its tail was truncated or rewritten.
        plot: keep a thinned series of cumulative spend per account for plotting.
        progress: show a progress bar on stderr (default: only for > 100,000 records on a terminal).
        complete: the source must hold every record from the first to its last (an export):
            an absent record is then a ``chain`` problem. A ledger is always held to this.

    Raises:
        LedgerError: the source cannot be opened at all (a source that opens but is corrupt is
            reported, not raised).
    """
    src = open_source(source)
    if src.path is not None and not complete:  # a log: lines may be out of order locally
        src.reorder = REORDER_WINDOW
    try:
        secret = key.encode("utf-8") if isinstance(key, str) else key
        limits = policy if policy is None or hasattr(policy, "limit_for") else \
            PolicyLimits(policy)
        replay = _Replay(src, secret if secret is not None else key_from_env(), since, until,
                         plot, limits, complete)
        replay.run(progress_items(src, progress))
        return replay.report(expected_head)
    finally:
        if not isinstance(source, Ledger):
            src.close()


class _Replay:
    def __init__(self, src: Source, key: bytes | None, since: str | None, until: str | None,
                 plot: bool, policy: Any, complete: bool) -> None:
        self.src, self.since, self.until, self.plot = src, since, until, plot
        self.policy = policy
        self.out = AuditReport(source=src.name, keyed=key is not None)
        self.chain = ChainCheck(key, self.problem, ledger=src.ledger is not None,
                                complete=complete)
        self.times = TimeCheck(self.problem)  # (``dpbudget.accountant.audit.times``)
        self.micros = 0  # the time of the record being replayed
        self.last_seq: dict[str, int] = {}  # per account: the last record that charged it
        self.synced: dict[str, int] = {}  # per account: the chain's gap count when last replayed
        self.resynced = 0
        self.states: dict[str, dict[str, float]] = {}
        self.rules: dict[str, tuple[dict[str, Any], CompositionRule]] = {}
        self.configs: dict[str, dict[str, Any]] = {}  # each account's configuration so far
        self.counts: dict[str, int] = {}
        self.pipelines: dict[str, Any] = {}  # pipeline account -> the dataset its records name
        self.series: dict[str, list[tuple[str, float, float]]] = {}
        self.stride = 1
        self.over: set[str] = set()
        self.over_in_force: set[str] = set()
        self.in_force: InForce | None = None  # from the ledger's own policy records
        self.policies = PolicyRecords()
        self.library = LibraryRecords()  # what release records claim (``dpbudget.accountant.audit.release``)
        # Whether the first record, verified, says the ledger was created for simulation (None
        # until read); only there, or in an in-memory ledger, is seeded noise no problem.
        self.simulation: bool | None = None
        self.memory = src.ledger is not None and not src.ledger.durable
        self.diverged: dict[str, int] = {}
        # Running counters as plain attributes (pydantic assignment is slow); copied into the
        # report at the end.
        self.records = 0
        self.charges: dict[tuple[Any, ...], Charge] = {}
        self.first_time: str | None = None
        self.last_time: str | None = None
        self.tallies = Tallies()  # per analyst, mechanism, label... (``dpbudget.accountant.audit.tally``)

    def problem(self, kind: str, message: str, seq: int | None = None,
                position: int | None = None) -> None:
        self.out.problem_count += 1
        if kind not in self.out.problem_kinds:
            self.out.problem_kinds.append(kind)  # type: ignore[arg-type]
        if len(self.out.problems) < _MAX_PROBLEMS:
            self.out.problems.append(Problem(kind=kind, seq=seq, position=position,
                                             message=message))

    def run(self, items: Iterator[Item]) -> None:
        for item in items:
            if item.refusal is not None:
                self.refusal(item.refusal)
                continue
            self.records += 1
            verified = self.chain.verified
            record = self.chain.check(item)
            if record is None:
                continue
            if self.simulation is None:  # the source's first record: only it, verified, says so
                self.simulation = (self.chain.verified > verified
                                   and record.get("simulation") is True)
            if record.get("seq") == 1:
                self.policies.first_record(record, item.hash)
            try:
                self.apply(record)
            except (KeyError, TypeError, ValueError, AttributeError, RecursionError,
                    PrivacyError) as exc:
                self.problem("malformed", f"record {record.get('seq')} has an unreadable "
                             f"member ({type(exc).__name__}: {exc})", record.get("seq"),
                             item.position)

    def refusal(self, entry: Any) -> None:
        """A refused request in a log: counted per analyst for review, never spend."""
        who = entry.get("analyst") if isinstance(entry, dict) else None
        name = who if isinstance(who, str) else "(none)"
        self.out.refused[name] = self.out.refused.get(name, 0) + 1

    def apply(self, record: dict[str, Any]) -> None:
        seq, when = record["seq"], record.get("time")
        why = self.library.check(record, bool(self.simulation or self.memory))
        if why is not None:
            self.problem("release", f"record {seq}: {why}", seq)
        self.micros = self.times.record(record)
        if self.until is not None and when is not None and when > self.until:
            return
        self.first_time = self.first_time or when
        self.last_time = when
        if record.get("kind") == "policy":
            self.last_seq[POLICY_KEY] = seq
            why = self.policies.read(record, seq, self.in_force)
            if why is not None:
                self.problem("policy", why, seq)
            self.in_force = InForce(seq, record["policy"])
            return
        accounts = record.get("accounts") or {}
        if self.in_force is not None and (accounts or record.get("kind") in _CHARGED):
            why = self.in_force.refuses(record)
            if why is not None:
                self.over.update(accounts)
                self.problem("limit", f"record {seq}: the policy in force (policy record "
                             f"{self.in_force.seq}) refuses it: {why}", seq)
            why = self.in_force.unit_problem(record)
            if why is not None:  # (a release problem: not per the unit the policy declares)
                self.problem("release", f"record {seq}: {why}", seq)
        if accounts:
            charge = self.charge(record["cost"], (record.get("mechanism") or {}).get("name"))
            for key, stored in accounts.items():
                if key.startswith("pipeline:"):  # (its ε is per its dataset's unit: ``per``)
                    self.pipelines[key] = record.get("dataset")
                self.debit(seq, key, stored, charge)
            self.tallies.add(record, charge, self.since is None or (
                when is not None and when >= self.since))

    def charge(self, cost: dict[str, Any], mechanism: Any) -> Charge:
        # Records of the same mechanism repeat the same cost: decode each distinct one once.
        if "parts" in cost:
            return charge_from_record(cost, str(mechanism))
        key = (mechanism, *((k, tuple(v) if isinstance(v, list) else v) for k, v in cost.items()))
        charge = self.charges.get(key)
        if charge is None:
            if len(self.charges) > 4096:
                self.charges.clear()
            charge = self.charges[key] = charge_from_record(cost, str(mechanism))
        return charge

    def debit(self, seq: int, key: str, stored: dict[str, Any], charge: Charge) -> None:
        """Replay one account's debit with the gate's own ``step_account``, from the replayed
        state (never the stored one) under the configuration the record states."""
        config = {k: v for k, v in stored.items() if k != "state"}
        self.last_seq[key] = seq
        cached = self.rules.get(key)
        if cached is None or cached[0] != config:
            cached = self.rules[key] = (config, rule_from_config(config))
        rule = cached[1]
        state = self.states.get(key)
        previous = self.configs.get(key, config)
        current = None if state is None else Account(key, previous.get("rule", ""), previous,
                                                     state, 0)
        if self.chain.gap != self.synced.get(key, 0):
            self.synced[key] = self.chain.gap
            self.resync(seq, key, rule, current, stored["state"], charge)
            self.configs[key], self.states[key] = config, stored["state"]
            self.after_debit(seq, key, rule, stored["state"])
            return
        try:
            try:
                new = step_account(key, rule, current, charge)
            except LedgerConflictError as conflict:  # allowed only so far: report, continue
                self.step_failed(seq, key, conflict)
                if previous.get("rule") != rule.name:  # another rule's state: start it afresh
                    current = None
                else:
                    current = None if state is None else Account(key, rule.name, config, state,
                                                                 0)
                new = step_account(key, rule, current, charge)
        except (Refused, PrivacyError, ArithmeticError) as error:  # (a forged cost may overflow)
            self.step_failed(seq, key, error)
            new = stored["state"]
        self.configs[key] = config
        if new != stored["state"]:
            # Once an account diverges every later record of it will too: report the first.
            later = self.diverged.get(key)
            if later is None:
                self.problem("state", f"record {seq}: {key} stores state {stored['state']} but "
                             f"the replay gives {new}", seq)
            self.diverged[key] = (later or 0) + 1
        self.states[key] = new
        self.after_debit(seq, key, rule, new)

    def step_failed(self, seq: int, key: str, error: Exception) -> None:
        """Report why a replayed step of account ``key`` failed (record ``seq``)."""
        if isinstance(error, LedgerConflictError):
            kind, what = "limit", f"changed its configuration: {str(error).split(': ', 1)[-1]}"
        elif isinstance(error, InvalidArgumentError):  # a negative, NaN or infinite cost
            kind, what = "malformed", f"was charged an invalid cost ({error})"
        else:
            kind, what = "limit", f"admitted a release its rule refuses ({error})"
        self.problem(kind, f"record {seq}: {key} {what}", seq)
        self.over.add(key)

    def after_debit(self, seq: int, key: str, rule: CompositionRule,
                    state: dict[str, float]) -> None:
        if self.in_force is not None:
            self.check_in_force(seq, key, rule, state)
            if "/block:" in key:
                self.times.block(seq, key, self.micros, self.in_force, rule, state)
        n = self.counts[key] = self.counts.get(key, 0) + 1
        if self.plot:
            self.sample(key, n, rule, state)

    def resync(self, seq: int, key: str, rule: CompositionRule, current: Account | None,
               stored: dict[str, float], charge: Charge) -> None:
        """After absent records (other writers'), this account may have been debited unseen, so
        its stored state is taken as the replay's new start — once checked to be possible: a
        running state only grows, so it is at least the replayed one plus this step (which must
        itself fit), and it must be within the limit. What the absent records did is not checked
        here: their own writers' logs (merged) or the ledger show it."""
        self.resynced += 1
        try:
            floor = step_account(key, rule, current, charge)
        except (Refused, PrivacyError, ArithmeticError) as error:
            self.step_failed(seq, key, error)
            return
        if not all(stored.get(name, -1.0) >= value for name, value in floor.items()):
            self.problem("state", f"record {seq}: {key} stores state {stored}, below what the "
                         f"records before it and its own cost imply ({floor})", seq)
        elif not rule.admits(stored):
            self.problem("limit", f"record {seq}: {key} stores a state over its limit "
                         f"({rule.spent(stored)})", seq)
            self.over.add(key)

    def check_in_force(self, seq: int, key: str, rule: CompositionRule,
                       state: dict[str, float]) -> None:
        """The replayed spend against the limit of the policy in force at this record (the
        latest policy record before it), whatever limit the record itself carries."""
        if self.in_force is None or key in self.over_in_force:
            return
        why = self.in_force.over(key, rule, state)
        if why is not None:
            self.over_in_force.add(key)
            self.over.add(key)
            self.problem("limit", f"record {seq}: {why} (policy record {self.in_force.seq})",
                         seq)

    def sample(self, key: str, n: int, rule: CompositionRule, state: dict[str, float]) -> None:
        points = self.series.setdefault(key, [])
        if n % self.stride == 0:
            spent = rule.spent(state)
            points.append((self.last_time or "", spent.epsilon, spent.delta))
            if len(points) > _PLOT_POINTS:  # thin to bounded memory
                del points[::2]
                self.stride *= 2

    def report(self, expected_head: str | None) -> AuditReport:
        out = self.out
        chain = self.chain
        out.records, out.verified = self.records, chain.verified
        out.simulation = bool(self.simulation)
        out.head_seq, out.head_hash = chain.head
        out.absent, out.absent_ranges, out.resynced, out.unused = (
            chain.absent, chain.absent_ranges, self.resynced, chain.unused)
        out.writers = len(chain.writers)
        out.duplicates = chain.duplicates + (self.src.duplicates
                                             if isinstance(self.src, MergedSource) else 0)
        out.first_time, out.last_time = self.first_time, self.last_time
        self.tallies.into(out)
        out.expected_head = expected_head
        if not self.memory:  # (an in-memory ledger's time is a simulation's clock, as given)
            self.times.finish()  # records dated after the audit's clock: one problem, counted
        out.owner, out.policies = self.policies.owner, self.policies.listed
        if expected_head is not None and expected_head != out.head_hash:
            self.problem("head", f"the ledger ends at record {out.head_seq} with hash "
                         f"{out.head_hash}, not at the expected head {expected_head} "
                         "(truncated or rewritten tail)", out.head_seq)
        for key, n in sorted(self.diverged.items()):
            if n > 1:
                self.problem("state", f"{key}: {n - 1} later records also disagree with the "
                             "replay")
        # Every row against the replay (a record's ``table`` member, from earlier versions, is
        # read as nothing: this is the whole check it stood for).
        stored_table = self.src.stored_accounts()
        table = stored_table or []
        stored = {a.key: a for a in table if a.key != POLICY_KEY}
        pointer = next((a for a in table if a.key == POLICY_KEY), None)
        latest = None if self.in_force is None else self.in_force.seq
        if pointer is not None and self.until is None and pointer.seq != latest:
            self.problem("state", f"the ledger's policy pointer names record {pointer.seq}, not "
                         f"the latest policy record ({latest}): rolled back or edited outside "
                         "dpbudget", pointer.seq)
        for key in sorted(self.states):
            rule, state = self.rules[key][1], self.states[key]
            spent, remaining = rule.spent(state), rule.remaining(state)
            if self.policy is not None:
                declared = self.policy.limit_for(key)
                if declared is not None and not declared.is_unlimited and not within_budget(
                        spent, declared):
                    self.over.add(key)
                    self.problem("limit", f"{key} has spent {spent}, over the policy's limit "
                                 f"{declared}")
            agrees = None
            if key in stored:
                agrees = stored[key].state == state and stored[key].seq == self.last_seq[key]
                if not agrees and self.until is None:  # (a row naming a later record: gone)
                    gone = stored[key].seq > self.last_seq[key] and chain.strict
                    self.problem("chain" if gone else "state", f"{key}: the ledger's stored "
                                 f"running state {stored[key].state} (record {stored[key].seq}"
                                 f"{', not among its records: deleted' if gone else ''}) differs from the "
                                 f"replay {state} (record {self.last_seq[key]})")
            out.accounts.append(AccountReport(
                account=key, rule=rule.name,
                limit=None if rule.limit is None else rule.limit.model_dump(),
                spent=spent.model_dump(), remaining=remaining.model_dump(),
                releases=self.counts.get(key, 0),
                over_limit=key in self.over,
                per="per row" if self.in_force is None else self.in_force.per(
                    key, self.pipelines.get(key)),
                stored_state_agrees=agrees, series=self.series.get(key) if self.plot else None))
        for key in sorted(set(stored) - set(self.states)):
            if self.until is None:
                self.problem("state", f"{key}: the ledger stores a running state but no record "
                             "debits it (records deleted?)")
        for key in sorted(set(self.states) - set(stored)):
            if self.until is None and stored_table is not None:
                self.problem("state", f"{key}: records debit it but the ledger stores no running "
                             "state for it (its row deleted: the gate would start it afresh)")
        return out
