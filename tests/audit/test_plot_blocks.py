"""A heat map of per-block spend (``dpbudget.accountant.audit.plot_blocks``), drawn on its own canvas:
the caller's matplotlib backend is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpbudget.accountant.audit.findings import AccountReport, AuditReport
from dpbudget.accountant.audit.plot_blocks import plot_blocks
from tests.audit.support import png_size as _png

matplotlib = pytest.importorskip("matplotlib")


def test_block_heat_map_leaves_the_backend_alone(tmp_path: Path, svg_backend: str) -> None:
    series = [("2026-01-01T00:00:00+00:00", 0.25, 0.0), ("2026-01-02T00:00:00+00:00", 0.5, 0.0)]
    report = AuditReport(source="test", accounts=[AccountReport(
        account="dataset:d/block:2026-01", rule="basic", limit={"epsilon": 1.0, "delta": 0.0},
        spent={"epsilon": 0.5, "delta": 0.0}, remaining={"epsilon": 0.5, "delta": 0.0},
        releases=2, over_limit=False, series=series)])
    assert plot_blocks(report, tmp_path / "blocks.png")
    assert matplotlib.get_backend() == svg_backend
    assert _png(tmp_path / "blocks.png")[2] > 5_000
