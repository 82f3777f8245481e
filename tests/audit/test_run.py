"""The auditor: every kind of tampering is found with its record number and its exit bit; an
untouched ledger audits clean and its totals equal the accountant's; the replay reproduces each
composition rule's spend."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from dpbudget.accountant import RULES, Accountant, Budget
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.composition import BasicComposition
from dpbudget.accountant.values.errors import LedgerError
from tests.support import OWNER, forge_release, load_policy_text, release_fields
from tests.audit.support import exported as _export, six_releases as _ledger
from dpbudget.accountant.ledger import Account, MemoryLedger, SqliteLedger, open_ledger, writer
from dpbudget.accountant.audit.logs import LOGGER_NAME, log_records_to
from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl
from dpbudget.mechanisms import AnalyticGaussian, Laplace, SubsampledGaussian


def _kinds(report):
    return {(p.kind, p.seq) for p in report.problems}


def test_clean_ledger_audits_clean_and_matches_accountant(tmp_path):
    url = _ledger(tmp_path / "l.db")
    report = audit(url)
    assert report.ok and report.exit_status == 0
    assert report.records == report.verified == 7  # the policy record and 6 releases
    with Accountant(limits={"adult": Budget(1.0, 1e-6), "census": Budget(2.0)},
                    ledger=url) as acc:
        for a in report.accounts:
            assert a.spent == acc.spent(a.account.split(":", 1)[1]).model_dump()
            assert a.stored_state_agrees is True
        assert report.head_hash == acc.ledger.head()[1]
    assert report.by_analyst["alice"].releases == 4
    assert report.by_mechanism["Laplace"].epsilon == pytest.approx(0.6)
    assert set(report.by_label) == {f"q{i}" for i in range(6)}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_replay_reproduces_each_rules_spend(rule):
    mech = AnalyticGaussian(0.05, delta=1e-8, noise="float" if rule == "gaussian" else "exact", sensitivity=1.0)
    value = 1.0
    if rule == "pld":  # the one step it admits, declared with the budget
        mech, value = SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0), [[1.0], [0.5]]
    acc = Accountant(Budget(1.0, 1e-6), composition=rule, rng=2,
                     **({"step": (0.05, 2.0)} if rule == "pld" else {"per_query": mech.cost}))
    for _ in range(7):
        acc.release(mech, value, dataset="d")
    report = audit(acc.ledger)
    assert report.ok, report.problems
    (account,) = report.accounts
    assert account.rule == rule
    assert account.spent == acc.spent("d").model_dump()
    assert account.remaining == acc.remaining("d").model_dump()


def test_edited_field(tmp_path):
    path, lines = _export(tmp_path)
    lines[3] = lines[3].replace('"label":"q2"', '"label":"qX"')  # record 1 is the policy's
    path.write_text("\n".join(lines) + "\n")
    report = audit(path)
    assert ("chain", 4) in _kinds(report)
    assert report.exit_status & EXIT_BITS["chain"]


def test_edited_cost_is_also_caught_by_the_replay(tmp_path):
    path, lines = _export(tmp_path)
    lines[1] = lines[1].replace('"cost":{"delta":0.0,"epsilon":0.1', '"cost":{"delta":0.0,"epsilon":0.01')
    path.write_text("\n".join(lines) + "\n")
    report = audit(path)
    assert {("chain", 2), ("state", 2), ("release", 2)} <= _kinds(report)
    # (and the edited cost is not what the recorded Laplace parameters give: a release problem)
    assert report.exit_status == EXIT_BITS["chain"] | EXIT_BITS["state"] | EXIT_BITS["release"]


def test_deleted_record(tmp_path):
    path, lines = _export(tmp_path)
    del lines[3]
    path.write_text("\n".join(lines) + "\n")
    report = audit(path)
    assert ("chain", 5) in _kinds(report)
    assert "missing" in report.problems[0].message and "deleted" in report.problems[0].message


def test_reordered_pair(tmp_path):
    """An export audited as complete keeps its file order: a swap is reported. (A log is read
    in seq order within a window: its writers may leave neighbouring lines out of order, and
    line order is not part of the chain.)"""
    path, lines = _export(tmp_path)
    lines[2], lines[3] = lines[3], lines[2]
    path.write_text("\n".join(lines) + "\n")
    report = audit(path, complete=True)
    assert {("chain", 4), ("chain", 3)} <= _kinds(report)
    assert any("record 3 appears after record 4" in p.message for p in report.problems)
    assert audit(path).ok


def test_inserted_record(tmp_path):
    path, lines = _export(tmp_path)
    lines.insert(2, lines[1])  # a copy of record 2 slipped in after it
    path.write_text("\n".join(lines) + "\n")
    report = audit(path, complete=True)
    assert ("chain", 2) in _kinds(report)
    assert report.exit_status & EXIT_BITS["chain"]
    # A log may hold a line twice (written again after an interrupt): read once, reported.
    report = audit(path)
    assert report.ok and report.duplicates == 1


def test_truncated_tail_needs_the_kept_head(tmp_path):
    path, lines = _export(tmp_path)
    head = json.loads(lines[-1])["hash"]
    path.write_text("\n".join(lines[:-2]) + "\n")
    assert audit(path).ok  # without the head kept elsewhere a clean cut is invisible
    report = audit(path, expected_head=head)
    assert ("head", 5) in _kinds(report)
    assert report.exit_status == EXIT_BITS["head"]


def test_garbled_line_is_reported_not_raised(tmp_path):
    path, lines = _export(tmp_path)
    lines[2] = lines[2][:40] + "\x00garbage"
    path.write_text("\n".join(lines) + "\n")
    report = audit(path)
    assert any(p.kind == "malformed" and p.position == 3 for p in report.problems)
    assert report.exit_status & EXIT_BITS["malformed"]
    assert report.records == 7 and report.head_seq == 7


def test_binary_garbage_file(tmp_path):
    path = tmp_path / "junk.jsonl"
    path.write_bytes(struct.pack("<100d", *range(100)))
    report = audit(path)
    assert not report.ok and report.exit_status & EXIT_BITS["malformed"]


def test_edit_inside_sqlite_ledger(tmp_path):
    url = _ledger(tmp_path / "l.db")
    with sqlite3.connect(tmp_path / "l.db") as conn:
        conn.execute("DROP TRIGGER entries_append_only_u")
        text = conn.execute("SELECT record FROM entries WHERE seq = 5").fetchone()[0]
        conn.execute("UPDATE entries SET record = ? WHERE seq = 5",
                     (text.replace('"label":"q3"', '"label":"q9"'),))
    report = audit(url)
    assert ("chain", 5) in _kinds(report)


def test_stored_running_state_mismatch(tmp_path):
    url = _ledger(tmp_path / "l.db")
    with sqlite3.connect(tmp_path / "l.db") as conn:
        conn.execute("UPDATE accounts SET state = ? WHERE key = 'dataset:adult'",
                     (json.dumps({"delta": 0.0, "epsilon": 0.0}),))
    report = audit(url)
    assert [p.kind for p in report.problems] == ["state"]
    assert report.exit_status == EXIT_BITS["state"]
    assert not next(a for a in report.accounts if a.account == "dataset:adult").stored_state_agrees


def test_release_beyond_its_limit_is_flagged():
    # Forge a well-chained ledger whose records claim a limit of 0.25 but were never checked.
    ledger = MemoryLedger()
    claimed, unchecked = BasicComposition(Budget(0.25)), BasicComposition(None)
    state = unchecked.initial_state()
    mech = Laplace(0.1, sensitivity=1.0)
    for _ in range(4):
        state = unchecked.debit(state, mech.charge)
        account = Account("dataset:d", "basic", claimed.describe(), state, 0)
        with ledger.transaction() as tx:
            tx.append(release_fields(mech, "d", [(claimed, account)]), [account])
    report = audit(ledger)
    assert ("limit", 3) in _kinds(report)
    assert report.exit_status & EXIT_BITS["limit"]
    assert report.accounts[0].over_limit


def test_policy_limits_are_checked():
    acc = Accountant(Budget(1.0), rng=0)
    acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="d")

    class Policy:
        def limit_for(self, key):
            return Budget(0.3) if key == "dataset:d" else None

    report = audit(acc.ledger, Policy())
    assert report.exit_status == EXIT_BITS["limit"] and report.accounts[0].over_limit


def test_hmac_keyed_chain(tmp_path, monkeypatch):
    ledger = SqliteLedger(tmp_path / "k.db", hmac_key="k3y")
    with Accountant(Budget(1.0), ledger=ledger) as acc:
        for _ in range(3):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    assert audit(url, key="k3y").ok
    # Under another key no HMAC verifies: each record is one its key holder did not write.
    assert audit(url, key="wrong").exit_status == EXIT_BITS["auth"]
    monkeypatch.delenv("DPBUDGET_LEDGER_KEY", raising=False)
    assert audit(url).exit_status == EXIT_BITS["auth"]  # cannot verify without the key
    # A forger without the key rebuilds the chain with plain SHA-256: the keyed audit rejects it.
    forged = tmp_path / "forged.jsonl"
    with open_ledger(_ledger(tmp_path / "plain.db", 3)) as plain:
        export_jsonl(plain, forged)
    assert audit(forged, key="k3y").exit_status & EXIT_BITS["auth"]


def test_logs_audit_like_the_ledger(tmp_path):
    log = tmp_path / "pipeline.jsonl"
    handler = log_records_to(log)
    try:
        acc = Accountant(Budget(1.0))  # (no seed: a log shows no ledger's first record)
        for _ in range(5):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="d")
        with pytest.raises(Exception):
            acc.release(Laplace(5.0, sensitivity=1.0), 1.0, dataset="d")  # refused: not logged
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(handler)
        handler.close()
    report = audit(log)
    assert report.ok and report.records == 5
    assert report.head_hash == acc.ledger.head()[1]


def test_since_until_windows_the_tallies():
    acc = Accountant(Budget(1.0), rng=0)
    for _ in range(4):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    times = [e.record["time"] for e in acc.ledger.entries()]
    report = audit(acc.ledger, since=times[1], until=times[2])
    assert report.by_mechanism["Laplace"].releases == 2
    assert report.accounts[0].releases == 3  # the state as of `until`


def test_cli_exit_statuses(tmp_path, capsys):
    path, lines = _export(tmp_path)
    assert cli(["audit", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 7
    assert cli(["audit", str(path)]) == 0
    lines[2] = lines[2].replace('"label":"q1"', '"label":"zz"')
    path.write_text("\n".join(lines) + "\n")
    assert cli(["audit", str(path)]) == EXIT_BITS["chain"]
    assert cli(["audit", str(tmp_path / "missing.db")]) == 2


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib")
    url = _ledger(tmp_path / "l.db")
    png = tmp_path / "spend.png"
    assert cli(["audit", url, "--plot", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 1000 and height >= 600  # taller with one panel per dataset (issue 16)


def test_policy_file_limits_are_checked(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[datasets.adult]\nlimit = { epsilon = 1.0 }\n'
                      '[datasets.adult.analysts.alice]\nlimit = { epsilon = 0.3 }\n')
    acc = Accountant.from_policy(policy, rng=0)
    for _ in range(3):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
    assert audit(acc.ledger, policy).ok
    policy.write_text('[datasets.adult]\nlimit = { epsilon = 1.0 }\n'
                      '[datasets.adult.analysts.alice]\nlimit = { epsilon = 0.2 }\n')
    report = audit(acc.ledger, policy)
    assert report.exit_status == EXIT_BITS["limit"]
    assert [a.account for a in report.accounts if a.over_limit] == ["dataset:adult/analyst:alice"]


def test_pipeline_records_replay_and_tally():
    acc = Accountant(Budget(1.0), rng=0)
    with acc.pipeline("report", dataset="d", budget=Budget(0.5)) as p:
        p.release(Laplace(0.2, sensitivity=1.0), 1.0)
        p.release(Laplace(0.2, sensitivity=1.0), 1.0)
    report = audit(acc.ledger)
    assert report.ok, report.problems
    # The allocation is what the dataset paid; the releases inside it are counted apart, so no
    # total counts the same budget twice (the analyst's, the pipeline's, the mechanism's).
    (tally,) = report.by_pipeline.values()
    assert (tally.releases, tally.epsilon) == (1, 0.5)
    assert (tally.inside_releases, tally.inside_epsilon) == (2, pytest.approx(0.4))
    assert report.by_mechanism["Laplace"].releases == 0
    assert report.by_mechanism["Laplace"].inside_releases == 2
    assert report.by_dataset["d"].epsilon == 0.5 == acc.spent("d").epsilon
    spent = {a.account: a.spent["epsilon"] for a in report.accounts}
    assert spent["dataset:d"] == acc.spent("d").epsilon == 0.5


def test_sparse_vector_session_records_replay():
    from dpbudget.mechanisms import Sparse

    acc = Accountant(Budget(2.0), rng=4)
    with acc.session(Sparse(1.0, threshold=50.0, max_positives=2, sensitivity=1.0), dataset="d") as svt:
        for q in (1.0, 2.0, 3.0):
            svt.test(q)
    report = audit(acc.ledger)
    assert report.ok, report.problems
    assert report.records == 2  # the fixed-cost debit and the zero-cost close
    assert report.accounts[0].releases == 1
    assert report.accounts[0].spent == acc.spent("d").model_dump() == {"epsilon": 1.0, "delta": 0.0}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_batches_replay_under_each_rule(rule):
    noise = "float" if rule == "gaussian" else "exact"
    items = [(AnalyticGaussian(0.05, delta=1e-9, noise=noise, sensitivity=1.0), 1.0),
             (AnalyticGaussian(0.02, delta=1e-9, noise=noise, sensitivity=1.0), 2.0)] * 3
    extra: dict = {"per_query": items[0][0].cost}
    if rule == "pld":  # the one step it admits (and a dominated one), declared with the budget
        items = [(SubsampledGaussian(2.0, sampling_rate=0.05, noise="float", sensitivity=1.0), [[1.0]]),
                 (SubsampledGaussian(3.0, sampling_rate=0.02, noise="float", sensitivity=1.0), [[2.0]])] * 3
        extra = {"step": (0.05, 2.0)}
    acc = Accountant(Budget(1.0, 1e-6), composition=rule, rng=5, **extra)
    acc.release_many(items, dataset="d")
    acc.release(items[1][0], items[1][1], dataset="d")
    report = audit(acc.ledger)
    assert report.ok, report.problems
    assert report.accounts[0].spent == acc.spent("d").model_dump()


def test_the_demo_ledger_audits_clean_and_matches_the_accountant(tmp_path):
    import io

    from examples.demo import POLICY, run

    acc = run(str(tmp_path / "demo.db"), seed=11, out=io.StringIO())
    report = audit(acc.ledger, POLICY)
    assert report.ok, report.problems
    spent = {a.account: a.spent for a in report.accounts}
    assert spent["dataset:people"] == acc.spent("people").model_dump()
    assert spent["dataset:people/analyst:alice"] == acc.spent("people", analyst="alice").model_dump()
    assert any(k.startswith("pipeline:income-report#") for k in spent)
    acc.close()
    assert cli(["audit", str(tmp_path / "demo.db"), "--policy", str(POLICY)]) == 0


def test_a_mistyped_ledger_is_an_error_and_nothing_is_created(tmp_path, capsys):
    """``dpbudget audit sqlite:///typo.db`` used to create an empty ledger and exit 0."""
    from dpbudget.accountant.cli import main
    from dpbudget.accountant.values.errors import LedgerError

    typo = tmp_path / "typo.db"
    for location in (f"sqlite:///{typo}", str(typo)):
        with pytest.raises(LedgerError):
            audit(location)
        assert main(["audit", location]) == 2
        assert main(["status", location]) != 0
        assert not typo.exists()
    capsys.readouterr()


