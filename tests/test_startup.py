"""Cheap start (issue 30): SciPy, pydantic and the other heavy modules load when something needs
them, not when the package or the command line starts.

Each check runs a fresh interpreter and reads ``sys.modules`` — what was loaded, never how long it
took (benchmarks/startup.py measures the time). The negative controls run the same probe after a
step that does need SciPy, so a probe that could not see a lazy import would fail them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_HEAVY = ("scipy", "matplotlib", "pandas", "psycopg", "cryptography")

# Prints which of the heavy top-level modules (and which of the listed ones) are loaded.
_PROBE = ("import json, sys\n"
          "heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads(sys.argv[1])))\n"
          "print(json.dumps(heavy))\n")


def _loaded(code: str, watch: tuple[str, ...] = _HEAVY, cwd: Path | None = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + "\n" + _PROBE, json.dumps(list(watch))],
                         capture_output=True, text=True, check=True, cwd=cwd).stdout
    loaded: list[str] = json.loads(out.strip().splitlines()[-1])
    return loaded


_FIRST_RELEASE = ("import dpbudget as dp\n"
                  "acc = dp.Accountant(dp.Budget(1.0), rng=0)\n"
                  "acc.release(dp.Laplace(1.0, sensitivity=1.0), 1.0)\n")


def test_import_dpbudget_loads_no_scipy() -> None:
    assert _loaded("import dpbudget") == []


def test_first_laplace_release_loads_nothing_heavy() -> None:
    assert _loaded(_FIRST_RELEASE) == []


def test_first_release_on_an_sqlite_ledger_loads_nothing_heavy(tmp_path: Path) -> None:
    code = ("import dpbudget as dp\n"
            "with dp.Accountant(dp.Budget(1.0), ledger='l.db') as acc:\n"
            "    acc.release(dp.Laplace(1.0, sensitivity=1.0), 1.0, dataset='d')\n")
    assert _loaded(code, cwd=tmp_path) == []


def test_every_package_imports_without_scipy() -> None:
    """Every module that used SciPy imported it at module level; none does now (the mechanisms'
    package face imports every mechanism module, the composition package every rule)."""
    code = ("import dpbudget.mechanisms, dpbudget.policies, dpbudget.accountant.gate.accountant, "
            "dpbudget.accountant.composition, dpbudget.accountant.values.rdp, "
            "dpbudget.accountant.composition.bounds, dpbudget.accountant.composition.privacy_loss, "
            "dpbudget.mechanisms.calibration, dpbudget.mechanisms.discrete, "
            "dpbudget.mechanisms.sampling")
    assert _loaded(code) == []


def test_negative_control_the_probe_sees_scipy_once_a_step_needs_it() -> None:
    """A Gaussian draw needs ``ndtri`` and calibration ``log_ndtr``: the probe must then report
    SciPy, and the calibrated σ is the one the docs give (Balle–Wang, ε = 1, δ = 1e-5)."""
    code = (_FIRST_RELEASE
            + "from dpbudget.mechanisms.sampling import Sampler\n"
            "from dpbudget.mechanisms.calibration import analytic_gaussian_sigma\n"
            "assert abs(Sampler(7).gaussian(2.0)) < 20.0\n"
            "assert round(analytic_gaussian_sigma(1.0, 1e-5), 6) == 3.730632\n")
    assert _loaded(code) == ["scipy"]


def test_negative_control_each_deferred_scipy_use_still_runs() -> None:
    """The deferred imports run: the composition bounds, the PLD, the RDP series and the discrete
    Gaussian each load SciPy on their first call and return a finite number."""
    for code in (
            "from dpbudget.accountant.composition import bounds\n"
            "assert bounds.kov_delta(10, 0.1, 0.5) >= 0.0\n"
            "assert 0.0 < bounds.cks_epsilon(0.5, 1e-6) < 10.0",
            "from dpbudget.accountant.composition import privacy_loss\n"
            "assert 0.0 < privacy_loss.delta(0.01, 1.1, 4, 1.0) < 1.0",
            "from dpbudget.accountant.values import rdp\n"
            "assert rdp._log_a_int(0.01, 1.1, 8) > 0.0 and rdp._log_a_frac(0.01, 1.1, 8.5) > 0.0",
            "from dpbudget.mechanisms import discrete_gaussian_sigma\n"
            "assert 3.0 < discrete_gaussian_sigma(1.0, 1e-5) < 4.0"):
        assert _loaded(code) == ["scipy"], code


def _cli(argv: list[str]) -> str:
    return ("from dpbudget.accountant.cli import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit:\n"
            "    pass\n")


def test_cli_version_and_help_load_no_ledger_numpy_or_pydantic() -> None:
    watch = (*_HEAVY, "numpy", "pydantic", "sqlite3")
    for argv in (["--version"], ["--help"], ["audit", "--help"], ["policy", "check", "--help"]):
        assert _loaded(_cli(argv), watch) == [], argv


def test_negative_control_a_cli_subcommand_loads_what_it_needs(tmp_path: Path) -> None:
    """``policy schema`` needs the policy model: pydantic is loaded then, so the probe above is
    not blind to it."""
    assert _loaded(_cli(["policy", "schema"]), ("numpy", "pydantic")) == ["numpy", "pydantic"]
