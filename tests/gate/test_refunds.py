"""Negative costs never refund budget: not through a mechanism whose cost was built without
validation, not through the ledger's own append, and not through a forged, re-hashed export."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, LedgerError
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.mechanisms import Laplace
from dpbudget.mechanisms.base import NumericMechanism
from tests.support import snapshot


class _Forged(NumericMechanism):
    """A mechanism whose cost skips ``Budget``'s validation (pydantic's ``model_construct``)."""

    def __init__(self, epsilon: float, delta: float = 0.0) -> None:
        self.epsilon = epsilon
        self._cost = Budget.model_construct(epsilon=epsilon, delta=delta)

    def params(self) -> dict[str, Any]:
        return {}  # (a finite-looking ε in params would already be refused at construction)

    def draw(self, value: Any, sampler: Any) -> Any:
        return value + sampler.laplace(1.0)


@pytest.mark.parametrize("epsilon, delta", [(-1.0, 0.0), (float("nan"), 0.0), (0.1, -1e-6),
                                            (0.1, 1.5), (float("inf"), 0.0), (-0.0, -0.0)])
def test_an_invalid_cost_is_refused_where_it_is_charged(epsilon: float, delta: float) -> None:
    rng = np.random.default_rng(5)
    acc = Accountant(Budget(1.0, 1e-6), rng=rng)
    for _ in range(10):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    before = snapshot(acc.ledger, rng)
    if epsilon == 0.0 and delta == 0.0:  # -0.0 is 0: a free release is not a refund
        with pytest.raises(Exception):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
        return
    with pytest.raises(InvalidArgumentError) as info:
        acc.release(_Forged(epsilon, delta), 1.0)
    assert info.value.argument == "cost"
    assert snapshot(acc.ledger, rng) == before  # nothing debited, nothing drawn
    with pytest.raises(InvalidArgumentError):
        acc.can_afford(_Forged(epsilon, delta))
    with pytest.raises(InvalidArgumentError):  # inside a batch too
        acc.release_many([(Laplace(0.01, sensitivity=1.0), 1.0), (_Forged(epsilon, delta), 1.0)])
    assert snapshot(acc.ledger, rng) == before


def test_the_refund_attack_gets_nothing_back() -> None:
    """The issue's scenario: a spent limit, then a mechanism of cost -1, then ten releases of 0.1
    that the refund would have paid for. All refused."""
    acc = Accountant(Budget(1.0), rng=0)
    for _ in range(10):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with pytest.raises(InvalidArgumentError):
        acc.release(_Forged(-1.0), 1.0)
    assert not acc.can_afford(Laplace(0.1, sensitivity=1.0))
    assert acc.spent().epsilon >= 1.0 - 1e-9


def test_a_forged_negative_cost_in_a_rehashed_export_fails_the_audit(tmp_path: Path) -> None:
    acc = Accountant(Budget(1.0), rng=0)
    for _ in range(3):
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    out = tmp_path / "x.jsonl"
    export_jsonl(acc.ledger, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # Rewrite record 3 as a refund of 0.5 (state down to 0.25) and re-hash the chain from there.
    prev = lines[1]["hash"]
    for line in lines[2:]:
        record = line["record"]
        record["prev"] = prev
        if record["seq"] == 3:
            record["cost"]["epsilon"] = -0.5
            record["accounts"]["dataset:default"]["state"]["epsilon"] = 0.0
        text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        line["hash"] = prev = hashlib.sha256(text.encode()).hexdigest()
    out.write_text("".join(json.dumps({"hash": ln["hash"], "record": ln["record"]},
                                      separators=(",", ":"), ensure_ascii=False) + "\n"
                           for ln in lines))
    report = audit(out)
    assert report.exit_status & EXIT_BITS["malformed"]
    assert any("invalid cost" in p.message and p.seq == 3 for p in report.problems)


def test_the_ledger_refuses_a_refund_appended_directly(tmp_path: Path) -> None:
    """Even code that bypasses the gate and appends through ``Ledger.transaction()`` cannot lower
    an account's running state."""
    acc = Accountant(Budget(1.0), ledger=tmp_path / "b.db", rng=0, simulation=True)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    account = acc.ledger.account("dataset:default")
    assert account is not None
    before = snapshot(acc.ledger)
    with pytest.raises(LedgerError, match="never decreases"):
        with acc.ledger.transaction() as tx:
            tx.append({"kind": '"release"'}, [account._replace(state={"epsilon": 0.0,
                                                                      "delta": 0.0})])
    assert snapshot(acc.ledger) == before
    assert acc.spent() == Budget(0.5)


def test_running_totals_reset_by_hand_are_caught_when_the_ledger_opens(tmp_path: Path) -> None:
    """The issue's scenario: stored running totals set to 0 by hand would let 100 more releases
    through. A new accountant on the ledger refuses to open it."""
    import sqlite3

    from dpbudget.accountant import LedgerCorruptedError

    path = tmp_path / "b.db"
    with Accountant(Budget(1.0), ledger=path, rng=0, simulation=True) as acc:
        for _ in range(10):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with sqlite3.connect(path) as conn:
        conn.execute("""UPDATE accounts SET state = '{"delta":0.0,"epsilon":0.0}'""")
    with pytest.raises(LedgerCorruptedError, match="dataset:default"):
        Accountant(Budget(1.0), ledger=path, rng=0, simulation=True)


def test_a_ledger_deleted_or_replaced_in_use_is_refused(tmp_path: Path) -> None:
    import shutil

    from dpbudget.accountant import LedgerError

    path = tmp_path / "b.db"
    acc = Accountant(Budget(1.0), ledger=path, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    backup = tmp_path / "backup.db"
    shutil.copy(path, backup)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    shutil.copy(backup, tmp_path / "restored.db")
    (tmp_path / "restored.db").replace(path)  # a backup restored over the live ledger
    with pytest.raises(LedgerError, match="deleted or replaced"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.close()
    acc = Accountant(Budget(1.0), ledger=tmp_path / "c.db", rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    (tmp_path / "c.db").unlink()  # deleted while in use
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"c.db{suffix}").unlink(missing_ok=True)
    with pytest.raises(LedgerError, match="deleted or replaced"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.close()


def test_a_relative_ledger_path_survives_a_chdir(tmp_path: Path, monkeypatch: Any) -> None:
    """Review finding: the deleted-or-replaced check must not refuse a ledger opened by a
    relative path once the process changes directory (as notebooks do)."""
    monkeypatch.chdir(tmp_path)
    acc = Accountant(Budget(1.0), ledger="budget.db", rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    monkeypatch.chdir(tmp_path.parent)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert acc.spent().epsilon == pytest.approx(0.2)
    acc.close()
