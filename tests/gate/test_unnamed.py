"""Issue 30: a dataset is never implicit once the accountant knows a named one.

``release(m, x, dataset="survey"); release(m, x)`` used to admit both under a limit of 1.0 (the
second on a fresh "default" budget). A request without ``dataset=`` is now taken for "default"
only while no other dataset is known (``dpbudget.accountant.gate.unnamed``); otherwise it is refused before
anything is drawn or debited. ``dpbudget status`` and the audit show each dataset that appeared
under a default limit, so that a misspelt name shows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import dpbudget.accountant.gate.planner as planner_module
from dpbudget.accountant import Accountant, Budget
from dpbudget.accountant.cli import main
from dpbudget.accountant.values.errors import InvalidArgumentError
from dpbudget.accountant.gate.unnamed import NOT_GIVEN
from dpbudget.mechanisms import AboveThreshold, Laplace, group_by, noisy_mean, noisy_quantiles
from tests.support import snapshot


def _acc(**kw) -> tuple[Accountant, np.random.Generator]:
    rng = np.random.default_rng(30)
    return Accountant(Budget(1.0), rng=rng, **kw), rng


def test_the_issue_reproduction_is_refused() -> None:
    acc, rng = _acc()
    acc.release(Laplace(0.9, sensitivity=1.0), 1.0, dataset="survey")
    before = snapshot(acc.ledger, rng)
    with pytest.raises(InvalidArgumentError) as refused:
        acc.release(Laplace(0.9, sensitivity=1.0), 1.0)
    assert refused.value.argument == "dataset" and "['survey']" in str(refused.value)
    assert snapshot(acc.ledger, rng) == before  # nothing drawn, nothing debited


def test_negative_control_the_old_default_lets_it_through(monkeypatch) -> None:
    """With "not given" taken for "default" again, the issue's figure comes back: 1.8 spent on
    one population under a limit of 1.0."""
    from dpbudget.accountant.gate.gate import Gate

    monkeypatch.setattr(planner_module, "named",
                        lambda dataset, known: "default" if dataset is NOT_GIVEN else dataset)
    monkeypatch.setattr(Gate, "_no_twin", lambda self, key: None)  # (the debit's own look)
    acc, _ = _acc()
    acc.release(Laplace(0.9, sensitivity=1.0), 1.0, dataset="survey")
    acc.release(Laplace(0.9, sensitivity=1.0), 1.0)
    assert acc.spent("survey").epsilon + acc.spent("default").epsilon == pytest.approx(1.8)


def test_every_entry_point_refuses_once_a_dataset_is_named() -> None:
    acc, rng = _acc()
    acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="survey")
    before = snapshot(acc.ledger, rng)
    calls = {
        "release": lambda: acc.release(Laplace(0.1, sensitivity=1.0), 1.0),
        "release_many": lambda: acc.release_many([(Laplace(0.1, sensitivity=1.0), 1.0)]),
        "session": lambda: acc.session(AboveThreshold(epsilon=0.1, threshold=1.0, sensitivity=1.0)),
        "pipeline": lambda: acc.pipeline("p", budget=Budget(0.1)),
        "budgeted": lambda: acc.budgeted("b", budget=Budget(0.1))(lambda p: None)(),
        "can_afford": lambda: acc.can_afford(Laplace(0.1, sensitivity=1.0)),
        "max_releases": lambda: acc.max_releases(Laplace(0.1, sensitivity=1.0)),
        "spent": lambda: acc.spent(),
        "remaining": lambda: acc.remaining(),
        "limit": lambda: acc.limit(),
        # the query helpers pass dataset= on only when given: they pick no default either
        "noisy_mean": lambda: noisy_mean(acc, [1.0, 2.0], 0.0, 3.0, epsilon=0.1),
        "noisy_quantiles": lambda: noisy_quantiles(acc, [1.0], [0.5], 0.0, 3.0, epsilon=0.1),
        "group_by": lambda: group_by(acc, ["a"], ["a"], epsilon=0.1),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidArgumentError, match="'dataset' must be given") as refused:
            call()
        assert refused.value.argument == "dataset", name
    assert snapshot(acc.ledger, rng) == before
    # Nor is a "default" budget opened beside "survey" when named: it is the budget of a ledger
    # with no named dataset, never a second one.
    with pytest.raises(InvalidArgumentError, match="beside which no 'default' opens"):
        acc.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset="default")
    assert snapshot(acc.ledger, rng) == before


def test_honest_single_dataset_use_needs_no_dataset() -> None:
    acc, _ = _acc()
    assert acc.can_afford(Laplace(0.25, sensitivity=1.0)) and acc.max_releases(Laplace(0.25, sensitivity=1.0)) == 4
    acc.release(Laplace(0.25, sensitivity=1.0), 1.0)
    acc.release_many([(Laplace(0.25, sensitivity=1.0), 1.0)])
    with acc.pipeline("p", budget=Budget(0.25)) as p:
        p.release(Laplace(0.25, sensitivity=1.0), 1.0)
    assert acc.spent() == Budget(0.75) and acc.remaining() == Budget(0.25)
    noisy_mean(acc, [1.0, 2.0], 0.0, 3.0, epsilon=0.125)
    assert acc.spent() == Budget(0.875)
    # two releases, the pipeline's allocation, the release inside it, the mean: on "default"
    assert [e.record["dataset"] for e in acc.ledger.entries() if "dataset" in e.record] == \
        ["default"] * 5


def test_declared_datasets_make_dataset_required() -> None:
    """``limits={"adult": ...}`` with a default ``limit``: an unnamed release used to go to a
    fresh "default" budget beside "adult"; now it is refused, listing "adult"."""
    acc = Accountant(Budget(1.0), limits={"adult": Budget(1.0)}, rng=0)
    with pytest.raises(InvalidArgumentError, match=r"\['adult'\]"):
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    only_default = Accountant(limits={"default": Budget(1.0)}, rng=0)
    only_default.release(Laplace(0.5, sensitivity=1.0), 1.0)
    assert only_default.spent() == Budget(0.5)


def test_a_reopened_ledger_knows_the_datasets_it_charged(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Accountant(Budget(1.0), ledger=url) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0, dataset="survey")
    with Accountant(Budget(1.0), ledger=url) as acc:
        with pytest.raises(InvalidArgumentError, match=r"\['survey'\]"):
            acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    # Negative control: a ledger that only ever charged "default" still takes unnamed releases.
    plain = f"sqlite:///{tmp_path / 'p.db'}"
    with Accountant(Budget(1.0), ledger=plain) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
    with Accountant(Budget(1.0), ledger=plain) as acc:
        acc.release(Laplace(0.5, sensitivity=1.0), 1.0)
        assert acc.spent() == Budget(1.0)


def test_status_and_audit_show_each_new_dataset(tmp_path, capsys) -> None:
    """A typo under a default limit ("survy") gets a budget of its own; status marks it a new
    dataset and the audit lists the record that first charged it. Negative control: a dataset
    the policy declares is not marked new."""
    policy = tmp_path / "p.toml"
    policy.write_text("[datasets.survey]\nlimit = { epsilon = 1.0 }\n"
                      "[other_datasets]\nlimit = { epsilon = 1.0 }\n")
    db = tmp_path / "l.db"
    with Accountant.from_policy(policy, ledger=f"sqlite:///{db}") as acc:
        acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="survey")
        acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="survy")
        acc.release(Laplace(0.3, sensitivity=1.0), 1.0, dataset="survey")
    capsys.readouterr()
    assert main(["status", str(db), "--json"]) == 0
    rows = {r["account"]: r for r in json.loads(capsys.readouterr().out)["accounts"]}
    assert rows["dataset:survy"]["new_dataset"] and not rows["dataset:survey"]["new_dataset"]
    assert main(["status", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines if "new dataset" in line] == ["dataset:survy"]
    assert main(["audit", str(db), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["datasets_first"]
    assert {name: seq for name, (seq, _) in first.items()} == {"survey": 2, "survy": 3}
    assert main(["audit", str(db)]) == 0
    text = capsys.readouterr().out
    assert "datasets first charged" in text and "survy" in text.split("datasets first")[1]


# -- found by review of the merged change ---------------------------------------------------------


def test_a_second_accountant_on_the_ledger_opens_no_default_beside_a_named_one(
        tmp_path, monkeypatch) -> None:
    """Two accountants open one ledger; one charges "survey", then the other releases without
    dataset=. It knew no dataset when it opened, so only the debit's own look at the ledger can
    refuse: 0.9 on "survey" and 0.9 on a fresh "default" would be 1.8 under 1.0."""
    from dpbudget.accountant.gate.gate import Gate

    url = f"sqlite:///{tmp_path / 'l.db'}"
    a, b = Accountant(Budget(1.0), ledger=url), Accountant(Budget(1.0), ledger=url)
    a.release(Laplace(0.9, sensitivity=1.0), 1.0, dataset="survey")
    with pytest.raises(InvalidArgumentError) as refused:
        b.release(Laplace(0.9, sensitivity=1.0), 1.0)
    assert refused.value.argument == "dataset" and "'survey'" in str(refused.value)
    with pytest.raises(InvalidArgumentError):  # (and it now knows "survey")
        b.release(Laplace(0.9, sensitivity=1.0), 1.0)
    assert {k.key for k in b.ledger.accounts()} >= {"dataset:survey"}
    assert "dataset:default" not in {k.key for k in b.ledger.accounts()}
    # Negative control: without the debit's look (the twin check), the fresh budget opens.
    monkeypatch.setattr(Gate, "_no_twin", lambda self, key: None)
    c = Accountant(Budget(1.0), ledger=url)
    monkeypatch.setattr(c._gate.planner, "_known", set())  # (as if opened before "survey")
    c.release(Laplace(0.9, sensitivity=1.0), 1.0)
    assert c.spent("default").epsilon + a.spent("survey").epsilon == pytest.approx(1.8)


def test_the_marker_survives_copies_and_pickles() -> None:
    import copy
    import pickle

    assert copy.deepcopy(NOT_GIVEN) is NOT_GIVEN and copy.copy(NOT_GIVEN) is NOT_GIVEN
    assert pickle.loads(pickle.dumps(NOT_GIVEN)) is NOT_GIVEN


def test_a_pipeline_takes_the_marker_for_its_own_dataset() -> None:
    acc, _ = _acc()
    with acc.pipeline("p", dataset="survey", budget=Budget(0.5)) as p:
        p.release(Laplace(0.1, sensitivity=1.0), 1.0, dataset=NOT_GIVEN)  # (what the training helpers pass)
        assert p.spent().epsilon == pytest.approx(0.1)


def test_a_refused_unnamed_release_is_logged_under_default(caplog) -> None:
    acc, _ = _acc()
    with caplog.at_level("WARNING", logger="dpbudget.ledger.refusals"):
        with pytest.raises(Exception):
            acc.release(Laplace(2.0, sensitivity=1.0), 1.0)
    assert caplog.records and "not given" not in caplog.text and "default" in caplog.text
