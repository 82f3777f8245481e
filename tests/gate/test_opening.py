"""Seeded randomness never reaches a durable ledger unless the ledger was created for simulation
and says so in its first record.

The attack (measured on the code before this change): an accountant on an SQLite ledger with
``rng=SEED`` releases 123.456 with Laplace noise; anyone who knows the seed draws the same noise
on a zero and subtracts it, recovering the true value to 1e-11, and the audit exited 0. Here the
seeded opening is refused (``rng``, nothing opened or written), and a ledger into which seeded
noise got by the old path (re-created with monkeypatch: the negative control, which also shows
the attack working) is flagged by the audit as a ``release`` problem, exit bit 16. A simulation
ledger (``simulation=True`` when created) accepts seeds, audits clean and says it is one; no
ledger becomes one later, and none stops being one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpbudget.accountant import Accountant, Budget, InvalidArgumentError, InvalidTypeError
from dpbudget.accountant.gate import opening
from dpbudget.accountant.audit.run import EXIT_BITS, audit
from dpbudget.accountant.cli import main as cli
from dpbudget.accountant.ledger import Ledger, MemoryLedger, SqliteLedger, canonical
from dpbudget.mechanisms import Laplace
from tests.support import OWNER

SECRET = 123.456
SEED = 2024


def _noise_for(seed: Any) -> float:
    """What an attacker who knows the seed computes: the same draw on a zero."""
    return float(Accountant(Budget(10.0), rng=seed).release(Laplace(1.0, sensitivity=1.0), 0.0))


def _old_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The code before this change: no check of the seed against the ledger."""
    monkeypatch.setattr(opening, "_refuse_seed", lambda ledger, sampler, simulation: None)


@pytest.mark.parametrize("seed", [SEED, "generator"])
def test_the_seed_attack_is_refused_and_nothing_is_opened(tmp_path: Path, seed: Any) -> None:
    path = tmp_path / "budget.db"
    rng = np.random.default_rng(SEED) if seed == "generator" else seed
    with pytest.raises(InvalidArgumentError) as refused:
        Accountant(Budget(10.0), ledger=f"sqlite:///{path}", rng=rng)
    assert refused.value.argument == "rng"
    assert "simulation=True" in str(refused.value)
    assert not path.exists()  # nothing opened, nothing created
    with pytest.raises(InvalidArgumentError, match="'rng'"):
        Accountant(Budget(10.0), ledger=str(path), rng=rng)  # a plain path is SQLite too
    assert not path.exists()


def test_every_way_of_opening_refuses_a_seed_on_a_durable_ledger(ledger_opener: Any,
                                                                   tmp_path: Path) -> None:
    ledger: Ledger = ledger_opener()
    if not ledger.durable:
        Accountant(Budget(1.0), ledger=ledger, rng=SEED).release(Laplace(1.0, sensitivity=1.0), 1.0)
        return  # the in-memory ledger takes seeds, as before
    Accountant(Budget(1.0), ledger=ledger).release(Laplace(1.0, sensitivity=1.0), 1.0)  # an honest ledger
    head = ledger.head()
    policy = tmp_path / "p.toml"
    policy.write_text("[datasets.default]\nlimit = { epsilon = 1.0 }\n")
    for attempt in (lambda: Accountant(Budget(1.0), ledger=ledger, rng=SEED),
                    lambda: Accountant.from_policy(policy, ledger=ledger, rng=SEED),
                    lambda: Accountant.open(ledger, rng=np.random.default_rng(SEED))):
        with pytest.raises(InvalidArgumentError) as refused:
            attempt()
        assert refused.value.argument == "rng"
    assert ledger.head() == head  # nothing written
    # The caller's flag cannot make it a simulation ledger: its first record says it is not.
    with pytest.raises(InvalidArgumentError) as refused:
        Accountant(Budget(1.0), ledger=ledger, rng=SEED, simulation=True)
    assert refused.value.argument == "simulation"
    assert ledger.head() == head and not ledger.simulation


def test_negative_control_the_old_path_leaks_and_the_audit_flags_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    _old_path(monkeypatch)
    with Accountant(Budget(10.0), ledger=url, rng=SEED) as acc:
        noisy = acc.release(Laplace(1.0, sensitivity=1.0), SECRET)
    monkeypatch.undo()
    assert abs((noisy - _noise_for(SEED)) - SECRET) < 1e-11  # the attack, as measured on main
    report = audit(url)
    assert not report.simulation
    assert report.problem_kinds == ["release"] and report.exit_status == EXIT_BITS["release"]
    assert report.problems[0].seq == 2 and "seeded noise" in report.problems[0].message
    assert cli(["audit", url]) == 16
    assert "seeded noise" in capsys.readouterr().out


