"""Records dated after the audit's clock are flagged (issue 28 review).

An SQLite ledger's time is the writing process's wall clock. The review patched ``time.time_ns``
in the caller's process to move a day per release and got ε = 365 in 0.16 s under a limit of
ε = 1 a day; every record was in its own day's window, times never ran backwards, and the audit
exited 0. The patch cannot be prevented in-process, but its records lie in the future: the audit
now reports them (kind ``time``, exit bit 1), once per run with their count. Clocks here are set
relative to the real one, so the tests do not depend on what the wall clock reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant import Accountant
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.findings import EXIT_BITS
from dpbudget.accountant.audit.times import TimeCheck
from dpbudget.mechanisms import Laplace
from dpbudget.policies.policy import Policy
from tests.support import set_ledger_clock

DAY = 86_400.0
DAILY = Policy.model_validate({"datasets": {"adult": {"limit": {"epsilon": 1.0}, "period": "1d"}}})


def _releases(url: str, n: int) -> float:
    """``n`` releases of ε = 1 on the daily dataset; the ε obtained."""
    got = 0.0
    with Accountant.open(url) as acc:
        for _ in range(n):
            acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
            receipt = acc.last_receipt
            assert receipt is not None
            got += receipt.cost.epsilon
    return got


def _future(report: Any) -> list[str]:
    return [p.message for p in report.problems if p.kind == "time" and "dated" in p.message]


def test_a_clock_pushed_a_day_per_release_is_flagged_once_with_the_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Accountant.from_policy(DAILY, ledger=url).close()  # the policy record: the real clock
    start = time.time()
    released = [0]

    def pushed() -> float:  # the review's patch: a day further at each read after a release
        return start + released[0] * DAY

    set_ledger_clock(pushed, monkeypatch)
    with Accountant.open(url) as acc:
        for _ in range(30):  # ε = 30 in 30 releases under ε = 1 a day: each one admitted
            acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="adult")
            released[0] += 1
    monkeypatch.undo()  # (the audit's clock is its own anyway: dpbudget.accountant.audit.times.time)
    report = audit(url)
    assert report.exit_status & EXIT_BITS["time"]
    (flagged,) = _future(report)  # one problem, not one per record
    assert flagged.startswith("29 record(s) are dated more than 1 hour(s) after")
    assert report.problem_count == 1, report.problems  # the windows and order check out
    # Negative control: the audit as it was (no such check) passes the attack.
    monkeypatch.setattr(TimeCheck, "finish", lambda self: None)
    assert audit(url).ok


def test_a_ledger_written_a_year_ahead_is_flagged_and_an_honest_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    honest, ahead = f"sqlite:///{tmp_path / 'honest.db'}", f"sqlite:///{tmp_path / 'ahead.db'}"
    for url in (honest, ahead):
        Accountant.from_policy(DAILY, ledger=url).close()
    assert _releases(honest, 1) == 1.0
    year = time.time() + 365 * DAY
    set_ledger_clock(lambda: year, monkeypatch)
    assert _releases(ahead, 1) == 1.0
    monkeypatch.undo()
    assert audit(honest).ok  # negative control: the same release at the real time
    report = audit(ahead)
    assert report.exit_status == EXIT_BITS["time"]
    (flagged,) = _future(report)
    assert flagged.startswith("1 record(s)") and "the first record 2 at" in flagged
