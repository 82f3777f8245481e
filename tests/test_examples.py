"""The examples run end to end as scripts and spend exactly what they declare."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("script, expected", [
    ("auto_avg.py", "spent: Budget(epsilon=1.0, delta=0.0)"),
    ("range_query_svt.py", "spent Budget(epsilon=1.0, delta=0.0)"),
    ("custom_mechanism.py", "spent: Budget(epsilon=0.5, delta=0.0)"),
    ("course_workloads.py", "spent: ε = 3.0000, δ = 1e-06 of the limit (3, 1e-05)"),
])
def test_example_runs(script, expected, capsys):
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    out = capsys.readouterr().out
    assert expected in out


def test_averages_experiment_runs_fast_and_plots(tmp_path: Path, capsys) -> None:
    """At fast settings: every private variant is charged exactly ε per run (the script checks
    its ledger), the table and the figure are produced."""
    module = runpy.run_path(str(EXAMPLES / "averages_experiment.py"))
    figure = tmp_path / "averages.png"
    module["main"](["--trials", "8", "--plot", str(figure)])
    out = capsys.readouterr().out
    assert "| sum/count, centred |" in out and "At ε = 0.01 the smallest error is" in out
    assert figure.stat().st_size > 10_000


@pytest.mark.parametrize("engine", ["pandas", "polars", "duckdb"])
def test_events_report_runs_the_five_queries_per_person(engine: str, capsys) -> None:
    """The issue's five queries, each at ε = 1 per person, on every engine: ε = 5 spent."""
    module = runpy.run_path(str(EXAMPLES / "events_report.py"))
    answers = module["main"](["--persons", "3000", "--engine", engine])
    out = capsys.readouterr().out
    assert len(answers) == 5 and "spent: ε = 5.0000 per person, δ = 1e-06" in out


def _two_jobs(argv: list[str], capsys) -> None:
    """The Spark example run with ``argv``: five released in all, the other five refused, the
    audit clean and showing both jobs' releases."""
    from dpbudget.examples import spark_events
    outcome = spark_events.main(["--persons", "500", *argv])
    out = capsys.readouterr().out
    said = [w for job in outcome.values() for w in job.values()]
    assert sorted(outcome) == ["job-1", "job-2"] and len(said) == 10
    assert said.count("released") == 5 and said.count("refused") == 5
    assert "spent ε = 5.0000 of 5.0 per person" in out and "audit exit status: 0" in out
    assert "5 releases" in out
    for job, what in outcome.items():  # (both, unless one job took all five first)
        assert ("released" in what.values()) == (f"{job} Q" in out)


@pytest.mark.slow
def test_spark_events_two_jobs_share_one_budget(spark, capsys) -> None:
    """Two processes, each its own SparkSession, run the five queries at ε = 1 against one
    SQLite ledger limited to ε = 5: five released in all, the other five refused (nothing
    debited), and the audit verifies the ledger and shows both jobs' releases."""
    _two_jobs([], capsys)


@pytest.mark.slow
def test_spark_events_two_jobs_share_one_postgresql_budget(spark, postgres_database,
                                                            capsys) -> None:
    """The same two jobs on a shared PostgreSQL ledger (``--ledger postgresql://...``, a fresh
    schema of the tests' server): the same outcome, and the ledger's records are in PostgreSQL
    (the five releases, each per person)."""
    from dpbudget.accountant.ledger.postgres import PostgresLedger
    from tests.conftest import _fresh_schema
    dsn = _fresh_schema(postgres_database)
    _two_jobs(["--ledger", dsn], capsys)
    ledger = PostgresLedger(dsn)
    try:
        records = [entry.record for entry in ledger.entries()]
    finally:
        ledger.close()
    assert sum(r.get("unit") == "person_id" for r in records) == 5  # (the five releases)
