"""``dpbudget policy check``, ``policy schema``, ``status --policy``, and the demo."""

from __future__ import annotations

import io
import json

import pytest

from dpbudget.accountant import Accountant
from dpbudget.accountant.cli import main
from dpbudget.mechanisms import Laplace
from tests.support import HALVER_MODULE

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
