"""The audit of a JSONL log parses each record once (issue 31): the parse that puts a log's
lines in ``seq`` order is the one the chain check reads, and a line in the form ``export_line``
writes is hashed as it stands, never re-encoded. A line in another form is re-encoded to the
canonical text the chain hashed, so that an edit there is still caught."""

from __future__ import annotations

import json
import types

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit import chain as audit_chain, sources  # noqa: F401
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.mechanisms import Laplace

N = 40


@pytest.fixture
def log(tmp_path):
    acc = Accountant(Budget(10.0))
    for i in range(N):
        acc.release(Laplace(0.01, sensitivity=1.0), 1.0, dataset=f"d{i % 3}")
    path = tmp_path / "log.jsonl"
    export_jsonl(acc.ledger, path)
    return path


@pytest.fixture
def counted(monkeypatch):
    """Calls of json.loads and of the canonical encoder made by the source and the chain check."""
    calls = {"loads": 0, "canonical": 0}

    def loads(*args, **kwargs):
        calls["loads"] += 1
        return json.loads(*args, **kwargs)

    fake = types.SimpleNamespace(loads=loads)
    monkeypatch.setattr(sources, "json", fake)
    monkeypatch.setattr(audit_chain, "json", fake)
    encode = sources.canonical

    def canonical(value):
        calls["canonical"] += 1
        return encode(value)

    monkeypatch.setattr(sources, "canonical", canonical)
    return calls


def test_each_record_of_a_log_is_parsed_once_and_never_re_encoded(log, counted):
    report = audit(log)
    assert report.ok and report.records == N
    assert counted == {"loads": N, "canonical": 0}


def test_negative_control_the_old_ordering_parse_is_counted(log, counted, monkeypatch):
    """The old ordering parsed every line for its seq and the check parsed it again: 2N."""

    def parsing_keyed(items, origin=""):
        for rank, item in enumerate(items, start=1):
            yield sources.json.loads(item.text)["seq"], rank, item

    monkeypatch.setattr(sources, "_keyed", parsing_keyed)
    assert audit(log).ok
    assert counted["loads"] == 2 * N


def _reformatted(path, edit=None):
    """The log with record 5's line rewritten in another JSON form (spaces, keys reordered)."""
    lines = path.read_text().splitlines()
    obj = json.loads(lines[4])
    if edit is not None:
        edit(obj["record"])
    lines[4] = json.dumps({"record": obj["record"], "hash": obj["hash"]}, indent=1).replace(
        "\n", "")
    path.write_text("\n".join(lines) + "\n")


def test_a_line_in_another_form_is_re_encoded_and_verified(log, counted):
    _reformatted(log)
    report = audit(log)
    assert report.ok and report.records == N
    assert counted == {"loads": N, "canonical": 1}


def test_an_edit_in_a_line_of_another_form_is_still_caught(log):
    _reformatted(log, lambda record: record.update(label="edited"))
    report = audit(log)
    assert not report.ok
    assert any(p.kind == "chain" and p.seq == 5 for p in report.problems)


def test_a_canonical_looking_line_with_a_non_canonical_record_is_flagged(log):
    """The fast path hashes the bytes as they stand: a record part with a space added no longer
    matches its hash (it is not the text the chain hashed)."""
    lines = log.read_text().splitlines()
    lines[4] = lines[4].replace('"seq":5', '"seq": 5')
    log.write_text("\n".join(lines) + "\n")
    report = audit(log)
    assert any(p.kind == "chain" and p.seq == 5 for p in report.problems)
