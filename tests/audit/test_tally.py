"""Every release record says which noise it drew; the audit counts the releases made without exact
noise from the OS CSPRNG (issue 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.findings import AuditReport
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.tally import Tallies
from dpbudget.accountant.cli import main
from dpbudget.accountant.values.charge import Charge
from dpbudget.mechanisms import AnalyticGaussian, DiscreteLaplace, Laplace


def _ledger(tmp_path: Path, rng: object) -> str:
    location = f"sqlite:///{tmp_path / 'l.db'}"
    with Accountant(Budget(10.0, 1e-3), ledger=location, rng=rng, simulation=True) as acc:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
        acc.release(Laplace(0.1, sensitivity=1.0), [1.0, 2.0])
        acc.release(DiscreteLaplace(0.1, sensitivity=1), 3)
        acc.release(Laplace(0.1, noise="float", sensitivity=1.0), 1.0)
        acc.release(AnalyticGaussian(0.1, delta=1e-6, sensitivity=1.0), 1.0)  # exact by default too
        acc.release(AnalyticGaussian(0.1, delta=1e-6, noise="float", sensitivity=1.0), 1.0)
        acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(0.1, noise="float", sensitivity=1.0), 2.0)])
    return location


def test_audit_counts_noise_kinds(tmp_path: Path) -> None:
    report = audit(_ledger(tmp_path, None))
    counts = {k: t.releases for k, t in report.by_noise.items()}
    assert counts == {"exact-csprng": 4, "float-csprng": 3}
    assert report.insecure_releases == 3 and report.ok


def test_seeded_noise_is_not_secure(tmp_path: Path) -> None:
    report = audit(_ledger(tmp_path, 5))
    assert {k: t.releases for k, t in report.by_noise.items()} == {
        "exact-seeded": 4, "float-seeded": 3}
    assert report.insecure_releases == 7


def test_status_and_audit_show_the_count(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    location = _ledger(tmp_path, None)
    """Status reads no records (issue 32: tests/audit/test_status.py), so it points to the audit,
    which counts them."""
    assert main(["status", location]) == 0
    assert "`dpbudget audit` counts the releases made without exact noise" in \
           capsys.readouterr().out
    assert main(["audit", location]) == 0
    assert "3 WITHOUT secure noise" in capsys.readouterr().out


def _record(seq: int, accounts: list[str], **members: object) -> dict[str, object]:
    return {"seq": seq, "time": f"t{seq}", "dataset": "people", "analyst": "alice",
            "mechanism": {"name": "Laplace"}, "noise": "exact-csprng", "accounts": accounts,
            **members}


def test_a_pipelines_inside_release_is_never_counted_twice() -> None:
    """The allocation (charged to the dataset) is the spend; a release charged only to the
    pipeline's own account was paid for by it, so it goes in the inside columns, not the totals."""
    tallies = Tallies()
    tallies.add(_record(1, ["dataset:people"], pipeline="p"), Charge(0.5, 1e-6))
    tallies.add(_record(2, ["pipeline:1"], pipeline="p"), Charge(0.2, 0.0))
    tallies.add(_record(3, ["pipeline:1"], pipeline="p"), Charge(0.3, 0.0))
    report = AuditReport(source="test")
    tallies.into(report)
    people = report.by_dataset["people"]
    assert (people.releases, people.epsilon, people.delta) == (1, 0.5, 1e-6)
    assert (people.inside_releases, people.inside_epsilon) == (2, 0.5)
    assert report.by_pipeline["p"].epsilon == 0.5 and report.by_analyst["alice"].releases == 1


def test_the_first_record_of_each_dataset_is_noted_even_before_since() -> None:
    tallies = Tallies()
    tallies.add(_record(4, ["dataset:people"]), Charge(0.1, 0.0), counted=False)
    tallies.add(_record(7, ["dataset:peolpe"], dataset="peolpe"), Charge(0.1, 0.0))
    tallies.add(_record(9, ["dataset:people"]), Charge(0.1, 0.0))
    report = AuditReport(source="test")
    tallies.into(report)
    assert report.datasets_first == {"people": (4, "t4"), "peolpe": (7, "t7")}
    assert report.by_dataset["people"].releases == 1  # the record before ``since`` is not tallied


def test_a_record_without_a_noise_member_is_unrecorded_noise() -> None:
    tallies = Tallies()
    tallies.add(_record(1, ["dataset:people"], noise=None), Charge(0.1, 0.0))
    report = AuditReport(source="test")
    tallies.into(report)
    assert set(report.by_noise) == {"unrecorded"} and report.insecure_releases == 1