def test_a_simulation_ledger_takes_a_seed_audits_clean_and_says_so(
        ledger_opener: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ledger: Ledger = ledger_opener()
    if not ledger.durable:
        pytest.skip("the in-memory ledger needs no simulation flag")
    acc = Accountant(Budget(10.0), ledger=ledger, rng=SEED, simulation=True)
    noisy = acc.release(Laplace(1.0, sensitivity=1.0), SECRET)
    assert noisy == Accountant(Budget(10.0), rng=SEED).release(Laplace(1.0, sensitivity=1.0), SECRET)  # seeded
    first = json.loads(next(iter(ledger.entries())).text)
    assert first["kind"] == "policy" and first["simulation"] is True
    assert ledger.simulation
    # Reopened: a seed again takes the flag, which this ledger accepts.
    Accountant.open(ledger, rng=SEED + 1, simulation=True).release(Laplace(1.0, sensitivity=1.0), 1.0)
    report = audit(ledger)
    assert report.ok and report.simulation and report.exit_status == 0
    assert report.by_noise["exact-seeded"].releases == 2
    if isinstance(ledger, SqliteLedger):
        assert cli(["status", ledger.url]) == 0
        assert "SIMULATION ledger" in capsys.readouterr().out
        assert cli(["status", ledger.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["simulation"] is True
        assert cli(["audit", ledger.url]) == 0
        assert "SIMULATION ledger" in capsys.readouterr().out


def test_a_ledger_never_stops_being_a_simulation_ledger(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sim.db'}"
    Accountant(Budget(10.0), ledger=url, rng=SEED, simulation=True, owner_key=OWNER).close()
    with Accountant(Budget(10.0), ledger=url) as plain:  # opened without the flag or a seed
        plain.release(Laplace(1.0, sensitivity=1.0), 1.0)
        plain.apply_policy(_policy(tmp_path), by="owner", reason="a later policy record",
                           owner_key=OWNER)
    with SqliteLedger(tmp_path / "sim.db") as ledger:
        assert ledger.simulation
    assert audit(url).simulation


def test_no_later_record_makes_a_ledger_a_simulation_ledger(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'real.db'}"
    Accountant(Budget(10.0), ledger=url).close()
    with SqliteLedger(tmp_path / "real.db") as ledger:
        with ledger.transaction() as tx:  # a record that says so, written after the first
            tx.append({"kind": '"note"', "simulation": "true", "cost": canonical(
                {"epsilon": 0.0, "delta": 0.0, "rho": None, "mu": None}), "accounts": "{}"}, [])
        assert not ledger.simulation
    with pytest.raises(InvalidArgumentError) as refused:
        Accountant(Budget(10.0), ledger=url, rng=SEED, simulation=True)
    assert refused.value.argument == "simulation"
    assert not audit(url).simulation


def test_a_forged_first_record_is_no_simulation_ledger(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded noise in a ledger whose first record was edited to say "simulation": the edit
    breaks the chain and, unverified, the first record does not make it a simulation ledger."""
    path = tmp_path / "real.db"
    _old_path(monkeypatch)
    Accountant(Budget(10.0), ledger=f"sqlite:///{path}", rng=SEED).release(Laplace(1.0, sensitivity=1.0), 1.0)
    monkeypatch.undo()
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER entries_append_only_u")
    text = conn.execute("SELECT record FROM entries WHERE seq = 1").fetchone()[0]
    conn.execute("UPDATE entries SET record = ? WHERE seq = 1",
                 (text.replace('"kind":"policy"', '"kind":"policy","simulation":true'),))
    conn.commit()
    conn.close()
    with SqliteLedger(path) as ledger:
        assert not ledger.simulation
    report = audit(f"sqlite:///{path}")
    assert not report.simulation
    assert report.exit_status & EXIT_BITS["chain"] and report.exit_status & EXIT_BITS["release"]


def test_the_in_memory_ledger_takes_seeds_as_before() -> None:
    a = Accountant(Budget(10.0), rng=SEED).release(Laplace(1.0, sensitivity=1.0), SECRET)
    b = Accountant(Budget(10.0), ledger=MemoryLedger(), rng=SEED).release(Laplace(1.0, sensitivity=1.0), SECRET)
    c = Accountant(Budget(10.0), ledger="memory://", rng=SEED,
                   simulation=True).release(Laplace(1.0, sensitivity=1.0), SECRET)
    assert a == b == c
    with pytest.raises(InvalidTypeError) as refused:
        Accountant(Budget(10.0), rng=SEED, simulation="yes")  # type: ignore[arg-type]
    assert refused.value.argument == "simulation"


def test_a_simulation_ledger_without_a_seed_is_created_by_the_flag_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sim.db'}"
    with Accountant(Budget(1.0), ledger=url, simulation=True) as acc:
        acc.release(Laplace(1.0, sensitivity=1.0), 1.0)
        assert acc.ledger.simulation
    report = audit(url)
    assert report.ok and report.simulation


def test_the_demo_with_a_seed_runs_on_a_simulation_ledger(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpbudget.examples.demo import main as demo

    seeded, plain = tmp_path / "seeded.db", tmp_path / "plain.db"
    assert demo(["--ledger", str(seeded), "--seed", "3"]) == 0
    assert demo(["--ledger", str(plain)]) == 0
    capsys.readouterr()
    for path, simulation in ((seeded, True), (plain, False)):
        report = audit(f"sqlite:///{path}")
        assert report.ok and report.simulation is simulation
    # An existing, real ledger cannot be turned into a simulation by the demo's seed.
    with SqliteLedger(plain) as ledger:
        head = ledger.head()
    with pytest.raises(InvalidArgumentError):
        demo(["--ledger", str(plain), "--seed", "3"])
    with SqliteLedger(plain) as ledger:
        assert ledger.head() == head


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "later.toml"
    path.write_text("[datasets.default]\nlimit = { epsilon = 5.0 }\n")
    return path
