"""The audit's findings as data: ``AuditReport`` and its parts, and the exit bits.

Exit status of ``dpbudget audit`` (``AuditReport.exit_status``): 0 when the chain verifies,
recomputed and stored state agree and no limit was exceeded; otherwise the sum of one bit per kind
of problem found (so each kind is distinct and combinations are readable):

====  ============  ==================================================================
bit   kind          meaning
====  ============  ==================================================================
1     time          a record's time runs backwards or lies over an hour after the
                    audit's clock, or a windowed or block account a record charges does
                    not contain the record's time
4     policy        a policy record is unsigned or its signature does not verify under
                    the owner's key pinned in the ledger's first record
8     chain         a record was edited, deleted, inserted or reordered; the last record
                    is not the expected head (kind ``head``: a truncated tail); a record
                    or line could not be read (kind ``malformed``: garbled)
16    release       a release record claims what it cannot be: seeded noise on a ledger
                    not created for simulation, or a custom mechanism recorded under a
                    library mechanism's name
32    state         a stored state disagrees with the replay
64    limit         a release was admitted that its limit should have refused, or
                    charged other accounts than the gate's plan
128   auth          records are not verifiable as HMAC-keyed (missing key, or unkeyed
                    records where a key is required), or a record's HMAC does not
                    verify under the key (forged without it, or edited)
====  ============  ==================================================================

An exit status has eight bits and 2 is the command line's own: ``head`` and ``malformed`` share
the ``chain`` bit (each is a record that is not the one written), and their problems keep their
own kind in the report.

(2 is the command line's own status for bad usage or an unreadable source.)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from dpbudget.accountant.ledger.record import GENESIS

__all__ = ["EXIT_BITS", "AccountReport", "AuditReport", "PolicyRecordReport", "Problem",
           "ProblemKind", "Tally"]

ProblemKind = Literal["head", "chain", "malformed", "state", "limit", "auth", "time", "policy",
                      "release"]
EXIT_BITS: dict[str, int] = {"time": 1, "policy": 4, "head": 8, "chain": 8, "malformed": 8,
                             "release": 16, "state": 32, "limit": 64, "auth": 128}


SECURE_NOISE = "exact-csprng"


class Problem(BaseModel):
    """One finding: its kind, the record number (``seq``) or line/row (``position``), and what."""

    model_config = ConfigDict(frozen=True)

    kind: ProblemKind
    seq: int | None = None
    position: int | None = None
    message: str


class Tally(BaseModel):
    """The records of one group and the sum of their declared costs (basic composition).

    ``releases``, ``epsilon`` and ``delta`` count what was charged to the datasets: releases made
    outside any pipeline, and each pipeline's allocation (debited once, when it opened). The
    releases made inside a pipeline are paid for by its allocation; they are counted apart, in
    ``inside_releases``, ``inside_epsilon`` and ``inside_delta``, so that no total counts the
    same budget twice.
    """

    releases: int = 0
    epsilon: float = 0.0
    delta: float = 0.0
    inside_releases: int = 0
    inside_epsilon: float = 0.0
    inside_delta: float = 0.0


class AccountReport(BaseModel):
    """One limit (an account: a dataset, an analyst on a dataset, a pipeline...) after replay."""

    account: str
    rule: str
    limit: dict[str, float] | None
    spent: dict[str, float]
    remaining: dict[str, float]
    releases: int
    over_limit: bool
    per: str = "per row"  # what its ε is per: "per person_id" (the dataset's privacy unit)
    stored_state_agrees: bool | None = None
    series: list[tuple[str, float, float]] | None = None


class PolicyRecordReport(BaseModel):
    """One policy record: when, who (``by``), why, whether it is signed, and each way it grants
    more than the policy it replaces (``dpbudget.policies.stored.raised``; empty for the first)."""

    seq: int
    time: str | None
    by: str
    reason: str
    signed: bool
    raised: list[str] = []


class AuditReport(BaseModel):
    """Everything the audit found. JSON-serialisable (``model_dump_json``)."""

    source: str
    records: int = 0
    verified: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS
    expected_head: str | None = None
    keyed: bool = False
    #: The ledger's first record says it was created for simulation (seeded noise allowed; its
    #: releases protect no one). Seeded noise on any other durable ledger is a ``release`` problem.
    simulation: bool = False
    first_time: str | None = None
    last_time: str | None = None
    accounts: list[AccountReport] = []
    #: The owner key the first record pins (None: none, or record 1 not in the source).
    owner: str | None = None
    #: Every policy record, in order.
    policies: list[PolicyRecordReport] = []
    by_dataset: dict[str, Tally] = {}
    #: Every dataset charged, with the seq and time of the first record that charged it (a
    #: misspelt name under a default limit, ``other_datasets``, shows as a dataset of its own).
    datasets_first: dict[str, tuple[int, str | None]] = {}
    by_analyst: dict[str, Tally] = {}
    by_mechanism: dict[str, Tally] = {}
    by_label: dict[str, Tally] = {}
    by_pipeline: dict[str, Tally] = {}
    #: Releases by the noise their record says was drawn: ``exact-csprng`` (the only secure kind),
    #: ``exact-seeded``, ``float-csprng``, ``float-seeded``, or ``unrecorded`` (older records).
    by_noise: dict[str, Tally] = {}
    #: Records not in the source (other writers', when the source is one process's log): their
    #: count and first ``(first, last)`` seq ranges. 0 means the chain is complete up to its head.
    absent: int = 0
    absent_ranges: list[tuple[int, int]] = []
    #: In a ledger linked per account (PostgreSQL): numbers no committed record holds, taken by
    #: transactions that never committed (rolled back, or lost in a crash: never answered). A
    #: note, not a problem: a deleted record is seen by the links that name it.
    unused: int = 0
    #: Account states taken from a record after absent records instead of replayed (each checked
    #: to be possible: no lower than the replay implies, within its limit).
    resynced: int = 0
    #: Distinct writers (a ledger object in a process) whose records are in the source.
    writers: int = 0
    #: Records found more than once — in several merged logs, or a log line written twice (after
    #: an interrupt) — identical each time, so read once.
    duplicates: int = 0
    #: Refused requests found in a log (``dpbudget.accountant.gate.refusals``), per analyst: never spend.
    refused: dict[str, int] = {}
    problems: list[Problem] = []
    problem_count: int = 0
    #: Every kind of problem found, however many problems there were (``problems`` keeps only
    #: the first 1,000): the exit status is computed from these.
    problem_kinds: list[ProblemKind] = []

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def complete(self) -> bool:
        """Whether every record up to the head is in the source (a subsequence is not)."""
        return self.absent == 0

    @property
    def insecure_releases(self) -> int:
        """Releases whose noise was not exact noise from the OS CSPRNG."""
        return sum(t.releases + t.inside_releases for kind, t in self.by_noise.items()
                   if kind != SECURE_NOISE)

    def _repr_html_(self) -> str:
        """A notebook summary: the verdict, then one row per account."""
        from dpbudget.accountant.values._html import table

        verdict = "clean" if self.ok else f"{self.problem_count} problem(s)"
        return table(("account", "rule", "spent ε", "spent δ", "releases", "over limit"),
                     [(a.account, a.rule, a.spent.get("epsilon", 0.0), a.spent.get("delta", 0.0),
                       a.releases, "yes" if a.over_limit else "") for a in self.accounts],
                     caption=f"audit of {self.source}: {self.records} records, {verdict}, "
                     f"exit status {self.exit_status}")

    @property
    def exit_status(self) -> int:
        status = 0
        for kind in {*self.problem_kinds, *(p.kind for p in self.problems)}:
            status |= EXIT_BITS[kind]
        return status
