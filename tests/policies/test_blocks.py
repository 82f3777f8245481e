"""Per-block budgets (issue 15): each block of a growing dataset has its own lifetime limit; a
release is charged to every block it reads, all or none; blocks that do not exist are refused."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from dpbudget.accountant import (
    Accountant,
    Budget,
    BudgetExceededError,
    InvalidArgumentError,
    LedgerConflictError,
    PolicyError,
)
from dpbudget.accountant.audit.run import audit
from dpbudget.mechanisms import AboveThreshold, Laplace, SubsampledGaussian
from dpbudget.policies.blocks import Blocks, block_names, block_of, block_start
from tests.policies.conftest import DAY, T0
from tests.support import OWNER, set_ledger_clock, snapshot

# T0 is 2026-11-21 10:00 UTC.
DAILY = """
    [datasets.events]
    limit = { epsilon = 100.0 }
    [datasets.events.blocks]
    by = "day"
    first = "2026-11-15"
    limit = { epsilon = 1.0 }
    [datasets.events.analysts.alice]
    limit = { epsilon = 2.0 }
"""


def test_a_release_is_charged_to_every_block_it_reads(make) -> None:
    acc = make(DAILY)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="events", blocks=slice("2026-11-19", "2026-11-21"))
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks=["2026-11-21", "2026-11-16"])
    spent = {b: acc.spent("events", block=b).epsilon
             for b in ("2026-11-16", "2026-11-19", "2026-11-20", "2026-11-21", "2026-11-18")}
    assert spent == {"2026-11-16": 0.25, "2026-11-19": 0.5, "2026-11-20": 0.5,
                     "2026-11-21": 0.75, "2026-11-18": 0.0}
    assert acc.spent("events") == Budget(0.75)  # the dataset's own limit, charged once per release


def test_an_exhausted_block_refuses_the_whole_release_and_nothing_moves(make) -> None:
    acc = make(DAILY)
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    before = snapshot(acc.ledger)
    with pytest.raises(BudgetExceededError) as info:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events",
                    blocks=slice("2026-11-18", "2026-11-21"))
    assert info.value.account == "dataset:events/block:2026-11-20"
    assert snapshot(acc.ledger) == before  # no other block was charged either
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-21")  # a fresh block


def test_blocks_that_do_not_exist_are_refused(make, clock) -> None:
    acc = make(DAILY)
    with pytest.raises(InvalidArgumentError, match="begun"):  # tomorrow: no data yet
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-22")
    with pytest.raises(InvalidArgumentError, match="first block"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-14")
    with pytest.raises(InvalidArgumentError, match="real day"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events", blocks="2026-02-30")
    with pytest.raises(InvalidArgumentError, match="blocks the data came from"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events")
    with pytest.raises(InvalidArgumentError, match="each block named once"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events", blocks=["2026-11-20", "2026-11-20"])
    with pytest.raises(InvalidArgumentError, match="not before its first"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="events",
                    blocks=slice("2026-11-20", "2026-11-19"))
    assert acc.spent("events") == Budget(0.0)
    clock.now += DAY  # the 22nd has begun: its block exists now, with a fresh budget
    acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-22")


def test_analyst_and_dataset_quotas_apply_as_well(make) -> None:
    acc = make(DAILY)
    for day in ("2026-11-18", "2026-11-19"):
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0, dataset="events", analyst="alice", blocks=day)
    with pytest.raises(BudgetExceededError) as info:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="events", analyst="alice", blocks="2026-11-20")
    assert info.value.account == "dataset:events/analyst:alice"


def test_sessions_pipelines_and_batches_name_blocks(make) -> None:
    acc = make(DAILY)
    with acc.session(AboveThreshold(0.3, threshold=10.0, sensitivity=1.0), dataset="events", blocks="2026-11-17") as svt:
        svt.test(1.0)
    with acc.pipeline("p", dataset="events", budget=Budget(0.4), blocks="2026-11-17") as p:
        p.release(Laplace(0.2, sensitivity=1.0), 1.0)
    acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Laplace(0.1, sensitivity=1.0), 2.0)], dataset="events",
                     blocks="2026-11-17")
    assert acc.spent("events", block="2026-11-17").epsilon == pytest.approx(0.9)
    assert acc.max_releases(Laplace(0.1, sensitivity=1.0), dataset="events", blocks="2026-11-17") == 1
    assert not acc.can_afford(Laplace(0.2, sensitivity=1.0), dataset="events", blocks="2026-11-17")


def test_named_blocks_and_other_rules(make) -> None:
    acc = make("""
        [datasets.cohorts]
        [datasets.cohorts.blocks]
        names = ["2019", "2020", "2021"]
        composition = "renyi"
        limit = { epsilon = 3.0, delta = 1e-5 }
    """)
    rows = np.ones((50, 2))
    n = acc.max_releases(SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0), dataset="cohorts", blocks="2019")
    assert n > 1000
    acc.release(SubsampledGaussian(1.0, sampling_rate=0.01, sensitivity=1.0), rows, dataset="cohorts", blocks=["2019", "2021"])
    with pytest.raises(InvalidArgumentError, match="declared blocks"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="cohorts", blocks="2022")
    with pytest.raises(InvalidArgumentError, match="range of time blocks"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="cohorts", blocks=slice("2019", "2021"))


def test_malformed_block_policies_name_the_key(write) -> None:
    for text, where in [
        ('[datasets.e.blocks]\nby = "month"\nlimit = { epsilon = 1.0 }\n', "datasets.e.blocks"),
        ('[datasets.e.blocks]\nlimit = { epsilon = 1.0 }\n', "datasets.e.blocks"),
        ('[datasets.e.blocks]\nby = "day"\nnames = ["a"]\nlimit = { epsilon = 1.0 }\n',
         "datasets.e.blocks"),
        ('[datasets.e.blocks]\nnames = ["a/b"]\nlimit = { epsilon = 1.0 }\n', "datasets.e"),
        ('[datasets.e.blocks]\nby = "day"\ncomposition = "optimal"\nlimit = { epsilon = 1.0 }\n',
         "datasets.e.blocks"),
    ]:
        with pytest.raises(PolicyError, match=where.replace(".", r"\.")):
            Accountant.from_policy(write(text))


def test_a_join_or_a_dataset_without_blocks_cannot_name_them(make) -> None:
    acc = make(DAILY + '\n[datasets.plain]\nlimit = { epsilon = 1.0 }\n')
    with pytest.raises(InvalidArgumentError, match="not divided into blocks"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="plain", blocks="2026-11-20")
    with pytest.raises(InvalidArgumentError, match="join"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=("events", "plain"), blocks="2026-11-20")


def test_changing_the_division_under_a_ledger_is_flagged(write, tmp_path, clock,
                                                         ledger_clock) -> None:
    db = tmp_path / "l.db"
    acc = Accountant.from_policy(write(DAILY), ledger=db, rng=0, simulation=True,
                                 owner_key=OWNER)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    weekly = DAILY.replace('by = "day"', 'by = "week"').replace('first = "2026-11-15"\n', '')
    change = acc.apply_policy(write(weekly), by="admin", reason="test", owner_key=OWNER)
    assert any("blocks.by" in r for r in change.raised)
    acc.close()


def test_audit_replays_block_charges_and_catches_a_missing_one(write, tmp_path, clock,
                                                                ledger_clock) -> None:
    db = tmp_path / "l.db"
    with Accountant.from_policy(write(DAILY), ledger=db, rng=0, simulation=True) as acc:
        for day in range(15, 22):
            acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="events",
                        blocks=slice(f"2026-11-{day - 2 if day > 16 else 15}", f"2026-11-{day}"))
    report = audit(f"sqlite:///{db}")
    assert report.ok, report.problems
    blocks = [a for a in report.accounts if "/block:" in a.account]
    assert len(blocks) == 7 and all(not a.over_limit for a in blocks)


def test_time_block_names_round_trip() -> None:
    for by in ("hour", "day", "week"):
        for t in (T0, T0 + 12345.6, 1_704_067_200.0):  # 2024-01-01 is a Monday
            name = block_of(t, by)
            start = block_start(name, by)
            assert start <= t < start + {"hour": 3600, "day": DAY, "week": 7 * DAY}[by]
            assert block_of(start, by) == name
    spec = Blocks(by="week", limit=Budget(1.0))
    assert block_names(spec, slice("2026-W01", "2026-W03")) == ("2026-W01", "2026-W02",
                                                                 "2026-W03")
    assert block_names(spec, slice("2025-W52", "2026-W01")) == ("2025-W52", "2026-W01")


def test_block_rows_selects_exactly_the_rows_of_the_blocks(make) -> None:
    pd = pytest.importorskip("pandas")
    acc = make(DAILY)
    times = T0 - np.arange(0, 10 * DAY, 3600.0)  # hourly events over ten days
    frame = pd.DataFrame({"t": pd.to_datetime(times, unit="s", utc=True), "x": 1.0})
    rows = acc.block_rows("events", frame, "t", slice("2026-11-19", "2026-11-20"))
    assert len(rows) == 48
    assert set(rows["t"].dt.strftime("%Y-%m-%d")) == {"2026-11-19", "2026-11-20"}
    seconds = frame.assign(t=times)  # numbers of seconds work too
    assert len(acc.block_rows("events", seconds, "t", "2026-11-19")) == 24
    with pytest.raises(InvalidArgumentError, match="'column'"):
        acc.block_rows("events", frame, "missing", "2026-11-19")


def _hammer(db: str, policy: str, seed: int, counts: "multiprocessing.Queue[int]") -> None:
    set_ledger_clock(lambda: T0)  # (this process's SQLite ledgers: a spawned one's own)
    acc = Accountant.from_policy(policy, ledger=db)
    rng = np.random.default_rng(seed)
    n = 0
    for _ in range(60):
        first = int(rng.integers(15, 21))
        last = int(rng.integers(first, 22))
        try:
            acc.release(Laplace(0.05, sensitivity=1.0), 1.0, dataset="events",
                        blocks=slice(f"2026-11-{first}", f"2026-11-{last}"))
            n += 1
        except BudgetExceededError:
            pass
    acc.close()
    counts.put(n)


def _contend(db: str, policy: str) -> None:
    """Four processes, random overlapping ranges of the 15th..21st, ε = 0.05 each: no block may
    end above its limit of 1, and the audit must replay clean."""
    Accountant.from_policy(policy, ledger=db).close()
    ctx = multiprocessing.get_context("spawn")
    counts: "multiprocessing.Queue[int]" = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(db, policy, seed, counts)) for seed in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert sum(counts.get(timeout=5) for _ in procs) > 0
    report = audit(db)
    assert report.ok, report.problems
    blocks = [a for a in report.accounts if "/block:" in a.account]
    assert blocks and all(a.spent["epsilon"] <= 1.0 + 1e-9 for a in blocks)
    assert max(a.spent["epsilon"] for a in blocks) > 0.9  # the blocks were really contended


@pytest.mark.slow
def test_processes_on_overlapping_ranges_never_overspend_a_block(write, tmp_path) -> None:
    _contend(f"sqlite:///{tmp_path / 'l.db'}",
             str(write(DAILY.replace("epsilon = 2.0", "epsilon = 100.0"))))


@pytest.mark.postgres
@pytest.mark.slow
def test_processes_never_overspend_a_block_on_postgres(write, postgres_database) -> None:
    from tests.conftest import _fresh_schema

    _contend(_fresh_schema(postgres_database),
             str(write(DAILY.replace("epsilon = 2.0", "epsilon = 100.0"))))


def test_the_example_runs(capsys) -> None:
    import runpy

    path = Path(__file__).resolve().parents[2] / "examples" / "growing_data.py"
    totals = runpy.run_path(str(path))["main"]([])
    assert totals["lifetime"] < totals["blocks"] < totals["period"]
    assert "audit of the blocks ledger: clean" in capsys.readouterr().out


def test_conflicting_rule_for_a_block_is_refused(write, tmp_path, clock, ledger_clock) -> None:
    db = tmp_path / "l.db"
    with Accountant.from_policy(write(DAILY), ledger=db, rng=0, simulation=True) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    renyi = DAILY.replace('limit = { epsilon = 1.0 }',
                          'composition = "advanced"\nlimit = { epsilon = 1.0, delta = 1e-6 }')
    with pytest.raises(LedgerConflictError, match="block:2026-11-20 cannot continue"):
        Accountant.from_policy(write(renyi), ledger=db, rng=0, simulation=True)


def test_an_unlocking_schedule_releases_a_block_gradually(make, clock) -> None:
    acc = make("""
        [datasets.events]
        [datasets.events.blocks]
        by = "day"
        limit = { epsilon = 1.0 }
        unlock = { every = "1d", fraction = 0.25 }
    """)
    clock.now = block_start("2026-11-20", "day") + 3600  # an hour into the 20th: 25% unlocked
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    with pytest.raises(BudgetExceededError, match="unlocked 25%"):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    clock.now += 2 * DAY  # 75% unlocked
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    clock.now += 30 * DAY  # all of it, never more
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")
    with pytest.raises(BudgetExceededError):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset="events", blocks="2026-11-20")


def test_unlocking_needs_time_blocks(write) -> None:
    text = ('[datasets.e.blocks]\nnames = ["a"]\nlimit = { epsilon = 1.0 }\n'
            'unlock = { every = "1d", fraction = 0.5 }\n')
    with pytest.raises(PolicyError, match="unlock"):
        Accountant.from_policy(write(text))
    with pytest.raises(PolicyError, match="every"):
        Accountant.from_policy(write(text.replace('names = ["a"]', 'by = "day"')
                                     .replace('"1d"', '"1 day"')))
