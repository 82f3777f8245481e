"""Refused requests are logged for security review (``dpbudget.accountant.gate.refusals``), never
counted as spend, and print nothing where logging is not configured."""

from __future__ import annotations

import json
import logging

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.values.errors import BudgetExceededError
from dpbudget.accountant.audit.logs import LOGGER_NAME, log_records_to
from dpbudget.accountant.gate.refusals import REFUSAL_LOGGER
from dpbudget.mechanisms import Laplace

CANARY = 7_351_911.25  # a "true value": must never appear in a log line


def test_refused_requests_are_logged_for_review_and_are_not_spend(tmp_path, caplog, capsys):
    path = tmp_path / "log.jsonl"
    handler = log_records_to(path)
    try:
        acc = Accountant(Budget(0.15))
        acc.release(Laplace(0.1, sensitivity=1.0), CANARY, dataset="people", analyst="alice", label="count")
        with caplog.at_level(logging.WARNING, logger=REFUSAL_LOGGER):
            with pytest.raises(BudgetExceededError):
                acc.release(Laplace(0.1, sensitivity=1.0), CANARY, dataset="people", analyst="alice",
                            label="count again")
            with pytest.raises(BudgetExceededError):
                with acc.pipeline("p", dataset="people", analyst="bob", budget=Budget(1.0)):
                    pass
    finally:
        handler.close()
        logging.getLogger(LOGGER_NAME).removeHandler(handler)
    text = path.read_text()
    refused = [json.loads(line)["refused"] for line in text.splitlines() if '"refused"' in line]
    assert [(r["analyst"], r["dataset"], r["reason"]) for r in refused] == [
        ("alice", "people", "BudgetExceededError"), ("bob", "people", "BudgetExceededError")]
    assert refused[0]["cost"] == {"epsilon": 0.1, "delta": 0.0}
    assert refused[0]["refused_by"] == "dataset:people" and refused[0]["label"] == "count again"
    assert str(CANARY) not in text and str(CANARY) not in caplog.text
    assert [r.dpbudget_refusal["analyst"] for r in caplog.records
            if r.name == REFUSAL_LOGGER] == ["alice", "bob"]
    report = audit(str(path))
    assert report.ok and report.records == 1  # the one release; refusals are not records
    assert report.refused == {"alice": 1, "bob": 1}
    assert report.by_analyst["alice"].releases == 1
    capsys.readouterr()
    assert cli(["audit", str(path)]) == 0
    assert "refused requests in the log (not spend; for review): 2 (alice 1, bob 1)" in \
        capsys.readouterr().out


def test_a_refusal_prints_nothing_when_logging_is_not_configured(capsys):
    acc = Accountant(Budget(0.05), rng=0)
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="d")
    assert capsys.readouterr().err == ""
