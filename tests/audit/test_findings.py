"""The audit's findings as data (``dpbudget.accountant.audit.findings``): the exit status keeps one bit
per kind of problem, however many problems were found."""

from __future__ import annotations

import itertools

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit import findings
from dpbudget.accountant.audit.findings import EXIT_BITS, AuditReport, Problem
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.mechanisms import Laplace


def test_every_exit_bit_survives_any_number_of_problems(tmp_path):
    """1,500 garbled lines, then a forged limit: the limit bit is still in the exit status."""
    acc = Accountant(Budget(1.0), rng=0)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    out = tmp_path / "x.jsonl"
    from dpbudget.accountant.audit.transfer import export_jsonl

    export_jsonl(acc.ledger, out)
    good = out.read_text()
    out.write_text("garbage\n" * 1500 + good)

    class Strict:
        def limit_for(self, key):
            return Budget(0.1)

    report = audit(out, policy=Strict())
    assert report.problem_count > 1000 and len(report.problems) == 1000
    assert report.exit_status & EXIT_BITS["malformed"] and report.exit_status & EXIT_BITS["limit"]


# The bits scripts and dashboards read (docs/auditing.md): renumbering one breaks every caller.
FIXED = {"time": 1, "policy": 4, "chain": 8, "head": 8, "malformed": 8, "release": 16, "state": 32,
         "limit": 64, "auth": 128}


def _report(*kinds: str) -> AuditReport:
    return AuditReport(source="test", problems=[Problem(kind=k, message=k) for k in kinds],
                       problem_count=len(kinds), problem_kinds=list(kinds))


def test_the_exit_bits_are_fixed_and_2_stays_the_command_lines() -> None:
    assert EXIT_BITS == FIXED
    assert not any(bit & 2 for bit in EXIT_BITS.values())
    assert _report().ok and _report().exit_status == 0


@pytest.mark.parametrize("kinds", [c for n in (1, 2, 3) for c in itertools.combinations(sorted(FIXED), n)])
def test_each_kind_of_problem_sets_its_bit_and_only_its_bit(kinds: tuple[str, ...]) -> None:
    """Every combination reads back: the status is the union of its kinds' bits, nothing else."""
    report = _report(*kinds)
    expected = 0
    for kind in kinds:
        expected |= FIXED[kind]
    assert not report.ok and report.exit_status == expected


def test_negative_control_a_renumbered_bit_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a bit moved under the report (here ``limit`` onto ``state``'s 32) changes
    the exit status the test above pins, so that test can fail."""
    monkeypatch.setitem(findings.EXIT_BITS, "limit", 32)
    assert _report("limit").exit_status != FIXED["limit"]
