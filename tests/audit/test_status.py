"""Budget status (``dpbudget.accountant.audit.status``): read from the accounts' stored state, never
from the records; with a policy, each account against the limit the policy gives it now."""

from __future__ import annotations

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.status import budget_rows, budget_table
from dpbudget.mechanisms import Laplace
from dpbudget.policies.policy import parse_policy
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any
from dpbudget.accountant import cli
from dpbudget.accountant.audit import status
from dpbudget.accountant.ledger import sql
from tests.support import run_cli

POLICY = """
    [datasets.adult]
    limit = { epsilon = 1.0 }
    [other_datasets]
    limit = { epsilon = 2.0 }
"""


def _spent() -> Accountant:
    acc = Accountant(Budget(2.0), rng=0)
    acc.release(Laplace(0.75, sensitivity=1.0), 1.0, dataset="adult")
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="census")
    return acc


def test_rows_are_read_from_the_stored_state_never_the_records(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = _spent()
    monkeypatch.setattr(acc.ledger, "entries", lambda *a, **k: pytest.fail("the records were read"))
    rows = {r["account"]: r for r in budget_rows(acc.ledger)}
    assert set(rows) == {"dataset:adult", "dataset:census"}
    assert rows["dataset:adult"]["spent"]["epsilon"] == 0.75
    assert rows["dataset:adult"]["remaining"]["epsilon"] == 1.25
    assert rows["dataset:census"]["limit"] == {"epsilon": 2.0, "delta": 0.0}
    assert not any(r["exhausted"] for r in rows.values())


def test_a_policy_that_lowered_a_limit_below_the_spend_shows_over_limit() -> None:
    acc = _spent()
    lowered = parse_policy(POLICY.replace("epsilon = 1.0", "epsilon = 0.5"), "toml")
    rows = {r["account"]: r for r in budget_rows(acc.ledger, lowered)}
    assert rows["dataset:adult"]["over_limit"] and "OVER LIMIT" in rows["dataset:adult"]["note"]
    assert rows["dataset:adult"]["limit"] == {"epsilon": 0.5, "delta": 0.0}
    assert not rows["dataset:census"]["over_limit"] and rows["dataset:census"]["new_dataset"]
    assert "OVER LIMIT" in budget_table(acc.ledger, lowered)


def test_negative_control_the_recorded_limit_alone_shows_no_account_over() -> None:
    """Without the policy, the recorded limit (2.0) is not exceeded: only the policy's view shows
    the lowered limit, so the test above reads the policy, not the ledger."""
    rows = budget_rows(_spent().ledger)
    assert all("over_limit" not in r for r in rows)
    assert "OVER LIMIT" not in budget_table(_spent().ledger)


def test_an_empty_ledger_says_so() -> None:
    assert budget_table(Accountant(Budget(1.0)).ledger) == "  (no releases recorded)"


# ------------------------------------------------------------------------------------------------
# ``dpbudget status`` reads the accounts table, not the records (issue 32), and checks the states
# it reports (``dpbudget.accountant.audit.status``).
#
# The figure: status read every record (to count releases by noise kind), 8.6 s of CPU at
# 10^6 records. Here the records status reads are counted at the row level (every stored record
# read passes through ``sql._entry``): the same for 30 records as for 300.
# ------------------------------------------------------------------------------------------------

KEY = "a key for the status tests"


def _ledger(tmp_path: Path, n: int, name: str = "l.db") -> Path:
    path = tmp_path / name
    with Accountant(Budget(100.0), ledger=f"sqlite:///{path}") as acc:
        for i in range(n):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset=f"d{i % 3}")
    return path


def _status(*argv: str) -> tuple[int, str, str]:
    return run_cli("status", *argv)


def _records_read(monkeypatch: pytest.MonkeyPatch, path: Path) -> int:
    """How many stored records ``dpbudget status`` (text and --json) reads."""
    count = [0]
    real = sql._entry

    def counting(*args: Any) -> Any:
        count[0] += 1
        return real(*args)

    with monkeypatch.context() as m:
        m.setattr(sql, "_entry", counting)
        assert _status(str(path))[0] == 0
        assert _status("--json", str(path))[0] == 0
    return count[0]


