"""Plot an audit: cumulative ε over time per account, one panel per dataset, each limit drawn,
and δ below (block accounts have their own heat map: ``dpbudget.accountant.audit.plot_blocks``).

Needs the optional extra ``dpbudget[plot]`` (matplotlib); without it ``plot_audit`` raises a
``PrivacyError`` that says how to install it. Figures are drawn on their own Agg canvas, never
through ``pyplot``: a plot leaves the caller's backend and open figures as they were.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import IO, Any

from dpbudget.accountant.audit.run import AuditReport
from dpbudget.accountant.values.errors import InvalidArgumentError, InvalidDataTypeError, PrivacyError

__all__ = ["plot_audit"]


def figure(width: float, height: float, dpi: int) -> Any:
    """A matplotlib ``Figure`` on its own Agg canvas (no ``pyplot``: its global backend and list
    of open figures are the caller's); a ``PrivacyError`` naming the extra when matplotlib is
    missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PrivacyError('plotting needs matplotlib: pip install "dpbudget[plot]"') from None
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)  # (attaches itself: savefig renders with Agg, whatever pyplot uses)
    return fig


def _group(key: str) -> str:
    """The panel an account is drawn in: its dataset's, or one for every other account."""
    if key.startswith("dataset:"):
        return "dataset " + key[len("dataset:"):].split("/", 1)[0].split("@", 1)[0]
    return "analysts, pipelines and the global limit"


def plot_audit(report: AuditReport, path: str | os.PathLike[str] | IO[bytes], *,
               width: float = 10.0, height: float = 6.0, dpi: int = 100) -> None:
    """Write a PNG of cumulative spend per account over time: ε in one panel per dataset (with
    each account's limit dashed), δ below.

    The spend over time is the series that ``audit(..., plot=True)`` keeps while it replays the
    ledger (``dpbudget audit --plot`` does this); a report made without it has only totals, and
    is refused rather than drawn as an empty chart. A report with no releases at all draws its
    panels marked "no releases recorded". Block accounts are left to ``plot_blocks``.

    Args:
        report: an ``AuditReport`` from ``audit(source, plot=True)``.
        path: the PNG file to write (replaced if it exists), or a binary file object.
        width: the figure's width in inches.
        height: its height in inches for one dataset (each further dataset adds 2).
        dpi: dots per inch.

    Returns:
        None; the image is written to ``path``.

    Raises:
        InvalidDataTypeError: ``report`` is not an ``AuditReport``.
        InvalidArgumentError: ``report`` records releases but no series (audited without
            ``plot=True``): audit again with ``plot=True``.
        PrivacyError: matplotlib is not installed (the ``plot`` extra).
    """
    if not isinstance(report, AuditReport):
        raise InvalidDataTypeError("report", report, "an AuditReport (from dp.audit)")
    drawn = [a for a in report.accounts if "/block:" not in a.account]
    if any(a.releases and a.series is None for a in drawn):
        # (every debited account has a series when the audit kept them: this one did not)
        err = InvalidArgumentError("report", "a report without series",
                                   "an AuditReport from audit(..., plot=True)")
        err.args = ("'report' holds no spend over time: it comes from an audit without "
                    "plot=True. Audit again with dp.audit(source, plot=True) (the CLI: "
                    "dpbudget audit SOURCE --plot FILE) and plot that report.",)
        raise err
    accounts = [a for a in drawn if a.series]
    groups: dict[str, list[Any]] = {}
    for acct in accounts:  # one panel per dataset; analysts, pipelines, global together
        groups.setdefault(_group(acct.account), []).append(acct)
    names = sorted(groups) or ["(none)"]
    fig = figure(width, height + 2.0 * (len(names) - 1), dpi)
    axes = fig.subplots(len(names) + 1, 1, sharex=True, height_ratios=[3] * len(names) + [1],
                        squeeze=False)
    ax_delta = axes[-1, 0]
    markers = "osD^vPX*"
    i = -1  # one colour and marker per account across all panels (the δ panel shows them all)
    for panel, name in zip(axes[:-1, 0], names):
        for acct in groups.get(name, []):
            i += 1
            color, marker = f"C{i % 10}", markers[i % len(markers)]
            series = acct.series or []
            times = [datetime.fromisoformat(t) for t, _, _ in series]
            every = max(1, len(times) // 12)  # markers tell lines apart without hiding them
            panel.step(times, [e for _, e, _ in series], where="post", color=color,
                       marker=marker, markevery=every, markersize=4,
                       label=f"{acct.account} ({acct.rule})")
            ax_delta.step(times, [d for _, _, d in series], where="post", color=color,
                          marker=marker, markevery=every, markersize=3, label=acct.account)
            if acct.limit is not None:
                panel.axhline(acct.limit["epsilon"], color=color, linestyle=(0, (4, 2 + i)),
                              linewidth=1)
        panel.set_ylabel("cumulative ε")
        panel.set_title(name, fontsize="medium", loc="left")
        if groups.get(name):
            panel.legend(loc="upper left", fontsize="small")
        else:
            panel.text(0.5, 0.5, "no releases recorded", ha="center", transform=panel.transAxes)
    ax_delta.set_ylabel("cumulative δ")
    ax_delta.set_xlabel("time (UTC)")
    status = "clean" if report.ok else f"{report.problem_count} problem(s)"
    fig.suptitle(f"Privacy spend per account — {report.records} records, audit {status} "
                 "(dashed: limit)")
    times = [datetime.fromisoformat(t) for a in accounts for t, _, _ in (a.series or [])]
    if times:  # at least a minute across, so that the ticks never count fractions of a second
        from matplotlib import dates as mdates

        first, last = min(times), max(times)
        pad = max((last - first) * 0.05, timedelta(seconds=30))
        ax_delta.set_xlim(first - pad, last + pad)
        locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]  # matplotlib's own
        ax_delta.xaxis.set_major_locator(locator)
        ax_delta.xaxis.set_major_formatter(
            mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]  # (no stubs)
    else:  # no time to show: no ticks (a date axis with nothing on it would show 1970)
        ax_delta.set_xticks([])
    fig.tight_layout()
    fig.savefig(path)
