"""A heat map of per-block spend: blocks down, time across, the share of each block's limit spent
as colour — one panel per dataset divided into blocks (``dpbudget.policies.blocks``).

Reads only an audit report (``audit(..., plot=True)``): the replayed cumulative spend of every
block account. Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import IO, Any

from dpbudget.accountant.audit.run import AuditReport
from dpbudget.accountant.audit.plot import figure

__all__ = ["block_grid", "plot_blocks"]

_COLUMNS = 60


def block_grid(report: AuditReport) -> dict[str, tuple[list[str], list[float], list[list[float]]]]:
    """Per dataset: its block names (sorted), the time of each column (seconds, UTC) and, per
    block, the share of its ε limit spent by the end of each column (0 to 1; ε spent when the
    block has no limit)."""
    blocks: dict[str, dict[str, Any]] = {}
    times: list[float] = []
    for acct in report.accounts:
        if "/block:" not in acct.account or not acct.series:
            continue
        dataset, block = acct.account[len("dataset:"):].split("/block:", 1)
        series = [(datetime.fromisoformat(t).timestamp(), e) for t, e, _ in acct.series]
        limit = (acct.limit or {}).get("epsilon") or 0.0
        blocks.setdefault(dataset, {})[block] = (series, limit)
        times.extend(t for t, _ in series)
    if not times:
        return {}
    start, end = min(times), max(times)
    step = max(end - start, 1.0) / _COLUMNS
    columns = [start + step * (i + 1) for i in range(_COLUMNS)]
    out = {}
    for dataset, by_block in blocks.items():
        names = sorted(by_block)
        rows = []
        for name in names:
            series, limit = by_block[name]
            row, i, spent = [], 0, 0.0
            for t in columns:
                while i < len(series) and series[i][0] <= t:
                    spent = series[i][1]
                    i += 1
                row.append(spent / limit if limit > 0 else spent)
            rows.append(row)
        out[dataset] = (names, columns, rows)
    return out


def plot_blocks(report: AuditReport, path: str | os.PathLike[str] | IO[bytes], *,
                width: float = 10.0, dpi: int = 100) -> bool:
    """Write the heat map to ``path`` (PNG); False (nothing written) when no block was charged."""
    grid = block_grid(report)
    if not grid:
        return False
    heights = [max(2.0, 0.18 * len(names) + 1.2) for names, _, _ in grid.values()]
    fig = figure(width, sum(heights), dpi)  # (own canvas: the caller's backend is left alone)
    axes = fig.subplots(len(grid), 1, squeeze=False, height_ratios=heights)
    for ax, (dataset, (names, columns, rows)) in zip(axes[:, 0], grid.items()):
        first = datetime.fromtimestamp(columns[0], timezone.utc)
        last = datetime.fromtimestamp(columns[-1], timezone.utc)
        image = ax.imshow(rows, aspect="auto", interpolation="nearest", cmap="viridis",
                          vmin=0.0, vmax=1.0, extent=(0, len(columns), len(names), 0))
        ax.set_yticks([i + 0.5 for i in range(len(names))])
        ax.set_yticklabels(names, fontsize="x-small" if len(names) > 20 else "small")
        fmt = "%Y-%m-%d %H:%M" if columns[-1] - columns[0] > 3600 else "%Y-%m-%d %H:%M:%S"
        ax.set_xticks([0, len(columns)])
        ax.set_xticklabels([first.strftime(fmt), last.strftime(fmt)])
        ax.set_xlabel("record time (UTC)")
        ax.set_title(f"dataset {dataset}: share of each block's ε limit spent over time")
        ax.set_ylabel("block")
        fig.colorbar(image, ax=ax, label="spent / limit")
    fig.tight_layout()
    fig.savefig(path)
    return True
