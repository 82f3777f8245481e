"""The ``dpbudget`` command line: ``policy check``, ``policy schema``, ``status --policy``, the
demo; and ``audit`` and ``status`` on damaged files, which never end in a traceback (issue 31).

A fuzz over 200 damaged copies (fixed seed 31) of a small SQLite ledger and of its JSONL export:
a byte flipped at a random offset (130 copies: 100 of the ledger, 30 of the export), the file
truncated (35: 20 of the ledger, 15 of the export), 4 random bytes over the 100-byte header (15),
and a ledger copied while open with its ``-wal``/``-shm`` deleted, flipped or truncated (20). Each
command runs in process through ``main(argv)``: ``audit`` ends with its documented exit bits (or
2, the command line's own, for a file it cannot open), ``status`` with 0 or a typed message and
2; nothing escapes ``main``. Found by it, and fixed: a damaged entries table that repeats rows
made ``SqlLedger.entries`` page forever (the audit hung), NULL or mistyped rows and unreadable
stored states and records ended ``status`` in a TypeError, KeyError or JSONDecodeError.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import random
import shutil
from pathlib import Path

import pytest

from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant import cli
from dpbudget.accountant.cli import main
from dpbudget.accountant.audit.run import EXIT_BITS
from dpbudget.accountant.values.errors import LedgerCorruptedError
from dpbudget.accountant.ledger import SqliteLedger, open_ledger, sql
from dpbudget.accountant.ledger.entry import Entry
from dpbudget.accountant.audit.transfer import export_jsonl
from dpbudget.mechanisms import Laplace
from tests.support import HALVER_MODULE

SEED = 31
DOCUMENTED = sum(set(EXIT_BITS.values()))


def _run(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` in process: its exit status and what it wrote to stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)  # an exception here is the traceback the test forbids
    return rc, err.getvalue()


def _release(acc: Accountant, n: int) -> None:
    for i in range(n):
        acc.release(Laplace(0.05, sensitivity=1.0), 1.0, dataset=f"d{i % 3}", label=f"q{i}")


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    """A closed ledger, its JSONL export, and a ledger copied (with -wal, -shm) while open."""
    root = tmp_path_factory.mktemp("originals")
    acc = Accountant(Budget(2.0), ledger=f"sqlite:///{root / 'l.db'}")
    _release(acc, 8)
    acc.close()
    with open_ledger(root / "l.db", create=False) as ledger:
        export_jsonl(ledger, root / "l.jsonl")
    live = root / "live"
    live.mkdir()
    acc = Accountant(Budget(2.0), ledger=f"sqlite:///{live / 'l.db'}")
    _release(acc, 8)
    for suffix in ("", "-wal", "-shm"):  # (the recent commits are in the WAL still)
        shutil.copyfile(live / f"l.db{suffix}", root / f"open.db{suffix}")
    acc.close()
    return {"db": root / "l.db", "jsonl": root / "l.jsonl", "open": root / "open.db"}


def _damaged(originals: dict[str, Path], folder: Path) -> list[tuple[str, Path]]:
    """The 200 damaged copies: (what was done, the file to run the commands on)."""
    rng = random.Random(SEED)
    plan = ([("flip", "db")] * 100 + [("flip", "jsonl")] * 30 + [("truncate", "db")] * 20
            + [("truncate", "jsonl")] * 15 + [("header", "db")] * 15
            + [(what, "open") for what in ("no-wal", "no-shm", "neither", "wal-flip")] * 5)
    cases = []
    for n, (what, which) in enumerate(plan):
        source = originals[which]
        target = folder / str(n) / source.name
        target.parent.mkdir()
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{source}{suffix}").exists():
                shutil.copyfile(f"{source}{suffix}", f"{target}{suffix}")
        data = bytearray(target.read_bytes())
        if what == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif what == "truncate":
            data = data[:rng.randrange(len(data))]
        elif what == "header":
            at = rng.randrange(96)
            data[at:at + 4] = rng.randbytes(4)
        target.write_bytes(bytes(data))
        if what in ("no-wal", "neither"):
            Path(f"{target}-wal").unlink()
        if what in ("no-shm", "neither"):
            Path(f"{target}-shm").unlink()
        if what == "wal-flip":
            wal = bytearray(Path(f"{target}-wal").read_bytes())
            wal[rng.randrange(len(wal))] ^= 1 << rng.randrange(8)
            Path(f"{target}-wal").write_bytes(bytes(wal))
        cases.append((f"{what} {which} #{n}", target))
    return cases


def _commands(path: Path) -> list[list[str]]:
    return [["audit", str(path)]] + ([["status", str(path)]] if path.suffix == ".db" else [])


def test_audit_and_status_end_in_exit_bits_or_a_typed_message_on_200_damaged_copies(
        originals, tmp_path):
    cases = _damaged(originals, tmp_path)
    assert len(cases) == 200
    flagged = 0
    for what, path in cases:
        for argv in _commands(path):
            rc, err = _run(argv)
            assert "Traceback" not in err, what
            if argv[0] == "audit":
                assert rc == 2 or rc & ~DOCUMENTED == 0, (what, rc)
            else:
                assert rc in (0, 2), (what, rc)
            if rc == 2:
                assert err.startswith(f"dpbudget {argv[0]}: "), (what, err)
            flagged += argv[0] == "audit" and rc != 0
    assert flagged >= 100  # most damage is seen (a flip in free space may not be)


def test_negative_control_without_the_fixes_damage_escapes_as_a_traceback(originals, tmp_path,
                                                                            monkeypatch):
    """With the command line's net and the row checks taken out, the same copies raise out of
    ``main`` (what the test above would report)."""
    monkeypatch.setattr(cli, "_DAMAGE", ())
    monkeypatch.setattr(sql, "account_row", lambda row: sql.Account(
        row[0], row[1], json.loads(row[2]), json.loads(row[3]), row[4]))
    escaped = 0
    for _, path in _damaged(originals, tmp_path)[:130]:  # (the flips: no repeating rows)
        for argv in _commands(path):
            try:
                _run(argv)
            except Exception:
                escaped += 1
    assert escaped > 0


class _Repeating:
    """A connection over a damaged table whose rows come back 1, 2, then seq 0 with NULLs,
    whatever page is asked for (what SQLite gave on one of the fuzzed copies)."""

    def execute(self, query, args):
        return self

    def fetchall(self):
        return [(1, "{}", "a" * 64), (2, "{}", "b" * 64), (0, None, None)]


def test_entries_of_a_table_that_repeats_rows_end_with_a_typed_error(tmp_path, monkeypatch):
    ledger = SqliteLedger(tmp_path / "l.db")
    monkeypatch.setattr(ledger, "_execute", _Repeating().execute)
    with pytest.raises(LedgerCorruptedError, match="entries table is damaged after record 2"):
        list(ledger.entries())
    ledger.close()


def test_negative_control_unchecked_rows_page_forever(tmp_path, monkeypatch):
    ledger = SqliteLedger(tmp_path / "l.db")
    monkeypatch.setattr(ledger, "_execute", _Repeating().execute)
    monkeypatch.setattr(sql, "_entry", lambda row, after: Entry(*row))
    assert len(list(itertools.islice(ledger.entries(), 1000))) == 1000  # (it never ends)
    ledger.close()


# --- policy check, policy schema, status --policy, the demo ---

GOOD = """
    [datasets.adult]
    limit = { epsilon = 1.0, delta = 1e-6 }
    allowed_mechanisms = ["Laplace", "AnalyticGaussian"]
    max_per_query = { epsilon = 0.5 }
    period = "1d"
    [datasets.adult.analysts.alice]
    limit = { epsilon = 0.5 }
