"""A ledger's two kinds of row (``accountant.ledger.entry``): an account's running state and a
committed record, read back as they were written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dpbudget.accountant.values.errors import LedgerCorruptedError
from dpbudget.accountant.ledger.entry import Account, Entry, account_row, parse_config
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


def test_an_account_row_is_parsed_from_its_columns() -> None:
    """Either backend's row: the configuration and state parsed, each state component a float
    (PostgreSQL's server writes an integral state as an integer: it reads back as the float)."""
    row = account_row(("dataset:a", "renyi", '{"rule":"renyi","order":8}', '{"rdp":1.5}', 3))
    assert row == Account("dataset:a", "renyi", {"rule": "renyi", "order": 8}, {"rdp": 1.5}, 3)
    state = account_row(("dataset:a", "basic", "{}", '{"epsilon":2,"delta":0}', 1)).state
    assert state == {"epsilon": 2.0, "delta": 0.0}
    assert all(type(v) is float for v in state.values())


_DAMAGED = [(None, "basic", "{}", "{}", 1), ("k", 7, "{}", "{}", 1),
            ("k", "basic", "{}", "{}", "1"), ("k", "basic", None, "{}", 1), ("k", "basic", "{", "{}", 1),
            ("k", "basic", "{}", "[1]", 1), ("k", "basic", "{}", '{"epsilon":"canary-4711"}', 1),
            ("k", "basic", "{}", "[" * 100_000, 1)]


@pytest.mark.parametrize("row", _DAMAGED)
def test_a_damaged_account_row_is_a_typed_error_naming_no_value(row: tuple[Any, ...]) -> None:
    """One parser for both backends: a NULL, a value of another type or unreadable JSON in any
    column is a ``LedgerCorruptedError`` that says which table, never a value it holds."""
    with pytest.raises(LedgerCorruptedError, match="the accounts table is damaged") as caught:
        account_row(row)
    assert "canary" not in str(caught.value)


def test_negative_control_the_old_postgres_parse_lets_damage_escape_untyped() -> None:
    """PostgreSQL's parser before it was shared (no type checks, no typed error): a state that
    is not an object escapes as an ``AttributeError``, a NULL key is taken as an account."""
    def old(key: Any, rule: Any, config: Any, state: Any, seq: Any) -> Account:
        return Account(key, rule, parse_config(config),
                       {k: float(v) for k, v in json.loads(state, parse_int=float).items()}, seq)

    with pytest.raises(AttributeError):
        old("k", "basic", "{}", "[1]", 1)
    assert old(None, "basic", "{}", "{}", 1).key is None
