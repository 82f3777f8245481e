"""The gate's checks before any debit (``dpbudget.accountant.gate.gate``).

Negative costs never refund budget: not through a mechanism whose cost was built without
validation, not through the ledger's own append, and not through a forged, re-hashed export.

Name twins ("people", "People", "peo-ple": one table, one budget) are refused on a dataset's
first release by an index of folded names, not by listing and folding every account: the first
release on a new dataset reads only the accounts created since the gate last looked
(``Ledger.created_since``), the same at 10 datasets as at 300, and still sees a twin another
process created after this one opened the ledger.

And the one rule seen from inside a mechanism: when it draws, its debit is already committed; a
refused request draws nothing and changes nothing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, BudgetExceededError, LedgerError
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.accountant.gate.gate import Gate
from dpbudget.accountant.gate.step import Step
from dpbudget.accountant.values.errors import InvalidArgumentError
from dpbudget.accountant.ledger import MemoryLedger, SqliteLedger
from dpbudget.accountant.ledger.base import Ledger
from dpbudget.mechanisms import Laplace
from dpbudget.mechanisms.base import NumericMechanism
from tests.support import snapshot
from typing import Any, Callable
import dpbudget.accountant.gate.gate as gate_module
from dpbudget.accountant.gate.accountant import Accountant
from dpbudget.accountant.gate.bounded import UnitBounds, release_bounded
from dpbudget.accountant.gate.refusals import REFUSAL_LOGGER
from dpbudget.accountant.training.descent import dp_sgd
from dpbudget.accountant.values.budget import Budget
from dpbudget.accountant.values.errors import UnitRequiredError
from dpbudget.mechanisms import AboveThreshold, Laplace
from dpbudget.policies.limits import DatasetLimit

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


# --- negative costs never refund budget ---


class _Forged(NumericMechanism):
    """A mechanism whose cost skips ``Budget``'s validation (pydantic's ``model_construct``)."""

    def __init__(self, epsilon: float, delta: float = 0.0) -> None:
        self.epsilon = epsilon
        self._cost = Budget.model_construct(epsilon=epsilon, delta=delta)

    def params(self) -> dict[str, Any]:
        return {}  # (a finite-looking ε in params would already be refused at construction)

    def draw(self, value: Any, sampler: Any) -> Any:
        return value + sampler.laplace(1.0)


@pytest.mark.parametrize("epsilon, delta", [(-1.0, 0.0), (float("nan"), 0.0), (0.1, -1e-6),
                                            (0.1, 1.5), (float("inf"), 0.0), (-0.0, -0.0)])
def test_an_invalid_cost_is_refused_where_it_is_charged(epsilon: float, delta: float) -> None:
    rng = np.random.default_rng(5)
    acc = Accountant(Budget(1.0, 1e-6), rng=rng)
    for _ in range(10):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    before = snapshot(acc.ledger, rng)
    if epsilon == 0.0 and delta == 0.0:  # -0.0 is 0: a free release is not a refund
        with pytest.raises(Exception):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
        return
    with pytest.raises(InvalidArgumentError) as info:
        acc.release(_Forged(epsilon, delta), 1.0)
    assert info.value.argument == "cost"
    assert snapshot(acc.ledger, rng) == before  # nothing debited, nothing drawn
    with pytest.raises(InvalidArgumentError):
        acc.can_afford(_Forged(epsilon, delta))
    with pytest.raises(InvalidArgumentError):  # inside a batch too
        acc.release_many([(Laplace(0.01, sensitivity=1.0), 1.0), (_Forged(epsilon, delta), 1.0)])
    assert snapshot(acc.ledger, rng) == before


def test_the_refund_attack_gets_nothing_back() -> None:
    """The issue's scenario: a spent limit, then a mechanism of cost -1, then ten releases of 0.1
    that the refund would have paid for. All refused."""
    acc = Accountant(Budget(1.0), rng=0)
    for _ in range(10):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with pytest.raises(InvalidArgumentError):
        acc.release(_Forged(-1.0), 1.0)
    assert not acc.can_afford(Laplace(0.1, sensitivity=1.0))
    assert acc.spent().epsilon >= 1.0 - 1e-9


def test_a_forged_negative_cost_in_a_rehashed_export_fails_the_audit(tmp_path: Path) -> None:
    acc = Accountant(Budget(1.0), rng=0)
    for _ in range(3):
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    out = tmp_path / "x.jsonl"
    export_jsonl(acc.ledger, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # Rewrite record 3 as a refund of 0.5 (state down to 0.25) and re-hash the chain from there.
    prev = lines[1]["hash"]
    for line in lines[2:]:
        record = line["record"]
        record["prev"] = prev
        if record["seq"] == 3:
            record["cost"]["epsilon"] = -0.5
            record["accounts"]["dataset:default"]["state"]["epsilon"] = 0.0
        text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        line["hash"] = prev = hashlib.sha256(text.encode()).hexdigest()
    out.write_text("".join(json.dumps({"hash": ln["hash"], "record": ln["record"]},
                                      separators=(",", ":"), ensure_ascii=False) + "\n"
                           for ln in lines))
    report = audit(out)
    assert report.exit_status & EXIT_BITS["malformed"]
    assert any("invalid cost" in p.message and p.seq == 3 for p in report.problems)


def test_the_ledger_refuses_a_refund_appended_directly(tmp_path: Path) -> None:
    """Even code that bypasses the gate and appends through ``Ledger.transaction()`` cannot lower
    an account's running state."""
    acc = Accountant(Budget(1.0), ledger=tmp_path / "b.db", rng=0, simulation=True)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    account = acc.ledger.account("dataset:default")
    assert account is not None
    before = snapshot(acc.ledger)
    with pytest.raises(LedgerError, match="never decreases"):
        with acc.ledger.transaction() as tx:
            tx.append({"kind": '"release"'}, [account._replace(state={"epsilon": 0.0,
                                                                      "delta": 0.0})])
    assert snapshot(acc.ledger) == before
    assert acc.spent() == Budget(0.5)


