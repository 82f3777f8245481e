"""Every release record says which noise it drew; the audit and ``status`` count the releases made
without exact noise from the OS CSPRNG (issue 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.cli import main
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
    assert main(["status", location]) == 0
    out = capsys.readouterr().out
    assert "noise: 4 release(s) with exact noise from the OS CSPRNG; 3 WITHOUT secure noise " \
           "(float-csprng 3)" in out
    assert main(["status", "--json", location]) == 0
    assert json.loads(capsys.readouterr().out)["noise"] == {"exact-csprng": 4, "float-csprng": 3}
    assert main(["audit", location]) == 0
    assert "3 WITHOUT secure noise" in capsys.readouterr().out
