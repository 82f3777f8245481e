"""`import dpbudget as dp` (issue 16): one namespace with the whole public API, a version, types."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from dpbudget import accountant
from dpbudget import mechanisms
from dpbudget import policies

import dpbudget as dp


def test_every_public_name_of_the_three_packages_is_exported() -> None:
    for package in (accountant, mechanisms, policies):
        missing = [name for name in package.__all__
                   if name not in dp.__all__ and name not in _NOT_EXPORTED]
        assert not missing, f"{package.__name__} names not in dpbudget: {missing}"
    for name in dp.__all__:
        assert getattr(dp, name) is not None


# Names the three packages export for their own layers, not as the user-facing API.
_NOT_EXPORTED = {"AccountSpec", "policy_accounts"}


def test_the_names_are_the_packages_objects() -> None:
    assert dp.Accountant is accountant.Accountant and dp.Laplace is mechanisms.Laplace
    assert dp.Policy is policies.Policy and dp.audit.__module__ == "dpbudget.accountant.audit.run"


def test_version_and_types() -> None:
    assert dp.__version__ == metadata.version("dpbudget")
    assert (Path(dp.__file__).parent / "py.typed").is_file()
    out = subprocess.run([sys.executable, "-m", "dpbudget.accountant.cli", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"dpbudget {dp.__version__}"


def test_importing_dpbudget_loads_nothing_heavy() -> None:
    code = ("import sys, dpbudget; "
            "print(any(m.startswith(('dpbudget.accountant.gate.accountant', 'scipy')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_cli_help_lists_every_audit_exit_bit_and_has_no_markup() -> None:
    from dpbudget.accountant.audit.findings import EXIT_BITS

    def help_of(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "dpbudget.accountant.cli", *args, "--help"],
                              capture_output=True, text=True, check=True).stdout

    audit_help = help_of("audit")
    for kind, bit in EXIT_BITS.items():
        assert f"{bit}" in audit_help and kind in audit_help, kind
    for command in (("demo",), ("status",), ("audit",), ("export",), ("import",),
                    ("policy", "check"), ("policy", "apply")):
        text = help_of(*command)
        assert "``" not in text, command
    for argument in ("ledger", "out", "jsonl"):
        assert argument in help_of("export") + help_of("import")


def test_notebook_tables_show_spend_and_never_data(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with dp.Accountant(dp.Budget(1.0), ledger=url, rng=0, simulation=True) as acc:
        acc.release(dp.Laplace(0.25, sensitivity=1.0), 987654.321, dataset="people")
        for html in (acc._repr_html_(), acc.last_receipt._repr_html_(),
                     dp.Budget(0.5, 1e-6)._repr_html_(), dp.audit(url)._repr_html_()):
            assert html.startswith("<table>") and "987654" not in html
        assert "dataset:people" in acc._repr_html_()
    from dpbudget.accountant.values._html import table

    assert "<td>a&lt;b&gt;</td>" in table(("x",), [("a<b>",)])  # every cell escaped


def test_signatures_and_types_reach_inspect_and_type_checkers(tmp_path: Path) -> None:
    """Issue 30: ``inspect.signature(dp.Laplace)`` was ``(*args, **kwargs)`` (the metaclass's
    __call__) and ``import dpbudget as dp`` was ``Any`` to mypy, so a misspelt keyword passed."""
    import inspect
    import os

    for name in mechanisms.__all__:
        cls = getattr(dp, name, None)
        if isinstance(cls, type) and issubclass(cls, mechanisms.Mechanism) \
                and not inspect.isabstract(cls):
            params = inspect.signature(cls).parameters
            assert "args" not in params and "kwargs" not in params, name
    assert list(inspect.signature(dp.Laplace).parameters) == ["epsilon", "sensitivity", "noise"]
    script = tmp_path / "user.py"
    script.write_text("import dpbudget as dp\n\n"
                      "acc = dp.Accountant(dp.Budget(1.0))\n"
                      "acc.release(dp.Laplace(0.1, sensitivty=2.0, sensitivity=1.0), 1.0, datset='x')\n")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
         str(script)], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(root)})
    assert 'Unexpected keyword argument "sensitivty" for "Laplace"' in out.stdout, out.stdout
    assert 'Unexpected keyword argument "datset" for "release"' in out.stdout, out.stdout
    assert "does not explicitly export" not in out.stdout, out.stdout