def test_an_sqlite_file_that_is_not_a_ledger_is_left_alone(tmp_path):
    import sqlite3

    from dpbudget.accountant.values.errors import LedgerError

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    before = other.read_bytes()
    with pytest.raises(LedgerError, match="not a dpbudget ledger"):
        audit(f"sqlite:///{other}")
    assert other.read_bytes() == before


def test_hostile_input_never_ends_in_a_traceback(tmp_path, capsys):
    from dpbudget.accountant.cli import main

    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"hash": "x", "record": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    report = audit(deep)
    assert report.exit_status & EXIT_BITS["malformed"]
    bad_utf8 = tmp_path / "bytes.jsonl"
    bad_utf8.write_bytes(b'{"hash": "\xff\xfe", "record": {}}\n\xc3\x28\n')
    assert audit(bad_utf8).exit_status & EXIT_BITS["malformed"]
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"SQLite format 3\x00" + b"\x00garbage" * 512)
    assert main(["audit", str(corrupt)]) == 2
    acc_db = tmp_path / "ok.db"
    with Accountant(Budget(1.0), ledger=acc_db, rng=0, simulation=True) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    assert main(["export", str(acc_db), str(tmp_path / "missing" / "out.jsonl")]) == 2
    capsys.readouterr()


@pytest.mark.parametrize("first, second", [("basic", "advanced"), ("advanced", "optimal"),
                                           ("optimal", "basic"), ("gaussian", "advanced")])
