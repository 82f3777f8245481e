"""The limits a policy declares (``policies.limits``). The gate and the audit hold a release to one
stateless policy check
(``dpbudget.policies.limits.refusal``: allowed mechanisms, per-query caps): a release the gate refuses is,
recorded by a writer without the check, flagged by the audit; one the gate admits is not. One row
per check, single releases and batch items."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant import Accountant
import dpbudget.accountant.audit.policy
from dpbudget.accountant.audit.run import audit
import dpbudget.accountant.gate.gate
from dpbudget.accountant.values.errors import (
    BudgetExceededError, MechanismNotAllowedError, PrivacyError,
)
from dpbudget.mechanisms import DiscreteLaplace, Gaussian, Laplace

POLICY = """
[datasets.people]
limit = { epsilon = 10.0, delta = 1e-3 }
max_per_query = { epsilon = 0.5, delta = 1e-6 }
allowed_mechanisms = ["Laplace", "Gaussian"]
"""

ROWS: list[tuple[str, Callable[[], list[Any]], bool]] = [
    ("allowed, within the caps", lambda: [Laplace(0.5, sensitivity=1.0)], False),
    ("at both caps", lambda: [Gaussian(0.5, delta=1e-6, sensitivity=1.0)], False),
    ("a mechanism not allowed", lambda: [DiscreteLaplace(0.1, sensitivity=1)], True),
    ("above the epsilon cap", lambda: [Laplace(0.6, sensitivity=1.0)], True),
    ("above the delta cap", lambda: [Gaussian(0.1, delta=1e-5, sensitivity=1.0)], True),
    ("a batch within both checks", lambda: [Laplace(0.1, sensitivity=1.0), Gaussian(0.2, delta=1e-7, sensitivity=1.0)], False),
    ("a batch item not allowed", lambda: [Laplace(0.1, sensitivity=1.0), DiscreteLaplace(0.1, sensitivity=1)], True),
    ("a batch item above a cap", lambda: [Laplace(0.1, sensitivity=1.0), Laplace(0.7, sensitivity=1.0)], True),
]


def _release(acc: Accountant, mechanisms: list[Any]) -> None:
    if len(mechanisms) == 1:
        acc.release(mechanisms[0], 1, dataset="people")
    else:
        acc.release_many([(m, 1) for m in mechanisms], dataset="people")


def _record(db: Path, write: Any, mechanisms: Callable[[], list[Any]],
            monkeypatch: pytest.MonkeyPatch) -> bool:
    """Release through the gate; if it refuses, record the release as a writer without the
    check would (the gate's check removed). Returns whether the gate refused."""
    with Accountant.from_policy(write(POLICY), ledger=db, rng=0, simulation=True) as acc:
        try:
            _release(acc, mechanisms())
            return False
        except (MechanismNotAllowedError, BudgetExceededError):
            pass
        with monkeypatch.context() as patch:
            patch.setattr(dpbudget.accountant.gate.gate, "refusal", lambda *args: None)
            _release(acc, mechanisms())
        return True


@pytest.mark.parametrize(("case", "mechanisms", "refused"), ROWS, ids=[r[0] for r in ROWS])
def test_the_audit_flags_exactly_what_the_gate_refuses(
        case: str, mechanisms: Callable[[], list[Any]], refused: bool, write: Any,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "l.db"
    assert _record(db, write, mechanisms, monkeypatch) is refused
    report = audit(f"sqlite:///{db}")
    flagged = [p for p in report.problems if p.kind == "limit" and "refuses it" in p.message]
    assert bool(flagged) is refused, report.problems
    assert len(report.problems) == len(flagged)  # nothing else wrong with the ledger


def test_negative_control_an_audit_without_the_check_passes_the_broken_writers_record(
        write: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "l.db"
    assert _record(db, write, lambda: [Laplace(0.1, sensitivity=1.0), DiscreteLaplace(0.1, sensitivity=1)], monkeypatch)
    assert not audit(f"sqlite:///{db}").ok
    monkeypatch.setattr(dpbudget.accountant.audit.policy, "refusal", lambda *args: None)
    assert audit(f"sqlite:///{db}").ok  # the test above fails against such an audit


def test_the_audit_reads_a_recorded_cost_as_the_gate_checked_it() -> None:
    """A cost the audit could not build a Budget from (ε = inf with δ > 0, δ > 1) was read as
    Budget.unlimited() = (inf, 0), which a δ-only cap admits: the audit passed a record whose δ
    was 1,000 times the cap, that the gate refuses. Now it is decoded like every record's cost,
    and one the gate could not have written is a problem of its own."""
    from dpbudget.accountant.audit.policy import _cost
    from dpbudget.accountant.values.charge import Charge
    from dpbudget.policies.limits import Cap, DatasetLimit, refusal

    checks = [("d", DatasetLimit(max_per_query=Cap(delta=1e-6)))]
    assert refusal(checks, "Laplace", Charge(float("inf"), 1e-3)) is not None  # the gate
    assert refusal(checks, "Laplace", _cost({"epsilon": float("inf"), "delta": 1e-3})) is not None
    assert refusal(checks, "Laplace", _cost({"epsilon": 0.1, "delta": 2.0})) is not None
    with pytest.raises((ValueError, TypeError, KeyError, PrivacyError)):
        _cost({"epsilon": 0.1})
    with pytest.raises(TypeError):
        _cost("0.1")
    assert _cost(None) is None  # a batch item from before items stated their cost
