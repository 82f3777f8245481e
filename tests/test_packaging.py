"""One installed import name: the wheel holds ``dpbudget`` and its metadata, nothing else.

The repository keeps each layer as a top-level folder (``accountant/``, ``mechanisms/``,
``policies/``, ``examples/``); ``dpbudget/`` links to them, so they install as
``dpbudget.accountant`` and so on. Before, the wheel put ``accountant``, ``mechanisms``,
``policies`` and ``dpbudget_examples`` on ``sys.path`` as names of their own (two of them taken on
the package index by unrelated projects).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built offline from a copy of the sources (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("accountant", "mechanisms", "policies", "examples", "dpbudget"):
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, capture_output=True)
    (found,) = out.glob("dpbudget-*.whl")
    return found


def test_the_wheel_has_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert z.read(info).decode().split() == ["dpbudget"]
        assert "dpbudget = dpbudget.accountant.cli:main" in z.read(entry).decode()
    assert {n.split("/")[0] for n in names} == {"dpbudget", wheel.name.split("-py3")[0] + ".dist-info"}
    for needed in ("dpbudget/py.typed", "dpbudget/accountant/gate/gate.py", "dpbudget/mechanisms/laplace.py",
                   "dpbudget/accountant/composition/basic.py", "dpbudget/accountant/ledger/sqlite.py",
                   "dpbudget/accountant/ledger/postgres/schema.sql",
                   "dpbudget/policies/policy.py", "dpbudget/examples/demo.py",
                   "dpbudget/examples/policy.toml", "dpbudget/examples/data/people.csv"):
        assert needed in names, needed


def test_installed_only_dpbudget_imports(wheel: Path, tmp_path: Path) -> None:
    """Installed (outside the checkout), ``dpbudget.*`` imports from the install and the folders'
    own names do not exist; the bundled demo runs."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True)
    # bin/ holds the console script, not an import name
    assert {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")} - {"bin"} == \
        {"dpbudget"}
    code = ("import importlib.util, dpbudget as dp, dpbudget.accountant.gate.gate as g\n"
            "print(g.__file__.startswith(sys.argv[1]))\n"
            "print([n for n in ('accountant', 'mechanisms', 'policies', 'dpbudget_examples')"
            " if importlib.util.find_spec(n)])\n"
            "from dpbudget.accountant.cli import main\n"
            "print(main(['demo', '--seed', '1', '--ledger', sys.argv[1] + '/demo.db']))\n")
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code, str(site)], cwd=tmp_path,
                         env={"PYTHONPATH": str(site), "PATH": ""}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "True" and lines[1] == "[]" and lines[-1] == "0", out.stdout[-2000:]
