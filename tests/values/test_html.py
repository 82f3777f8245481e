"""Notebook tables (``dpbudget.accountant.values._html``): every cell and caption is escaped, floats
shown to six significant digits."""

from __future__ import annotations

import pytest

from dpbudget.accountant.values import _html
from dpbudget.accountant.values._html import table


def test_every_cell_and_the_caption_are_escaped() -> None:
    out = table(("<b>account</b>",), [("<script>alert(1)</script>",)], caption="a & b")
    assert "<script>" not in out and "<b>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out and "<caption>a &amp; b</caption>" in out


def test_negative_control_without_escaping_the_markup_gets_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: with escaping removed (the broken behaviour, re-created), the same table
    holds raw markup, which the test above would catch."""
    monkeypatch.setattr(_html.html, "escape", lambda text: text)
    assert "<script>" in table(("account",), [("<script>alert(1)</script>",)])


def test_a_table_has_its_head_its_rows_and_floats_to_six_digits() -> None:
    out = table(("x", "y"), [(1 / 3, 2), ("z", None)])
    assert out.startswith("<table><tr><th>x</th><th>y</th></tr>")
    assert "<td>0.333333</td><td>2</td>" in out and "<td>None</td>" in out
    assert out.endswith("</table>") and "<caption>" not in out
