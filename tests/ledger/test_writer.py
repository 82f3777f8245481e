"""Who wrote a record (``accountant.ledger.writer``): one writer per process and durable ledger,
shared by every ledger object the process opens on it, with one count of records; a forked child
and every in-memory ledger are writers of their own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpbudget.accountant.ledger import writer as writer_module
from dpbudget.accountant.ledger.sqlite import SqliteLedger
from dpbudget.accountant.ledger.writer import writer_for
from tests.contracts import LedgerContract


def test_ledger_objects_of_one_process_on_one_file_count_as_one_writer(tmp_path: Path) -> None:
    """Records written through two objects on one file, interleaved, name one writer and
    count 1, 2, 3, 4: the process's log can be audited alone as a subsequence of the chain."""
    a, b = SqliteLedger(tmp_path / "l.db"), SqliteLedger(tmp_path / "l.db")
    try:
        for ledger in (a, b, a, b):
            LedgerContract._append(ledger, 1)
        members = [e.record["writer"] for e in a.entries()]
    finally:
        a.close()
        b.close()
    assert len({m["id"] for m in members}) == 1
    assert [m["n"] for m in members] == [1, 2, 3, 4]


def test_a_writer_is_per_ledger_and_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same key gives the same writer, another key another one, no key a fresh one each time;
    in another process (its pid) the same key gives a new writer, so a forked child never
    continues its parent's count. The negative control: the pid unchanged, the writer is kept."""
    key = "sqlite:///writer-test-ledger"
    first = writer_for(key)
    assert writer_for(key) is first and writer_for(key + "-other") is not first
    assert writer_for(None) is not writer_for(None)
    other = os.getpid() + 1
    monkeypatch.setattr(writer_module.os, "getpid", lambda: other)
    child = writer_for(key)
    assert child is not first and child.id != first.id
    assert writer_for(key) is child  # (the control: same process, same writer)
