"""Name twins ("people", "People", "peo-ple": one table, one budget) are refused on a dataset's
first release by an index of folded names, not by listing and folding every account: the first
release on a new dataset reads only the accounts created since the gate last looked
(``Ledger.created_since``), the same at 10 datasets as at 300, and still sees a twin another
process created after this one opened the ledger."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.values.errors import InvalidArgumentError
from dpbudget.accountant.ledger import MemoryLedger, SqliteLedger
from dpbudget.accountant.ledger.base import Ledger
from dpbudget.mechanisms import Laplace
from tests.support import snapshot

ROOT = Path(__file__).resolve().parents[2]


def _ledger(kind: str, tmp_path: Path) -> Ledger:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return MemoryLedger() if kind == "memory" else SqliteLedger(tmp_path / "l.db")


def _keys_read_by_a_first_release(ledger: Ledger, existing: int, monkeypatch,
                                  listing: bool = False) -> list[int]:
    """How many account keys the first release on a new dataset reads, after ``existing``
    datasets were charged through the same accountant (which must never list all accounts)."""
    acc = Accountant(Budget(1.0), ledger=ledger, rng=0, simulation=True)
    for i in range(existing):
        acc.release(Laplace(0.001, sensitivity=1.0), 1.0, dataset=f"d{i}")
    reads: list[int] = []
    since = ledger.created_since

    def counted(mark=None):
        mark, keys = since(mark)
        reads.append(len(keys))
        return mark, keys

    monkeypatch.setattr(ledger, "created_since", counted)
    if not listing:
        monkeypatch.setattr(ledger, "accounts", lambda: pytest.fail("every account was listed"))
    acc.release(Laplace(0.001, sensitivity=1.0), 1.0, dataset="fresh")
    monkeypatch.undo()
    acc.close()
    return reads


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_first_release_reads_the_same_at_10_and_at_300_datasets(kind, tmp_path, monkeypatch):
    small = _keys_read_by_a_first_release(_ledger(kind, tmp_path / "a"), 10, monkeypatch)
    large = _keys_read_by_a_first_release(_ledger(kind, tmp_path / "b"), 300, monkeypatch)
    assert small == large == [1]  # the account the previous first release created


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_negative_control_reading_every_key_grows_with_the_datasets(kind, tmp_path,
                                                                      monkeypatch):
    """The old scan (every account, every time) reads more keys at 300 datasets than at 10:
    the test above sees the difference."""
    monkeypatch.setattr(MemoryLedger, "created_since", Ledger.created_since)
    monkeypatch.setattr(SqliteLedger, "created_since", Ledger.created_since)
    small = _keys_read_by_a_first_release(_ledger(kind, tmp_path / "a"), 10, monkeypatch, True)
    monkeypatch.setattr(MemoryLedger, "created_since", Ledger.created_since)
    monkeypatch.setattr(SqliteLedger, "created_since", Ledger.created_since)
    large = _keys_read_by_a_first_release(_ledger(kind, tmp_path / "b"), 300, monkeypatch, True)
    assert small[0] >= 10 and large[0] == small[0] + 290


def _release_elsewhere(url: str, dataset: str) -> None:
    """One release by another process (a fresh interpreter) on the ledger at ``url``."""
    code = ("import sys; from dpbudget.accountant import Accountant; from dpbudget.mechanisms import Laplace\n"
            "acc = Accountant.open(sys.argv[1], rng=0, simulation=True)\n"
            "acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=sys.argv[2]); acc.close()\n")
    subprocess.run([sys.executable, "-c", code, url, dataset], check=True, cwd=ROOT,
                   timeout=120)


def _twin_after_another_process(tmp_path: Path) -> tuple[Accountant, np.random.Generator]:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    rng = np.random.default_rng(31)
    acc = Accountant(Budget(1.0), ledger=url, rng=rng, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="alpha")  # this gate has read the ledger's accounts
    _release_elsewhere(url, "People")  # then another process opens a budget for "People"
    return acc, rng


def test_a_twin_created_by_another_process_is_refused(tmp_path):
    acc, rng = _twin_after_another_process(tmp_path)
    before = snapshot(acc.ledger, rng)
    with pytest.raises(InvalidArgumentError, match="variant") as refused:
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="people")  # a second budget for one table
    assert "'People'" in str(refused.value)
    assert snapshot(acc.ledger, rng) == before  # nothing drawn, nothing debited
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="People")  # the table's one budget still answers
    acc.close()


def test_negative_control_an_index_never_refreshed_admits_the_twin(tmp_path, monkeypatch):
    """An index built once and never brought up to date (no accounts created since, ever)
    misses "People": the twin gets a budget of its own, which the test above refuses."""
    acc, _ = _twin_after_another_process(tmp_path)
    monkeypatch.setattr(acc.ledger, "created_since", lambda mark=None: (mark, []))
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="people")
    keys = [a.key for a in acc.ledger.accounts()]
    assert "dataset:people" in keys and "dataset:People" in keys
    acc.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_created_since_gives_each_new_key_once_in_order(kind, tmp_path):
    ledger = _ledger(kind, tmp_path)
    acc = Accountant(Budget(1.0), ledger=ledger, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    mark, first = ledger.created_since()
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="b")
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    mark, new = ledger.created_since(mark)
    assert "dataset:a" in first and new == ["dataset:b"]
    assert ledger.created_since(mark)[1] == []
    acc.close()


def test_sqlite_rows_renumbered_behind_the_mark_are_read_again(tmp_path):
    """A VACUUM after a row was deleted by hand renumbers rows: the key at the mark's rowid
    changes, and every key is read again rather than some missed."""
    import sqlite3

    ledger = SqliteLedger(tmp_path / "l.db")
    acc = Accountant(Budget(1.0), ledger=ledger, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="a")
    mark, keys = ledger.created_since()
    acc.close()
    with sqlite3.connect(tmp_path / "l.db") as raw:
        raw.execute("UPDATE accounts SET rowid = -rowid")
    again = SqliteLedger(tmp_path / "l.db")
    assert sorted(again.created_since(mark)[1]) == sorted(keys)
    again.close()