def test_a_rule_changed_mid_stream_is_reported_not_a_traceback(first, second):
    """Review finding (pre-existing): replaying a rule change between rules whose states have
    different shapes raised KeyError out of the report."""
    from dpbudget.accountant.composition import make_rule
    from dpbudget.mechanisms import AnalyticGaussian

    ledger = MemoryLedger()
    for name in (first, second):
        rule = make_rule(name, Budget(1.0, 1e-6), Budget(0.1, 1e-8) if name == "optimal" else None)
        mech = AnalyticGaussian(0.1, delta=1e-8, noise="float", sensitivity=1.0) if name in ("gaussian", "optimal") else Laplace(0.1, sensitivity=1.0)
        # Forged below the gate: the ledger itself would refuse a state whose shape changes.
        with ledger.transaction() as tx:
            prev = tx.account("dataset:d")
            fresh = prev is None or prev.rule != name
            state = rule.debit(rule.initial_state() if fresh else prev.state, mech.charge)
            account = Account("dataset:d", name, rule.describe(), state, 0)
            forge_release(ledger, mech, rule, account)
    report = audit(ledger)
    assert report.exit_status & EXIT_BITS["limit"]
    assert any("changed its configuration" in p.message for p in report.problems)


def test_progress_bars_on_audit_and_import(tmp_path, capsys) -> None:
    """Issue 16: long audits and imports can show progress on stderr (tqdm's when installed),
    never on stdout, and the result is the same."""
    from dpbudget.accountant.ledger import open_ledger
    from dpbudget.accountant.audit.transfer import export_jsonl, import_jsonl

    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Accountant(Budget(10.0), ledger=url, rng=0, simulation=True) as acc:
        for _ in range(30):
            acc.release(Laplace(0.1, sensitivity=1.0), 1.0)
    assert audit(url, progress=True).ok
    out = tmp_path / "a.jsonl"
    with open_ledger(url) as ledger:
        export_jsonl(ledger, out)
    with open_ledger(f"sqlite:///{tmp_path / 'b.db'}") as target:
        assert import_jsonl(out, target, progress=True) == 31
    captured = capsys.readouterr()
    assert "records" in captured.err and "records" not in captured.out


