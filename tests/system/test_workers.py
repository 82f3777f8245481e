"""Worker processes: the multi-process patterns docs/getting-started.md documents ("Several
processes") run as shown. (A refusal inside a pool reaching the parent as itself:
tests/system/test_pools.py; every error pickling back to itself: tests/values/test_errors.py.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = re.compile(r"```python\n# (\S+\.py), run as:[^\n]*\n(.*?)```\n\n```text\n(.*?)```",
                     re.S)


def _documented() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = text[text.index("## Several processes"):]
    return {name: (code, out) for name, code, out in _SCRIPT.findall(section)}


def test_the_docs_show_each_pattern() -> None:
    assert set(_documented()) == {"spawn_workers.py", "postgres_workers.py",
                                  "fork_then_open.py", "unsupported.py"}


def _run(tmp_path: Path, name: str, url: str) -> None:
    code, expected = _documented()[name]
    script = tmp_path / name
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DPBUDGET_LEDGER_KEY", None)
    done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True,
                          timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == expected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork patterns need POSIX fork")
@pytest.mark.parametrize("name", ["spawn_workers.py", "fork_then_open.py", "unsupported.py"])
def test_a_documented_sqlite_pattern_runs_as_shown(tmp_path: Path, name: str) -> None:
    _run(tmp_path, name, f"sqlite:///{tmp_path / 'budget.db'}")


@pytest.mark.postgres
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork patterns need POSIX fork")
def test_the_documented_postgres_pattern_runs_as_shown(tmp_path: Path,
                                                       postgres_database: str) -> None:
    from tests.conftest import _fresh_schema

    _run(tmp_path, "postgres_workers.py", _fresh_schema(postgres_database))
