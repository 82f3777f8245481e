"""A ledger's two kinds of row (``accountant.ledger.entry``): an account's running state and a
committed record, read back as they were written."""

from __future__ import annotations

import json
from pathlib import Path

from dpbudget.accountant.ledger.entry import Account, Entry
from dpbudget.accountant.ledger.record import record_hash
from dpbudget.accountant.ledger.sqlite import SqliteLedger
from tests.contracts import LedgerContract


def test_rows_read_back_are_the_rows_written(tmp_path: Path) -> None:
    """A record reopened from disk is the ``Entry`` its append returned (seq, canonical text, hash
    of that text), and each account row names the record that last wrote it."""
    ledger = SqliteLedger(tmp_path / "l.db")
    written = LedgerContract._append(ledger, 3)
    ledger.close()
    reopened = SqliteLedger(tmp_path / "l.db")
    try:
        assert list(reopened.entries()) == written
        assert all(isinstance(e, Entry) and e.hash == record_hash(e.text, None) for e in written)
        (account,) = reopened.accounts()
        assert isinstance(account, Account) and account.key == "dataset:a"
        assert account.seq == written[-1].seq and account.state == {"epsilon": 0.75, "delta": 0.0}
    finally:
        reopened.close()


def test_an_entrys_record_is_a_fresh_parse_of_its_text() -> None:
    """``Entry.record`` parses the stored text each time: a caller that edits what it got back
    changes neither the entry nor what the next reader sees (the negative control: the edited
    dict itself does hold the edit)."""
    entry = Entry(1, '{"kind":"release","seq":"1"}', "0" * 64)
    got = entry.record
    got["kind"] = "refund"
    assert got["kind"] == "refund"
    assert entry.record == {"kind": "release", "seq": "1"} == json.loads(entry.text)
