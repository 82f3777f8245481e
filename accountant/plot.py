"""Plot an audit: cumulative ε (and δ) over time per account, with each limit drawn.

Needs the optional extra ``dpbudget[plot]`` (matplotlib); without it ``plot_audit`` raises a
``PrivacyError`` that says how to install it.
"""

from __future__ import annotations

import os
from datetime import datetime

from accountant.audit import AuditReport
from accountant.errors import PrivacyError

__all__ = ["plot_audit"]


def plot_audit(report: AuditReport, path: str | os.PathLike[str], *, width: float = 10.0,
               height: float = 6.0, dpi: int = 100) -> None:
    """Write a PNG of cumulative spend per account (the report must come from
    ``audit(..., plot=True)``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError:
        raise PrivacyError('plotting needs matplotlib: pip install "dpbudget[plot]"') from None
    accounts = [a for a in report.accounts if a.series]
    fig, (ax_eps, ax_delta) = plt.subplots(2, 1, figsize=(width, height), dpi=dpi, sharex=True,
                                           height_ratios=(3, 1))
    for i, acct in enumerate(accounts):
        color = f"C{i % 10}"
        series = acct.series or []
        times = [datetime.fromisoformat(t) for t, _, _ in series]
        ax_eps.step(times, [e for _, e, _ in series], where="post", color=color,
                    label=f"{acct.account} ({acct.rule})")
        ax_delta.step(times, [d for _, _, d in series], where="post", color=color)
        if acct.limit is not None:
            ax_eps.axhline(acct.limit["epsilon"], color=color, linestyle="--", linewidth=1)
            ax_delta.axhline(acct.limit["delta"], color=color, linestyle="--", linewidth=1)
    ax_eps.set_ylabel("cumulative ε (spent)")
    ax_delta.set_ylabel("cumulative δ")
    ax_delta.set_xlabel("time (UTC)")
    status = "clean" if report.ok else f"{report.problem_count} problem(s)"
    ax_eps.set_title(f"Privacy spend per account — {report.records} records, audit {status}"
                     "\n(dashed: limit)")
    if accounts:
        ax_eps.legend(loc="upper left", fontsize="small")
    else:
        ax_eps.text(0.5, 0.5, "no releases recorded", ha="center", transform=ax_eps.transAxes)
    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]  # matplotlib's own
    ax_delta.xaxis.set_major_locator(locator)
    ax_delta.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]  # (no stubs)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