def test_status_reads_as_many_records_for_300_as_for_30(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    small = _records_read(monkeypatch, _ledger(tmp_path, 30, "small.db"))
    large = _records_read(monkeypatch, _ledger(tmp_path, 300, "large.db"))
    # Per run: the record each of the 4 rows (3 datasets, the policy pointer) names, the
    # first record (three times: keyed? simulation? the identity printed), the policy
    # document's record, the head: 9.
    assert small == large <= 2 * 9


def test_negative_control_the_old_noise_count_reads_every_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Status as it was: it also counted the releases by noise kind, reading every record."""
    real = status.budget_rows

    def with_the_old_count(ledger: Any, *args: Any) -> Any:
        for entry in ledger.entries():  # (what ``text.noise_counts`` did)
            entry.record.get("noise")
        return real(ledger, *args)

    monkeypatch.setattr(status, "budget_rows", with_the_old_count)
    small = _records_read(monkeypatch, _ledger(tmp_path, 30, "small.db"))
    large = _records_read(monkeypatch, _ledger(tmp_path, 300, "large.db"))
    assert large - small >= 2 * 270  # each run reads every record (at least once)


def test_status_leaves_the_noise_count_to_the_audit(tmp_path: Path) -> None:
    path = _ledger(tmp_path, 3)
    rc, out, _ = _status(str(path))
    assert rc == 0 and "`dpbudget audit` counts the releases made without exact noise" in out
    rc, out, _ = _status("--json", str(path))
    assert rc == 0 and "noise" not in json.loads(out)


def _edit_state(path: Path, key: str, state: str, seq: int | None = None) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE accounts SET state = ?, seq = coalesce(?, seq) WHERE key = ?",
                     (state, seq, key))
        conn.commit()


def test_a_state_edited_by_hand_is_refused_not_reported(tmp_path: Path) -> None:
    path = _ledger(tmp_path, 6)
    rc, out, _ = _status(str(path))
    assert rc == 0 and "running states checked against the records" in out
    _edit_state(path, "dataset:d0", '{"delta":0.0,"epsilon":0.0}')  # budget back
    rc, out, err = _status(str(path))
    assert rc == 2 and out == ""
    assert err.startswith("dpbudget status: dataset:d0: its stored running state is not")


def test_negative_control_without_the_check_status_reports_the_edited_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status, "check_states", lambda ledger: "")
    path = _ledger(tmp_path, 6)
    _edit_state(path, "dataset:d0", '{"delta":0.0,"epsilon":0.0}')
    rc, out, _ = _status("--json", str(path))
    spent = {r["account"]: r["spent"]["epsilon"] for r in json.loads(out)["accounts"]}
    assert rc == 0 and spent["dataset:d0"] == 0.0  # the budget handed back, shown as true


def test_a_keyed_ledger_rewound_is_left_to_the_audit_and_unchecked_without_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row set back to the state an older record wrote is consistent with that record: status,
    which reads rows and not records, cannot see it (no table commitment: whoever can write the
    rows can also put back a whole older copy, which nothing but ``audit --expect-head`` sees;
    docs/threat-model.md). The audit, which replays the records, reports it."""
    path = tmp_path / "keyed.db"
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    with Accountant(Budget(100.0), ledger=f"sqlite:///{path}") as acc:
        for _ in range(3):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="d")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        record = json.loads(conn.execute("SELECT record FROM entries WHERE seq = 3").fetchone()[0])
    _edit_state(path, "dataset:d", json.dumps(record["accounts"]["dataset:d"]["state"]), 3)
    assert cli.main(["audit", str(path)]) != 0
    monkeypatch.delenv("DPBUDGET_LEDGER_KEY")  # (the stored policy cannot be read: a file's)
    policy = tmp_path / "policy.toml"
    policy.write_text("[datasets.d]\nlimit = { epsilon = 100 }\n", encoding="utf-8")
    rc, out, _ = _status(str(path), "--policy", str(policy))
    assert rc == 0 and "running states NOT checked: the ledger is keyed and no key" in out
