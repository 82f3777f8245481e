"""Fixtures of the audit's plot tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def svg_backend() -> Iterator[str]:
    """The caller's own (non-default) backend, restored afterwards."""
    matplotlib = pytest.importorskip("matplotlib")
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    yield "svg"
    matplotlib.use(before)