# -- a keyed SQLite ledger whose account rows were edited by someone who can write the file but
# does not hold the key: the audit (with the key) reports each edit; opening does not refuse them.
# Until issue 31, each record of a keyed SQLite ledger carried ``table``, a running commitment to
# the accounts table under the key, and opening refused a table its head did not commit to. It
# was deleted: it stopped no one who can write the file. Such a holder copies the file before the
# analysts spend and puts the copy back after (``test_an_older_copy_of_the_whole_file_answers
# _again``): every record authentic, every row and the commitment consistent, the budget back --
# which only ``dpbudget audit --expect-head`` sees, for a keyed ledger as for an unkeyed one. Rows
# rewound, deleted or moved under another record are the audit's to report, as on an unkeyed
# ledger (tests/ledger/test_base.py). Negative control: the untouched keyed ledger audits clean,
# so that a report below is the edit's.

KEY = "a key the file's holder does not have"


def _spent(path: Path) -> str:
    url = f"sqlite:///{path}"
    with Accountant(Budget(1.0), ledger=url, rng=0, simulation=True) as acc:
        for _ in range(4):
            acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    return url


def _answers(url: str) -> int:
    got = 0
    with Accountant.open(url) as acc:
        for _ in range(10):
            try:
                acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
            except Exception:
                break
            got += 1
    return got


