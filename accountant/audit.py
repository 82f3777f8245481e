"""Audit a ledger from its records alone: replay, verify, recompute, report.

Invariant: the audit trusts nothing the running process computed. It re-derives every record's
hash and link, replays every debit through the record's own composition rule starting from an
empty state — independently of the states stored in the records and in the ledger's account table
— and compares. It streams (memory does not grow with the number of records, except for the
optional plot series, which is thinned), and a corrupted ledger never ends in a traceback: the
report says what verified and where the problems are, by record number.

The report and its exit bits are defined in ``accountant.audit_report``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

from accountant._numeric import within
from accountant.audit_report import EXIT_BITS, AccountReport, AuditReport, Problem, Tally
from accountant.charge import Charge
from accountant.composition import CompositionRule, Refused, rule_from_config
from accountant.errors import InvalidArgumentError, LedgerConflictError, PrivacyError
from accountant.gate import step_account
from accountant.ledger import GENESIS, Account, Ledger, record_hash
from accountant.ledger.record import charge_from_record, key_from_env
from accountant.sources import Item, Source, open_source
from policies.stored import POLICY_KEY, from_document

__all__ = ["EXIT_BITS", "AccountReport", "AuditReport", "Problem", "Tally", "audit"]

_MAX_PROBLEMS = 1000  # beyond this only the count grows: a wholly corrupt file stays readable
_PLOT_POINTS = 5000


def audit(source: str | Ledger, policy: Any = None, *, key: bytes | str | None = None,
          since: str | None = None, until: str | None = None,
          expected_head: str | None = None, plot: bool = False,
          progress: bool | None = None) -> AuditReport:
    """Replay and verify every record of a ledger or JSONL export/log.

    Args:
        source: a ledger, its URL, an SQLite file or a JSONL file.
        policy: a policy file or ``policies.Policy`` (or any object with a
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

    Raises:
        LedgerError: the source cannot be opened at all (a source that opens but is corrupt is
            reported, not raised).
    """
    src = open_source(source)
    try:
        secret = key.encode("utf-8") if isinstance(key, str) else key
        replay = _Replay(src, secret if secret is not None else key_from_env(), since, until,
                         plot, _load_policy(policy))
        replay.run(_progress(src, progress))
        return replay.report(expected_head)
    finally:
        if not isinstance(source, Ledger):
            src.close()


class _PolicyLimits:
    """The limit a policy declares for an account key (windowed keys map to their base key);
    ``default`` is the limit of datasets the policy does not list (a stored policy's)."""

    def __init__(self, policy: Any, default: Any = None) -> None:
        from policies import Policy, load_policy
        from policies.accounts import policy_accounts

        self.specs = policy_accounts(policy if isinstance(policy, Policy) else load_policy(policy))
        self.default = None if default is None else default.rule().limit

    def limit_for(self, key: str) -> Any:
        base = key.split("@", 1)[0]
        spec = self.specs.get(base)
        if spec is None:
            return self.default if base.startswith("dataset:") and "/" not in base else None
        return spec.rule.limit


def _load_policy(policy: Any) -> Any:
    if policy is None or hasattr(policy, "limit_for"):
        return policy
    return _PolicyLimits(policy)


class _Replay:
    def __init__(self, src: Source, key: bytes | None, since: str | None, until: str | None,
                 plot: bool, policy: Any) -> None:
        self.src, self.key, self.since, self.until, self.plot = src, key, since, until, plot
        self.policy = policy
        self.out = AuditReport(source=src.name, keyed=key is not None)
        self.prev, self.next_seq, self.skip_link = GENESIS, 1, False
        self.states: dict[str, dict[str, float]] = {}
        self.rules: dict[str, tuple[dict[str, Any], CompositionRule]] = {}
        self.configs: dict[str, dict[str, Any]] = {}  # each account's configuration so far
        self.counts: dict[str, int] = {}
        self.series: dict[str, list[tuple[str, float, float]]] = {}
        self.stride = 1
        self.over: set[str] = set()
        self.over_in_force: set[str] = set()
        self.in_force: tuple[int, _PolicyLimits] | None = None  # from the ledger's own records
        self.diverged: dict[str, int] = {}
        # Running counters as plain attributes (pydantic assignment is slow); copied into the
        # report at the end.
        self.records = self.verified = 0
        self.charges: dict[tuple[Any, ...], Charge] = {}
        self.head: tuple[int, str] = (0, GENESIS)
        self.first_time: str | None = None
        self.last_time: str | None = None
        self.tallies: dict[str, dict[Any, list[Any]]] = {
            g: {} for g in ("analyst", "mechanism", "label", "pipeline", "dataset", "noise")}

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
            self.records += 1
            record = self.verify(item)
            if record is not None:
                try:
                    self.apply(record)
                except (KeyError, TypeError, ValueError, AttributeError, RecursionError,
                        PrivacyError) as exc:
                    self.problem("malformed", f"record {record.get('seq')} has an unreadable "
                                 f"member ({type(exc).__name__}: {exc})", record.get("seq"),
                                 item.position)

    def verify(self, item: Item) -> dict[str, Any] | None:
        where = f"{'row' if self.src.ledger is not None else 'line'} {item.position}"
        if item.text is None:
            self.problem("malformed", f"{where}: {item.error}", position=item.position)
            self.skip_link = True
            return None
        try:
            record: dict[str, Any] = json.loads(item.text)
            seq, prev, auth = record["seq"], record["prev"], record.get("auth", "sha256")
            if not isinstance(seq, int):
                raise TypeError("seq is not an integer")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            self.problem("malformed", f"{where}: not a ledger record ({exc})",
                         position=item.position)
            self.skip_link = True
            return None
        problems_before = self.out.problem_count
        if auth == "hmac-sha256" and self.key is None:
            if not any(p.kind == "auth" for p in self.out.problems):
                self.problem("auth", f"record {seq} is HMAC-keyed and no key was given "
                             "(set DPBUDGET_LEDGER_KEY): its chain cannot be verified", seq)
        elif auth == "sha256" and self.key is not None:
            self.problem("auth", f"record {seq} is not HMAC-keyed although a key is required: "
                         "written without the key, or forged", seq, item.position)
        elif auth not in ("sha256", "hmac-sha256"):
            self.problem("malformed", f"record {seq}: unknown auth {auth!r}", seq, item.position)
        else:
            digest = record_hash(item.text, self.key if auth == "hmac-sha256" else None)
            if digest != item.hash:
                self.problem("chain", f"record {seq}: its content does not match its hash "
                             "(edited)", seq, item.position)
        if self.src.ledger is not None and seq != item.position:
            self.problem("chain", f"row {item.position} holds record {seq} (moved)", seq,
                         item.position)
        elif seq > self.next_seq:
            missing = (f"record {self.next_seq}" if seq == self.next_seq + 1 else
                       f"records {self.next_seq}-{seq - 1}")
            self.problem("chain", f"{missing} missing before record {seq} (deleted or moved)",
                         seq, item.position)
        elif seq < self.next_seq:
            self.problem("chain", f"record {seq} appears after record {self.next_seq - 1} "
                         "(reordered or inserted)", seq, item.position)
        elif prev != self.prev and not self.skip_link:
            self.problem("chain", f"record {seq} does not link to record {seq - 1} (record "
                         f"{seq - 1} was edited and re-hashed, or {seq} was inserted)", seq,
                         item.position)
        self.skip_link = False
        self.prev, self.next_seq = item.hash or "", max(self.next_seq, seq + 1)
        self.head = (seq, item.hash or "")
        if self.out.problem_count == problems_before:
            self.verified += 1
        return record

    def apply(self, record: dict[str, Any]) -> None:
        seq, when = record["seq"], record.get("time")
        if self.until is not None and when is not None and when > self.until:
            return
        self.first_time = self.first_time or when
        self.last_time = when
        if record.get("kind") == "policy":
            policy, default = from_document(record["policy"])
            self.in_force = (seq, _PolicyLimits(policy, default))
            return
        accounts = record.get("accounts") or {}
        if accounts:
            charge = self.charge(record["cost"], (record.get("mechanism") or {}).get("name"))
            for key, stored in accounts.items():
                self.debit(seq, key, stored, charge)
            if self.since is None or (when is not None and when >= self.since):
                self.tally(record, charge)

    def charge(self, cost: dict[str, Any], mechanism: Any) -> Charge:
        # Records of the same mechanism repeat the same cost: decode each distinct one once.
        if "parts" in cost:
            return charge_from_record(cost, str(mechanism))
        key = (mechanism, *cost.items())
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
        cached = self.rules.get(key)
        if cached is None or cached[0] != config:
            cached = self.rules[key] = (config, rule_from_config(config))
        rule = cached[1]
        state = self.states.get(key)
        previous = self.configs.get(key, config)
        current = None if state is None else Account(key, previous.get("rule", ""), previous,
                                                     state, 0)
        try:
            try:
                new = step_account(key, rule, current, charge)
            except LedgerConflictError as conflict:  # allowed only so far: report, continue
                self.problem("limit", f"record {seq}: {key} changed its configuration: "
                             f"{str(conflict).split(': ', 1)[-1]}", seq)
                self.over.add(key)
                if previous.get("rule") != rule.name:  # another rule's state: start it afresh
                    current = None
                else:
                    current = None if state is None else Account(key, rule.name, config, state,
                                                                 0)
                new = step_account(key, rule, current, charge)
        except InvalidArgumentError as invalid:  # a negative, NaN or infinite cost: a refund
            self.problem("malformed", f"record {seq}: {key} was charged an invalid cost "
                         f"({invalid})", seq)
            self.over.add(key)
            new = stored["state"]
        except (Refused, PrivacyError) as refusal:
            self.problem("limit", f"record {seq}: {key} admitted a release its rule refuses "
                         f"({refusal})", seq)
            self.over.add(key)
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
        if self.in_force is not None:
            self.check_in_force(seq, key, rule, new)
        n = self.counts[key] = self.counts.get(key, 0) + 1
        if self.plot:
            self.sample(key, n, rule, new)

    def check_in_force(self, seq: int, key: str, rule: CompositionRule,
                       state: dict[str, float]) -> None:
        """The replayed spend against the limit of the policy in force at this record (the
        latest policy record before it), whatever limit the record itself carries."""
        if self.in_force is None:
            return
        where, limits = self.in_force
        declared = limits.limit_for(key)
        if declared is None or declared.is_unlimited or key in self.over_in_force:
            return
        spent = rule.spent(state)
        if not (within(spent.epsilon, declared.epsilon) and within(spent.delta, declared.delta)):
            self.over_in_force.add(key)
            self.over.add(key)
            self.problem("limit", f"record {seq}: {key} has spent {spent}, over the limit in "
                         f"force {declared} (policy record {where})", seq)

    def sample(self, key: str, n: int, rule: CompositionRule, state: dict[str, float]) -> None:
        points = self.series.setdefault(key, [])
        if n % self.stride == 0:
            spent = rule.spent(state)
            points.append((self.last_time or "", spent.epsilon, spent.delta))
            if len(points) > _PLOT_POINTS:  # thin to bounded memory
                del points[::2]
                self.stride *= 2

    def tally(self, record: dict[str, Any], charge: Charge) -> None:
        # Plain lists while replaying (a million records); Tally models are built at the end.
        t = self.tallies
        names = [("analyst", record.get("analyst")),
                 ("mechanism", (record.get("mechanism") or {}).get("name")),
                 ("label", record.get("label")), ("pipeline", record.get("pipeline")),
                 ("noise", record.get("noise") or ("unrecorded" if record.get("mechanism")
                                                   else None))]
        names += [("dataset", d) for d in record.get("datasets") or [record.get("dataset")]]
        for group, name in names:
            if name is not None:
                row = t[group].get(name)
                if row is None:
                    row = t[group][name] = [0, 0.0, 0.0]
                row[0] += 1
                row[1] += charge.epsilon
                row[2] += charge.delta

    def report(self, expected_head: str | None) -> AuditReport:
        out = self.out
        out.records, out.verified = self.records, self.verified
        out.head_seq, out.head_hash = self.head
        out.first_time, out.last_time = self.first_time, self.last_time
        for group, rows in self.tallies.items():
            setattr(out, f"by_{group}", {str(name): Tally(releases=n, epsilon=e, delta=d)
                                         for name, (n, e, d) in rows.items()})
        out.expected_head = expected_head
        if expected_head is not None and expected_head != out.head_hash:
            self.problem("head", f"the ledger ends at record {out.head_seq} with hash "
                         f"{out.head_hash}, not at the expected head {expected_head} "
                         "(truncated or rewritten tail)", out.head_seq)
        for key, n in sorted(self.diverged.items()):
            if n > 1:
                self.problem("state", f"{key}: {n - 1} later records also disagree with the "
                             "replay")
        stored = {a.key: a for a in self.src.stored_accounts() or [] if a.key != POLICY_KEY}
        for key in sorted(self.states):
            rule, state = self.rules[key][1], self.states[key]
            spent, remaining = rule.spent(state), rule.remaining(state)
            if self.policy is not None:
                declared = self.policy.limit_for(key)
                if declared is not None and not declared.is_unlimited and not (
                        within(spent.epsilon, declared.epsilon)
                        and within(spent.delta, declared.delta)):
                    self.over.add(key)
                    self.problem("limit", f"{key} has spent {spent}, over the policy's limit "
                                 f"{declared}")
            agrees = None
            if key in stored:
                agrees = stored[key].state == state
                if not agrees and self.until is None:
                    self.problem("state", f"{key}: the ledger's stored running state "
                                 f"{stored[key].state} differs from the replay {state}")
            out.accounts.append(AccountReport(
                account=key, rule=rule.name,
                limit=None if rule.limit is None else rule.limit.model_dump(),
                spent=spent.model_dump(), remaining=remaining.model_dump(),
                releases=self.counts.get(key, 0),
                over_limit=key in self.over,
                stored_state_agrees=agrees, series=self.series.get(key) if self.plot else None))
        for key in sorted(set(stored) - set(self.states)):
            if self.until is None:
                self.problem("state", f"{key}: the ledger stores a running state but no record "
                             "debits it (records deleted?)")
        return out


def _progress(src: Source, enabled: bool | None) -> Iterator[Item]:
    total = src.size_hint()
    if enabled is None:
        enabled = total > 100_000 and sys.stderr.isatty()
    items = src.items()
    if not enabled:
        yield from items
        return
    step = max(1, total // 200)
    for n, item in enumerate(items, start=1):
        if n % step == 0:
            done = min(1.0, n / total)
            bar = "#" * int(done * 40)
            print(f"\raudit {bar:<40} {n:,} records", end="", file=sys.stderr, flush=True)
        yield item
    print(file=sys.stderr)