"""


def test_policy_check_valid(write, capsys):
    assert main(["policy", "check", str(write(GOOD))]) == 0
    out = capsys.readouterr().out
    assert "valid policy, 1 dataset(s), 2 limit(s)" in out
    assert "dataset:adult/analyst:alice" in out and "renewed every 1d" in out
    assert "AnalyticGaussian" in out and "warning" not in out


def test_policy_check_invalid(write, capsys):
    f = write('[datasets.adult]\nlimit = { epsilon = -1 }')
    assert main(["policy", "check", str(f)]) == 1
    err = capsys.readouterr().err
    assert "datasets.adult.limit.epsilon: must be a finite number >= 0" in err
    assert "got -1" in err


def test_policy_check_duplicate_json(tmp_path, capsys):
    f = tmp_path / "p.json"
    f.write_text('{"datasets": {"adult": {}, "adult": {}}}')
    assert main(["policy", "check", str(f)]) == 1
    assert "datasets.adult: is given twice" in capsys.readouterr().err


def test_policy_schema(capsys):
    assert main(["policy", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "datasets" in schema["properties"]


def test_status_with_policy_marks_over_limit_accounts(write, tmp_path, capsys):
    db = tmp_path / "b.db"
    with Accountant.from_policy(write(GOOD.replace('period = "1d"', "")), ledger=db, rng=0,
                                simulation=True) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="adult", analyst="alice")
        acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="adult")
    lowered = write(GOOD.replace('period = "1d"', "").replace("epsilon = 1.0,", "epsilon = 0.6,"))
    assert main(["status", str(db), "--policy", str(lowered)]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.strip().startswith("dataset:adult "))
    assert "OVER LIMIT" in line and "0.6" in line
    assert "refuse every release: dataset:adult" in out
    assert main(["status", str(db), "--policy", str(lowered), "--json"]) == 0
    rows = {r["account"]: r for r in json.loads(capsys.readouterr().out)["accounts"]}
    assert rows["dataset:adult"]["over_limit"] is True
    assert rows["dataset:adult/analyst:alice"]["over_limit"] is False
    assert main(["status", str(db)]) == 0
    assert "OVER LIMIT" not in capsys.readouterr().out  # without a policy: the recorded limits


def test_status_with_a_bad_policy(write, tmp_path, capsys):
    db = tmp_path / "b.db"
    Accountant(ledger=db).close()
    assert main(["status", str(db), "--policy", str(write("[datasets.adult]\nx = 1"))]) == 2
    assert "datasets.adult.x: is not a known key" in capsys.readouterr().err


def test_demo_uses_the_policy_an_analyst_and_a_pipeline(tmp_path):
    from examples.demo import run

    out = io.StringIO()
    acc = run(str(tmp_path / "demo.db"), seed=3, out=out)
    text = out.getvalue()
    assert "policy.toml" in text and "income-report" in text
    assert any(line.startswith("  refused: release refused on dataset:people/analyst:alice")
               for line in text.splitlines()[-5:])
    assert f"dpbudget audit {tmp_path / 'demo.db'}" in text
    kinds = [e.record["kind"] for e in acc.ledger.entries()]
    assert kinds.count("pipeline") == 1
    assert any(e.record.get("pipeline", "").startswith("income-report#") and
               e.record["kind"] == "release" for e in acc.ledger.entries())
    assert all(e.record["analyst"] == "alice" for e in acc.ledger.entries()
               if e.record["kind"] != "policy")
    acc.close()
    assert len(text.splitlines()) < 25  # short and clear


def test_income_report_example(capsys):
    import examples.income_report as example

    assert example.main() == 0
    assert "pipeline income-report#1" in capsys.readouterr().out


def test_public_names_are_exported():
    from dpbudget import accountant
    from dpbudget import policies

    for module in (accountant, policies):
        for name in module.__all__:
            assert getattr(module, name) is not None
    for name in ("Pipeline", "PolicyError", "UnknownAnalystError"):
        assert name in accountant.__all__
    for name in ("Policy", "DatasetLimit", "AnalystLimit", "Cap", "Period", "load_policy",
                 "policy_schema"):
        assert name in policies.__all__


def test_policy_check_catches_contradictions(write, capsys):
    """Issue 16: a misspelled mechanism is an error with a suggestion; a cap above its limit
    and an analyst limit above the dataset's are warnings with their own exit status (3); a
    misspelled top-level table names the key and suggests the right one."""
    bad = write('[datasets.a]\nlimit = { epsilon = 1.0 }\nallowed_mechanisms = ["Gausian"]\n')
    assert main(["policy", "check", str(bad)]) == 1
    assert "did you mean 'Gaussian'?" in capsys.readouterr().err
    moot = write('[datasets.a]\nlimit = { epsilon = 1.0 }\nmax_per_query = { epsilon = 2.0 }\n'
                 '[datasets.a.analysts.bob]\nlimit = { epsilon = 3.0 }\n')
    assert main(["policy", "check", str(moot)]) == 3
    out = capsys.readouterr().out
    assert "max_per_query" in out and "analysts.bob.limit" in out and out.count("warning") == 2
    typo = write('[dataset.people]\nlimit = { epsilon = 1.0 }\n')
    assert main(["policy", "check", str(typo)]) == 1
    assert "dataset: is not a known key; did you mean 'datasets'?" in capsys.readouterr().err


def test_policy_check_imports_custom_mechanisms(write, tmp_path, monkeypatch, capsys):
    module = tmp_path / "my_mechs.py"
    module.write_text(HALVER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = write('[datasets.a]\nlimit = { epsilon = 1.0 }\n'
                   'allowed_mechanisms = ["my_mechs.Halver"]\n')
    assert main(["policy", "check", str(policy), "--import", "my_mechs"]) == 0
    # A custom class is named by its module and class: its bare name is refused, with the hint.
    bare = write('[datasets.a]\nlimit = { epsilon = 1.0 }\nallowed_mechanisms = ["Halver"]\n')
    capsys.readouterr()
    assert main(["policy", "check", str(bare), "--import", "my_mechs"]) == 1
    assert "did you mean 'my_mechs.Halver'?" in capsys.readouterr().err
    assert main(["policy", "check", str(policy), "--import", "no_such_module_x"]) == 2