def _canon(x: object) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"))


def _rewind(db: sqlite3.Connection) -> None:
    seq, text = db.execute("SELECT seq, record FROM entries WHERE record LIKE "
                           "'%dataset:people%' ORDER BY seq LIMIT 1").fetchone()
    state = json.loads(text)["accounts"]["dataset:people"]["state"]
    db.execute("UPDATE accounts SET seq = ?, state = ? WHERE key = 'dataset:people'",
               (seq, _canon(state)))


def _delete(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM accounts WHERE key = 'dataset:people'")


def _old_record_as_new_head(db: sqlite3.Connection) -> None:
    """Only INSERT (which the triggers allow): the text of the first record charging the
    dataset at head+1, the row set back to its state."""
    s0 = db.execute("SELECT min(seq) FROM entries WHERE record LIKE '%dataset:people%'"
                    ).fetchone()[0]
    head = db.execute("SELECT max(seq) FROM entries").fetchone()[0]
    text, digest = db.execute("SELECT record, hash FROM entries WHERE seq = ?", (s0,)).fetchone()
    db.execute("INSERT INTO entries (seq, hash, record) VALUES (?, ?, ?)", (head + 1, digest, text))
    state = json.loads(text)["accounts"]["dataset:people"]["state"]
    db.execute("UPDATE accounts SET state = ? WHERE key = 'dataset:people'", (_canon(state),))


def _older_record_under_the_rows_seq(db: sqlite3.Connection) -> None:
    """The UPDATE trigger dropped: the text of an older record charging the account put under
    the seq its row names, the row set to that record's state."""
    s0 = db.execute("SELECT min(seq) FROM entries WHERE record LIKE '%dataset:people%'"
                    ).fetchone()[0]
    last = db.execute("SELECT seq FROM accounts WHERE key = 'dataset:people'").fetchone()[0]
    text, digest = db.execute("SELECT record, hash FROM entries WHERE seq = ?", (s0,)).fetchone()
    db.execute("DROP TRIGGER entries_append_only_u")
    db.execute("UPDATE entries SET record = ?, hash = ? WHERE seq = ?", (text, digest, last))
    state = json.loads(text)["accounts"]["dataset:people"]["state"]
    db.execute("UPDATE accounts SET state = ? WHERE key = 'dataset:people'", (_canon(state),))


@pytest.mark.parametrize("edit", [_rewind, _delete, _old_record_as_new_head,
                                  _older_record_under_the_rows_seq],
                         ids=["rewound", "deleted", "old-record-as-new-head",
                              "older-record-under-the-rows-seq"])
def test_an_edited_row_of_a_keyed_ledger_is_reported_by_the_audit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        edit: Callable[[sqlite3.Connection], None]) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "l.db"
    url = _spent(path)
    assert _answers(url) == 0
    assert audit(url, key=KEY).ok  # (negative control: untouched, clean)
    with sqlite3.connect(path) as db:
        edit(db)
    report = audit(url, key=KEY)
    assert not report.ok
    assert report.exit_status & (8 | 32), [p.message for p in report.problems]  # chain or state


