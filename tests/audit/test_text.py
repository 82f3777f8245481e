"""The audit report and the noise counts as text (``dpbudget.accountant.audit.text``): releases without
secure noise are counted and named by kind; the report's text says what was found."""

from __future__ import annotations

from dpbudget.accountant.audit.findings import AuditReport, Problem, Tally
from dpbudget.accountant.audit.text import audit_text, noise_line


def test_the_noise_line_names_every_release_without_secure_noise() -> None:
    assert noise_line({"exact-csprng": Tally(releases=4)}) == \
        "noise: 4 release(s) with exact noise from the OS CSPRNG"
    line = noise_line({"exact-csprng": Tally(releases=1), "float-seeded": Tally(inside_releases=2),
                       "unrecorded": Tally(releases=1), "exact-seeded": Tally()})
    assert line.endswith("; 3 WITHOUT secure noise (float-seeded 2, unrecorded 1)")


def test_the_report_text_names_the_source_and_each_problem() -> None:
    report = AuditReport(source="ledger.db", records=3, verified=2, head_seq=3,
                         problems=[Problem(kind="chain", seq=2, message="record 2 was edited")],
                         problem_count=1, problem_kinds=["chain"])
    text = audit_text(report, None)
    assert text.startswith("audit of ledger.db: 3 records, 2 verified, head 3")
    assert "record 2 was edited" in text


def test_unused_numbers_are_a_note_not_a_problem() -> None:
    """Numbers no record holds (a crash's, issue 32) are said once, without an exit bit."""
    report = AuditReport(source="pg", records=5, verified=5, head_seq=8, unused=3)
    text = audit_text(report, None)
    assert "3 number(s) held by no record" in text and report.exit_status == 0
    assert "held by no record" not in audit_text(AuditReport(source="pg"), None)
