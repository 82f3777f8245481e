"""The audit report and the noise counts as text (``dpbudget.accountant.audit.text``): releases without
secure noise are counted and named by kind; the report's text says what was found."""

from __future__ import annotations

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.findings import AuditReport, Problem
from dpbudget.accountant.audit.text import audit_text, noise_counts, noise_line
from dpbudget.mechanisms import Laplace


def test_noise_counts_read_each_release_once_by_its_kind() -> None:
    acc = Accountant(Budget(10.0), rng=3)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.release(Laplace(0.1, noise="float", sensitivity=1.0), 1.0)
    acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(0.1, sensitivity=1.0), 2.0)])
    assert noise_counts(acc.ledger) == {"exact-seeded": 2, "float-seeded": 1}


def test_the_noise_line_names_every_release_without_secure_noise() -> None:
    assert noise_line({"exact-csprng": 4}) == "noise: 4 release(s) with exact noise from the OS CSPRNG"
    line = noise_line({"exact-csprng": 1, "float-seeded": 2, "unrecorded": 1, "exact-seeded": 0})
    assert line.endswith("; 3 WITHOUT secure noise (float-seeded 2, unrecorded 1)")


def test_the_report_text_names_the_source_and_each_problem() -> None:
    report = AuditReport(source="ledger.db", records=3, verified=2, head_seq=3,
                         problems=[Problem(kind="chain", seq=2, message="record 2 was edited")],
                         problem_count=1, problem_kinds=["chain"])
    text = audit_text(report, None)
    assert text.startswith("audit of ledger.db: 3 records, 2 verified, head 3")
    assert "record 2 was edited" in text
