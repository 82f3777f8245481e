"""Records are built from values by ``dpbudget.accountant.ledger.record`` (a typed ``RecordKind``, the
``noise`` and ``accounts`` members) and keep their bytes: the members every kind of record is
written with in a fixed scenario — a policy record, a release, a batch, a session and its close, a
pipeline and a release inside it — are those pinned in ``record.golden.json``, captured
from the gate that built them as text (commit aa05bf2), so existing ledgers audit as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dpbudget.accountant.gate.gate
from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.ledger import record
from dpbudget.accountant.ledger.transaction import Transaction
from dpbudget.mechanisms import AboveThreshold, Gaussian, Laplace

GOLDEN = Path(__file__).with_name("record.golden.json")
POLICY = """limit = { epsilon = 9.0, delta = 1e-3 }
[datasets.adult]
limit = { epsilon = 5.0, delta = 1e-4 }
[datasets.adult.analysts.alice]
limit = { epsilon = 4.0, delta = 1e-4 }
"""


def _scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """The members (canonical JSON texts) of each record the scenario appends, in order."""
    seen: list[dict[str, str]] = []
    append = Transaction.append

    def spy(self: Transaction, fields: dict[str, str], *args: Any, **kwargs: Any) -> Any:
        seen.append(dict(fields))
        return append(self, fields, *args, **kwargs)

    monkeypatch.setattr(Transaction, "append", spy)
    (tmp_path / "p.toml").write_text(POLICY)
    with Accountant.from_policy(tmp_path / "p.toml", ledger=tmp_path / "l.db", rng=0,
                                simulation=True) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="alice", label='a \u00e9 "q"')
        acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0), (Gaussian(0.1, delta=1e-7, sensitivity=1.0), 1.0)],
                         dataset="adult")
        with acc.session(AboveThreshold(0.2, threshold=1.0, sensitivity=1.0), dataset="adult") as session:
            session.test(-50.0)
        with acc.pipeline("rep", dataset="adult", budget=Budget(0.5)) as pipeline:
            pipeline.release(Laplace(0.1, sensitivity=1.0), 1.0)
    return seen


def test_every_kind_of_record_keeps_its_bytes(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    members = _scenario(tmp_path, monkeypatch)
    assert [json.loads(m["kind"]) for m in members] == [
        "policy", "release", "release", "session", "session-close", "pipeline", "release"]
    assert members == json.loads(GOLDEN.read_text(encoding="utf-8"))
    for fields in members:  # each member is its value's canonical text
        assert all(record.canonical(json.loads(text)) == text for text in fields.values())
    assert audit(f"sqlite:///{tmp_path / 'l.db'}").ok


def test_negative_control_text_built_beside_record_py_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate that spells a member its own way (here ``noise`` with a space) no longer matches."""
    monkeypatch.setattr(dpbudget.accountant.gate.gate, "noise_member",
                        lambda kind, source: f'"{kind} {source}"')
    assert _scenario(tmp_path, monkeypatch) != json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_a_record_kind_is_its_canonical_text() -> None:
    assert [k.text for k in record.RecordKind] == [record.canonical(k.value)
                                                   for k in record.RecordKind]
    assert record.RecordKind.SESSION_CLOSE.text == '"session-close"'
    assert record.noise_member("float", "csprng") == '"float-csprng"'
    assert record.noise_member("exact", "other") == '"exact-other"'