def test_running_totals_reset_by_hand_are_caught_when_the_ledger_opens(tmp_path: Path) -> None:
    """The issue's scenario: stored running totals set to 0 by hand would let 100 more releases
    through. A new accountant on the ledger refuses to open it."""
    import sqlite3

    from dpbudget.accountant import LedgerCorruptedError

    path = tmp_path / "b.db"
    with Accountant(Budget(1.0), ledger=path, rng=0, simulation=True) as acc:
        for _ in range(10):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    with sqlite3.connect(path) as conn:
        conn.execute("""UPDATE accounts SET state = '{"delta":0.0,"epsilon":0.0}'""")
    with pytest.raises(LedgerCorruptedError, match="dataset:default"):
        Accountant(Budget(1.0), ledger=path, rng=0, simulation=True)


def test_a_ledger_deleted_or_replaced_in_use_is_refused(tmp_path: Path) -> None:
    import shutil

    from dpbudget.accountant import LedgerError

    path = tmp_path / "b.db"
    acc = Accountant(Budget(1.0), ledger=path, rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    backup = tmp_path / "backup.db"
    shutil.copy(path, backup)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    shutil.copy(backup, tmp_path / "restored.db")
    (tmp_path / "restored.db").replace(path)  # a backup restored over the live ledger
    with pytest.raises(LedgerError, match="deleted or replaced"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.close()
    acc = Accountant(Budget(1.0), ledger=tmp_path / "c.db", rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    (tmp_path / "c.db").unlink()  # deleted while in use
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"c.db{suffix}").unlink(missing_ok=True)
    with pytest.raises(LedgerError, match="deleted or replaced"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    acc.close()


def test_a_relative_ledger_path_survives_a_chdir(tmp_path: Path, monkeypatch: Any) -> None:
    """Review finding: the deleted-or-replaced check must not refuse a ledger opened by a
    relative path once the process changes directory (as notebooks do)."""
    monkeypatch.chdir(tmp_path)
    acc = Accountant(Budget(1.0), ledger="budget.db", rng=0, simulation=True)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    monkeypatch.chdir(tmp_path.parent)
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert acc.spent().epsilon == pytest.approx(0.2)
    acc.close()


# --- the one rule: the draw comes after its committed debit ---

class _Peeking(Laplace):
    """Laplace that notes, when it draws, what the ledger already holds for its dataset."""

    seen: list[tuple[int, float]] = []

    def draw(self, value: Any, sampler: Any) -> Any:
        ledger = self.ledger  # type: ignore[attr-defined]
        spent = {a.key: a.state.get("epsilon", 0.0) for a in ledger.accounts()}
        _Peeking.seen.append((ledger.head()[0], spent.get("dataset:people", 0.0)))
        return super().draw(value, sampler)


def _peeking(acc: Accountant, epsilon: float) -> _Peeking:
    mechanism = _Peeking(epsilon, sensitivity=1.0)
    object.__setattr__(mechanism, "ledger", acc.ledger)
    return mechanism


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_every_draw_sees_its_own_debit_already_committed(kind: str, tmp_path: Path) -> None:
    _Peeking.seen = []
    acc = Accountant(Budget(1.0), ledger=_ledger(kind, tmp_path))
    for _ in range(3):
        acc.release(_peeking(acc, 0.25), 1.0, dataset="people")
    heads = [head for head, _ in _Peeking.seen]
    assert [spent for _, spent in _Peeking.seen] == pytest.approx([0.25, 0.5, 0.75])
    assert heads == [acc.ledger.head()[0] - 2, acc.ledger.head()[0] - 1, acc.ledger.head()[0]]
    before = snapshot(acc.ledger)
    with pytest.raises(BudgetExceededError):
        acc.release(_peeking(acc, 0.5), 1.0, dataset="people")
    assert len(_Peeking.seen) == 3 and snapshot(acc.ledger) == before  # refused: no draw, no debit


def test_negative_control_a_gate_that_draws_before_debiting_is_seen(monkeypatch) -> None:
    """Negative control: the broken order (draw, then debit; re-created on ``Gate.release``) gives
    draws that see no debit of their own, which the test above would catch."""
    def draw_first(self: Gate, mechanism: Any, value: Any, label: Any, where: Any) -> Any:
        answer = mechanism.draw(value, self.sampler)
        self.debit(Step.of(mechanism), self.validate(mechanism, label, where), label)
        return answer

    monkeypatch.setattr(Gate, "release", draw_first)
    _Peeking.seen = []
    acc = Accountant(Budget(1.0), rng=0)
    acc.release(_peeking(acc, 0.25), 1.0, dataset="people")
    assert _Peeking.seen == [(0, 0.0)]


# ------------------------------------------------------------------------------------------------
# Raw-value releases on a dataset with a privacy unit (issue 33).
#
# The attack: a count per region over an events table, computed by hand per row and released "at
# ε = 1" through ``acc.release``, costs a person with 40 rows ε = 40 while the ledger records 1. On a
# dataset whose policy declares a ``privacy_unit``, every raw-value path — release, release_many,
# session, a pipeline's and a budgeted function's releases, training — is now refused with
# ``UnitRequiredError``, nothing drawn or debited, unless the policy says ``raw_values = "allow"``.
# ------------------------------------------------------------------------------------------------

LAPLACE = Laplace(epsilon=0.1, sensitivity=1.0)
X = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
Y = np.array([0, 1, 1, 0])


def _acc(raw_values: str = "deny") -> Accountant:
    return Accountant(limits={"events": DatasetLimit(limit=Budget(100.0, 1e-3), privacy_unit="person_id",
                                                     raw_values=raw_values)}, rng=0)


def _in_pipeline(acc: Accountant) -> Any:
    pipe = acc.pipeline("p", dataset="events", budget=Budget(1.0))
    return pipe.release(LAPLACE, 3.0)


def _budgeted(acc: Accountant) -> Any:
    @acc.budgeted("b", dataset="events", budget=Budget(1.0))
    def count(pipe: Any) -> Any:
        return pipe.release(LAPLACE, 3.0)

    return count()


RAW_PATHS: dict[str, Callable[[Accountant], Any]] = {
    "release": lambda acc: acc.release(LAPLACE, 3.0, dataset="events"),
    "release_many": lambda acc: acc.release_many([(LAPLACE, 3.0), (LAPLACE, 4.0)],
                                                 dataset="events"),
    "session": lambda acc: acc.session(AboveThreshold(0.1, threshold=1.0, sensitivity=1.0),
                                       dataset="events"),
    "pipeline": _in_pipeline,
    "budgeted": _budgeted,
    "dp_sgd": lambda acc: dp_sgd(acc, X, Y, steps=1, sampling_rate=0.5, noise_multiplier=2.0,
                                 batch_size=2.0, dataset="events"),
}


def _draws_left(acc: Accountant) -> int:
    """The next word of the accountant's source: equal to a fresh one's if nothing was drawn."""
    return int(acc._gate.sampler.bits.word())


def _releases(acc: Accountant) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (e.text for e in acc.ledger.entries()))
            if r["kind"] in ("release", "session")]


@pytest.mark.parametrize("path", list(RAW_PATHS))
def test_a_raw_value_on_a_dataset_with_a_unit_is_refused(path: str) -> None:
    acc = _acc()
    before = snapshot(acc.ledger)  # (a pipeline is refused when it opens: nothing allocated)
    with pytest.raises(UnitRequiredError, match="datasets.events.raw_values = 'allow'") as info:
        RAW_PATHS[path](acc)
    assert info.value.dataset == "events" and "person_id" in str(info.value)
    assert not isinstance(info.value, ValueError)  # a refusal, like MechanismNotAllowedError
    assert _releases(acc) == []
    assert snapshot(acc.ledger) == before
    assert _draws_left(acc) == _draws_left(_acc())  # nothing drawn


@pytest.mark.parametrize("path", list(RAW_PATHS))
def test_raw_values_allow_lets_them_through_per_row(path: str) -> None:
    acc = _acc("allow")
    RAW_PATHS[path](acc)
    releases = _releases(acc)
    assert releases and all("unit" not in r for r in releases)  # no unit: per row
    if path == "release":
        receipt = acc.last_receipt
        assert receipt is not None and receipt.unit is None and receipt.per == "per row"


def test_negative_control_the_old_check_lets_the_attack_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal above is the unit rule's: without it (as before), the same release on the
    same policy is drawn and debited."""
    monkeypatch.setattr(gate_module, "unit_refusal", lambda *args: None)
    acc = _acc()
    acc.release(LAPLACE, 3.0, dataset="events")
    assert acc.spent("events") == Budget(0.1)


def test_a_unit_refusal_is_logged_for_review(caplog: pytest.LogCaptureFixture) -> None:
    """Review finding 7: a refused raw value is a refusal like any other (``REFUSALS``), so a
    run of them shows in the security log; before, it was not logged."""
    acc = _acc()
    with caplog.at_level("WARNING", logger=REFUSAL_LOGGER):
        with pytest.raises(UnitRequiredError):
            acc.release(LAPLACE, 3.0, dataset="events")
    entries = [r.dpbudget_refusal for r in caplog.records if hasattr(r, "dpbudget_refusal")]
    assert [e["reason"] for e in entries] == ["UnitRequiredError"]
    assert entries[0]["dataset"] == "events" and "3.0" not in entries[0]["message"]


def test_can_afford_and_max_releases_price_a_table_query_on_a_unit_dataset() -> None:
    """Review finding 9: the dry runs check the budget and caps, not the unit (nothing else can
    pre-check a table query); the release itself still refuses a raw value."""
    acc = Accountant(limits={"events": DatasetLimit(limit=Budget(1.0), privacy_unit="person_id")})
    assert acc.can_afford(LAPLACE, dataset="events")
    assert acc.max_releases(LAPLACE, dataset="events") == 10
    assert not acc.can_afford(Laplace(epsilon=2.0, sensitivity=1.0), dataset="events")
    with pytest.raises(UnitRequiredError):
        acc.release(LAPLACE, 3.0, dataset="events")


def test_a_dataset_without_a_unit_adds_no_check_to_the_plan() -> None:
    """The hot path: a plan on a dataset without a unit (nor caps, nor allowed mechanisms) has
    no stateless checks, so the gate runs none; one with a unit has."""
    acc = Accountant(limits={"plain": DatasetLimit(limit=Budget(1.0)),
                             "events": DatasetLimit(limit=Budget(1.0), privacy_unit="p")})
    assert acc._gate.planner.plan("plain", None).checks == ()
    assert [name for name, _ in acc._gate.planner.plan("events", None).checks] == ["events"]


def test_a_join_with_one_unit_dataset_refuses_raw_values() -> None:
    acc = Accountant(limits={"plain": DatasetLimit(limit=Budget(1.0)),
                             "events": DatasetLimit(limit=Budget(1.0), privacy_unit="p")})
    with pytest.raises(UnitRequiredError, match="datasets.events"):
        acc.release(LAPLACE, 3.0, dataset=("plain", "events"))
    assert acc.spent("plain") == Budget(0.0)


def test_the_table_entry_is_not_a_raw_value_and_its_receipt_says_per_person() -> None:
    acc = _acc()
    release_bounded(acc._gate, [LAPLACE], lambda rng: [3.0],
                    UnitBounds("person_id", {"max_rows_per_unit": 1}), None, ("events", None))
    receipt = acc.last_receipt
    assert receipt is not None and receipt.per == "per person_id"
    assert receipt.as_dict()["per"] == "per person_id" and "per person_id" in repr(receipt)
    with pytest.raises(UnitRequiredError):  # the raw path stays refused beside it
        acc.release(LAPLACE, 3.0, dataset="events")


def test_negative_control_a_pipeline_opened_on_a_unit_dataset_burns_its_allocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Final review: without the check at opening (as before), a pipeline on a unit dataset
    with raw values denied debited its allocation, and nothing could be released inside it."""
    import dpbudget.accountant.gate.pipeline as pipeline_module
    monkeypatch.setattr(pipeline_module, "unit_refusal", lambda *args: None)
    acc = _acc()
    pipe = acc.pipeline("p", dataset="events", budget=Budget(1.0))
    with pytest.raises(UnitRequiredError):
        pipe.release(LAPLACE, 3.0)
    assert acc.spent("events") == Budget(1.0)  # spent, and nothing to show for it
