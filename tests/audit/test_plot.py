"""``dp.plot_audit`` writes a PNG of a report's spend over time without touching the caller's
matplotlib (its backend, its open figures), refuses a report that holds no series (audited without
``plot=True``) instead of drawing an empty chart, and never dates an axis 1970."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import dpbudget as dp
from dpbudget.accountant.audit import plot as plot_module
from tests.audit.support import png_size as _png

matplotlib = pytest.importorskip("matplotlib")
pyplot = pytest.importorskip("matplotlib.pyplot")
mdates = pytest.importorskip("matplotlib.dates")

CANARY = 987654.321


def _ledger(path: Path, releases: int = 6) -> str:
    url = f"sqlite:///{path}"
    with dp.Accountant(limits={"adult": dp.Budget(1.0, 1e-6), "census": dp.Budget(2.0)},
                       ledger=url, rng=1, simulation=True) as acc:
        for i in range(releases):
            acc.release(dp.Laplace(0.1, sensitivity=1.0), float(i), dataset="adult" if i % 2 else "census",
                        analyst="alice" if i % 3 else "bob")
    return url


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure ``plot_audit`` draws, kept for inspection."""
    made: list[Any] = []
    real = plot_module.figure

    def keep(*args: Any) -> Any:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(plot_module, "figure", keep)
    return made


def test_the_callers_backend_and_figures_are_left_alone(tmp_path: Path, svg_backend: str) -> None:
    report = dp.audit(_ledger(tmp_path / "l.db"), plot=True)
    mine = pyplot.figure()  # the caller's open figure
    open_before = pyplot.get_fignums()
    png = tmp_path / "spend.png"
    dp.plot_audit(report, png)
    assert matplotlib.get_backend() == svg_backend
    assert pyplot.get_fignums() == open_before  # none added, none closed
    width, height, size = _png(png)  # a PNG, whatever the caller's backend writes
    assert (width, height) == (1000, 800)  # 10 x 6 in at 100 dpi, + 2 in for a second dataset
    assert size > 20_000  # lines, labels and legends, not a blank canvas
    pyplot.close(mine)


def test_negative_control_the_old_backend_switch_is_seen(svg_backend: str) -> None:
    """Negative control: what the old ``plot_audit`` did first (``matplotlib.use("Agg")``) fails
    the assertion above."""
    matplotlib.use("Agg")
    assert matplotlib.get_backend() != svg_backend


def test_a_report_without_series_is_refused_not_drawn_empty(tmp_path: Path) -> None:
    url = _ledger(tmp_path / "l.db")
    png = tmp_path / "spend.png"
    with pytest.raises(dp.InvalidArgumentError, match="plot=True") as caught:
        dp.plot_audit(dp.audit(url), png)  # audited without plot=True: totals only
    assert caught.value.argument == "report" and "'report'" in str(caught.value)
    assert not png.exists()  # nothing written
    dp.plot_audit(dp.audit(url, plot=True), png)  # control: the same ledger, with series
    assert _png(png)[2] > 20_000


def test_the_time_axis_is_the_records_time_never_1970(tmp_path: Path,
                                                      figures: list[Any]) -> None:
    report = dp.audit(_ledger(tmp_path / "l.db"), plot=True)
    dp.plot_audit(report, tmp_path / "spend.png")
    (fig,) = figures
    low, high = (mdates.num2date(x) for x in fig.axes[-1].get_xlim())
    assert report.first_time is not None and report.last_time is not None
    first = datetime.fromisoformat(report.first_time)
    last = datetime.fromisoformat(report.last_time)
    assert low <= first and last <= high and (high - low).days < 1


def test_a_ledger_without_releases_draws_no_dates(tmp_path: Path, figures: list[Any]) -> None:
    """Nothing was released: the chart says so, with no time axis (not an empty one at 1970)."""
    url = _ledger(tmp_path / "l.db", releases=0)
    report = dp.audit(url)  # with or without plot=True: there is nothing over time to show
    png = tmp_path / "spend.png"
    dp.plot_audit(report, png)
    (fig,) = figures
    assert list(fig.axes[-1].get_xticks()) == []
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "no releases recorded" in texts
    assert _png(png)[2] > 5_000


def test_a_report_of_the_wrong_type_is_named_never_shown(tmp_path: Path) -> None:
    with pytest.raises(dp.InvalidTypeError, match="'report' must be an AuditReport") as caught:
        dp.plot_audit([CANARY], tmp_path / "x.png")  # type: ignore[arg-type]
    assert "987654" not in str(caught.value)
    assert not (tmp_path / "x.png").exists()
