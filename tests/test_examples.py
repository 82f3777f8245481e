"""The examples run end to end as scripts and spend exactly what they declare."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("script, expected", [
    ("auto_avg.py", "spent: Budget(epsilon=1.0, delta=0.0)"),
    ("range_query_svt.py", "spent Budget(epsilon=1.0, delta=0.0)"),
    ("custom_mechanism.py", "spent: Budget(epsilon=0.5, delta=0.0)"),
])
def test_example_runs(script, expected, capsys):
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    out = capsys.readouterr().out
    assert expected in out
