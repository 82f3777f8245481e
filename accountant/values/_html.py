"""Small HTML tables for notebooks (Jupyter calls ``_repr_html_``): budgets, receipts, an
accountant's accounts and an audit report. Values are escaped; no data is ever shown — only
policy parameters, spend, record numbers and hashes, as in the text reprs.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["table"]


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "") -> str:
    """An HTML table of ``rows`` under ``head`` (every cell escaped), with a caption."""
    def cell(value: Any, tag: str) -> str:
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        return f"<{tag}>{html.escape(text)}</{tag}>"

    out = ["<table>"]
    if caption:
        out.append(f"<caption>{html.escape(caption)}</caption>")
    out.append("<tr>" + "".join(cell(h, "th") for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(cell(v, "td") for v in row) + "</tr>")
    out.append("</table>")
    return "".join(out)