def test_a_rewound_policy_pointer_of_a_keyed_ledger_is_reported_by_the_audit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path = tmp_path / "p.db"
    url = f"sqlite:///{path}"
    with Accountant(Budget(10.0), ledger=url, owner_key=OWNER) as acc:
        acc.apply_policy(load_policy_text("[datasets.people]\nlimit = { epsilon = 1.0 }\n"),
                         by="owner", reason="lower", owner_key=OWNER)
    assert _answers(url) == 4
    with sqlite3.connect(path) as db:
        db.execute("UPDATE accounts SET seq = 1 WHERE key = 'policy'")
    report = audit(url, key=KEY)
    assert any("policy pointer" in p.message for p in report.problems if p.kind == "state")


def test_an_older_copy_of_the_whole_file_answers_again(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Why no check at opening: the holder of the file needs no row edit. A copy taken before
    the spend and put back after opens, answers the whole budget again and audits clean but for
    the head kept elsewhere (``expected_head``)."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    path, copy = tmp_path / "l.db", tmp_path / "copy.db"
    url = f"sqlite:///{path}"
    Accountant(Budget(1.0), ledger=url, rng=0, simulation=True).close()
    shutil.copy(path, copy)
    assert _answers(url) == 4
    with open_ledger(url) as ledger:
        head = ledger.head()[1]
    shutil.copy(copy, path)
    monkeypatch.setattr(writer, "_WRITERS", {})  # (a later process: a writer of its own)
    assert _answers(url) == 4  # the budget back, with every record authentic
    assert audit(url, key=KEY).ok
    assert not audit(url, key=KEY, expected_head=head).ok


def test_a_keyed_ledger_whose_records_carry_a_table_member_opens_and_audits_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records written by the versions that kept the commitment carry ``table`` in their hashed
    text: they stay authentic, and the ledger opens and goes on."""
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    url = _spent(tmp_path / "l.db")
    with open_ledger(url) as ledger, ledger.transaction() as tx:
        tx.append({"kind": '"note"', "accounts": "{}", "table": '"' + "ab" * 64 + '"'}, [])
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="other")
    report = audit(url, key=KEY)
    assert report.ok, [p.message for p in report.problems]


def test_two_ledger_objects_one_file_interleaved(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPBUDGET_LEDGER_KEY", KEY)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    a = Accountant(Budget(100.0), ledger=url)
    b = Accountant.open(url)
    try:
        for i in range(6):
            (a if i % 2 else b).release(Laplace(0.25, sensitivity=1.0), 1.0,
                                        dataset="people" if i % 3 else "other")
    finally:
        a.close()
        b.close()
    with Accountant.open(url) as acc:
        acc.release(Laplace(0.25, sensitivity=1.0), 1.0, dataset="people")
    assert audit(url, key=KEY).ok
