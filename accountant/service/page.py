"""The owner's status page: one self-contained HTML document, rendered on the server from a
ledger.

``render(ledger)`` shows what ``dpbudget status LEDGER`` reads
(``dpbudget.accountant.audit.status``: each limit's stored state against the policy stored in the
ledger, the states' check, the head) and what ``dpbudget audit --plot`` computes
(``dpbudget.accountant.audit.run.audit`` with its series, drawn by
``dpbudget.accountant.audit.plot``): spend per dataset, per analyst and per block against its
limit, as numbers and a bar; the audit's exit bits and findings; the ledger's head; and the time
it was rendered. It reuses those functions; it computes no spend of its own.

Invariants:

* Self-contained and inert: no script, no file or address fetched (the plots are ``data:`` PNG
  URIs), nothing written to disk or to the ledger. A Content-Security-Policy in the page itself
  forbids scripts and every source but ``data:`` images, so a name that escaped its escaping
  still could not run.
* Every name on the page — a dataset, an analyst, a label, an account key, a finding's message —
  goes through ``_text`` (``html.escape``): a policy, a caller or an edited ledger file chooses
  them, and none may add markup to the owner's page.
* Budgets only: limits and spend (policy parameters and sums of declared costs), record numbers,
  hashes and times; never a data value.
* The time shown is the ledger's own (``Ledger.now``: the server's on PostgreSQL), never a
  parameter: no caller can date the page.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import IO, Any

from dpbudget.accountant.audit.findings import AuditReport
from dpbudget.accountant.audit.plot import plot_audit
from dpbudget.accountant.audit.plot_blocks import plot_blocks
from dpbudget.accountant.audit.run import audit
from dpbudget.accountant.audit.status import budget_rows, check_states
from dpbudget.accountant.audit.text import noise_line
from dpbudget.accountant.gate import policy_record
from dpbudget.accountant.ledger import Ledger
from dpbudget.accountant.values.errors import PrivacyError
from dpbudget.policies.periods import split_window

__all__ = ["render"]

# The page's own policy: nothing but itself, its inline style and data: images (the plots).
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; " \
      "form-action 'none'"

# The audit's exit bits (``dpbudget.accountant.audit.findings``), one row each; the numbers are
# fixed there, and the test checks these against ``EXIT_BITS``.
BITS: tuple[tuple[int, str, str], ...] = (
    (1, "time", "a record's time runs backwards, or lies outside its window or block"),
    (4, "policy", "a policy record is unsigned, or its signature does not verify"),
    (8, "chain", "a record was edited, deleted, inserted or reordered, or cannot be read"),
    (16, "release", "a release record claims what it cannot be (seeded noise, a false name)"),
    (32, "state", "a stored state disagrees with the replay of the records"),
    (64, "limit", "a release was admitted that its limit should have refused"),
    (128, "auth", "records do not verify under the ledger's HMAC key"),
)

_SECTIONS = (("datasets", "Spend per dataset"), ("analysts", "Spend per analyst"),
             ("blocks", "Spend per block"), ("other", "Other limits (global, pipelines)"))

_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:1.5em;color:#111;background:#fff}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #bbb;padding:.2em .5em;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:inline-block;width:8em;height:.8em;border:1px solid #333;vertical-align:middle}
.bar span{display:block;height:100%;background:#2b6cb0}
.over .bar span{background:#b00020}
.flag{font-weight:bold}
code{word-break:break-all}
img{max-width:100%;height:auto}
"""


def _text(value: Any) -> str:
    """``value`` as HTML text, every markup character escaped (quotes too: safe in an attribute)."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.6g}"


def render(ledger: Ledger) -> str:
    """The status page of ``ledger``: one HTML document, self-contained, with no script.

    Reads the ledger (its accounts' states, its head, its stored policy, and every record for the
    audit) and writes nothing. A damaged ledger is shown as damaged, never as an exception: the
    audit reports what it found, and the stored states are reported as not readable.

    Args:
        ledger: an open ledger (SQLite, PostgreSQL or in memory).

    Returns:
        The page, as text (UTF-8 when served).
    """
    now = datetime.fromtimestamp(ledger.now(), timezone.utc).isoformat(timespec="seconds")
    report = audit(ledger, plot=True)
    parts = [_head(ledger, now), _budgets(ledger), _audit(report), _plots(report),
             "<footer><p>Budgets, record numbers and hashes only: no data value is ever shown."
             "</p></footer>"]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_text(CSP)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            "<title>dpbudget: privacy budget status</title>"
            f"<style>{_STYLE}</style></head>\n<body><main>\n" + "\n".join(parts)
            + "\n</main></body></html>\n")


def _head(ledger: Ledger, now: str) -> str:
    seq, digest = ledger.head()
    count = f"records numbered up to {seq}" if ledger.lanes else f"{seq} records"
    sim = ("<p class=\"flag\">SIMULATION ledger: seeded noise is allowed here, and its releases "
           "protect no one.</p>") if ledger.simulation else ""
    return ("<h1>Privacy budget status</h1>"
            f'<p>Rendered at <time id="rendered" datetime="{_text(now)}">{_text(now)}</time> '
            "(the ledger's clock): "
            f'{_text(count)}; ledger head <code id="head-seq">{seq}</code>, hash '
            f'<code id="head-hash">{_text(digest)}</code>.</p>{sim}')


def _section(key: str) -> str:
    """Which table an account is shown in: its dataset's, an analyst's, a block's, or other."""
    base = split_window(key)[0]
    if "/block:" in base:
        return "blocks"
    if base.startswith("analyst:") or "/analyst:" in base:
        return "analysts"
    return "datasets" if base.startswith("dataset:") else "other"


def _budgets(ledger: Ledger) -> str:
    """Each limit's stored state against the policy in force, one table per kind of limit."""
    try:
        policy, default, source = None, None, "the limits recorded with each account"
        if policy_record.stored_document(ledger) is not None:
            policy, default = policy_record.stored_policy(ledger)
            source = "the policy stored in the ledger"
        checked = check_states(ledger)
        rows = budget_rows(ledger, policy, default)
    except PrivacyError as exc:  # an edited state or policy: say so; the audit says where
        return ('<section id="budgets"><h2>Budgets</h2><p class="flag" id="states">Stored '
                f"budgets NOT shown: {_text(exc)}</p></section>")
    except (ValueError, TypeError, LookupError, AttributeError) as exc:  # (by type: no text)
        return ('<section id="budgets"><h2>Budgets</h2><p class="flag" id="states">Stored '
                f"budgets NOT shown: the ledger is damaged ({_text(type(exc).__name__)})."
                "</p></section>")
    out = ['<section id="budgets"><h2>Budgets</h2>',
           f'<p id="states">Reported against {_text(source)}; {_text(checked)}.</p>']
    if not rows:
        out.append("<p>No releases recorded.</p>")
    for name, title in _SECTIONS:
        mine = [r for r in rows if _section(r["account"]) == name]
        if mine:
            out.append(_budget_table(name, title, mine))
    out.append("</section>")
    return "".join(out)


_HEAD = ("limit", "ε is", "rule", "spent ε", "limit ε", "remaining ε", "share of ε limit",
         "spent δ", "limit δ", "remaining δ", "status")


def _budget_table(name: str, title: str, rows: list[dict[str, Any]]) -> str:
    out = [f'<table id="{name}"><caption>{_text(title)}</caption><thead><tr>'
           + "".join(f'<th scope="col">{_text(h)}</th>' for h in _HEAD) + "</tr></thead><tbody>"]
    for r in rows:
        limit = r["limit"]
        lim_e = None if limit is None else limit["epsilon"]
        over = bool(r.get("over_limit"))
        status = r.get("note") or ("exhausted" if r["exhausted"] else "")
        cells = [
            ("rule", r["rule"]), ("spent-e", _num(r["spent"]["epsilon"])),
            ("limit-e", _num(lim_e)),
            ("remaining-e", "∞" if limit is None else _num(r["remaining"]["epsilon"])),
        ]
        out.append(f'<tr data-account="{_text(r["account"])}"' + (' class="over"' if over else "")
                   + f'><th scope="row">{_text(r["account"])}</th><td>{_text(r["per"])}</td>'
                   + "".join(f'<td class="{c}{" n" if c != "rule" else ""}">{_text(v)}</td>'
                             for c, v in cells)
                   + f"<td>{_bar(r['spent']['epsilon'], lim_e)}</td>"
                   + f'<td class="spent-d n">{_text(_num(r["spent"]["delta"]))}</td>'
                   + '<td class="limit-d n">'
                   + _text(_num(None if limit is None else limit["delta"])) + "</td>"
                   + '<td class="remaining-d n">'
                   + _text("∞" if limit is None else _num(r["remaining"]["delta"])) + "</td>"
                   + f'<td class="status{" flag" if over else ""}">{_text(status)}</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _bar(spent: float, limit: float | None) -> str:
    """The share of the ε limit spent: a bar, and the percentage as text beside it (the bar's
    colour only repeats what the status column says in words)."""
    if limit is None or limit <= 0.0:
        return "no ε limit" if limit is None else "limit ε = 0"
    share = spent / limit * 100.0
    words = f"{share:.0f}% of the ε limit spent"
    return (f'<span class="bar" role="img" aria-label="{_text(words)}">'
            f'<span style="width:{min(max(share, 0.0), 100.0):.1f}%"></span></span> '
            f'<span class="share">{share:.0f}%</span>')


def _audit(report: AuditReport) -> str:
    """The audit's verdict, its exit bits one by one, its findings, and its tallies."""
    status = report.exit_status
    chain = status & 8
    out = ['<section id="audit"><h2>Audit (every record replayed and verified)</h2>',
           f'<p id="verdict" class="{"flag" if status else ""}">'
           + (f"Audit clean: {report.records} records, {report.verified} verified; exit status 0."
              if report.ok else
              f"Audit found {report.problem_count} problem(s) in {report.records} records; "
              f"exit status {status}.") + "</p>",
           '<p id="chain">' + (
               "Chain check FAILED: a record was edited, deleted, inserted or reordered, or "
               "cannot be read (exit bit 8)." if chain else
               f"Chain check passed: the records verify up to record {report.head_seq}, hash "
               f"<code>{_text(report.head_hash)}</code>"
               + (" (HMAC-keyed)" if report.keyed else "") + ".") + "</p>",
           f"<p>{_text(noise_line(report.by_noise))}.</p>",
           '<table id="bits"><caption>Exit bits</caption><thead><tr><th scope="col">bit</th>'
           '<th scope="col">kind</th><th scope="col">meaning</th><th scope="col">found</th>'
           "</tr></thead><tbody>"]
    for bit, kind, meaning in BITS:
        found = bool(status & bit)
        out.append(f'<tr data-bit="{bit}"><td class="n">{bit}</td><th scope="row">{kind}</th>'
                   f"<td>{_text(meaning)}</td><td class=\"found{' flag' if found else ''}\">"
                   f"{'FOUND' if found else 'no'}</td></tr>")
    out.append("</tbody></table>")
    if report.problems:
        shown = report.problems[:50]
        out.append(f'<h3>Findings ({report.problem_count})</h3><ol id="problems">'
                   + "".join(f"<li>[{_text(p.kind)}] {_text(p.message)}</li>" for p in shown)
                   + "</ol>" + (f"<p>... and {report.problem_count - len(shown)} more "
                                "(<code>dpbudget audit --json</code>).</p>"
                                if report.problem_count > len(shown) else ""))
    for name, title, tally in (("by-analyst", "Releases per analyst (sum of declared costs)",
                                report.by_analyst),
                               ("by-label", "Releases per label (sum of declared costs)",
                                report.by_label)):
        if tally:
            out.append(_table(name, title, ("name", "releases", "Σε", "Σδ"),
                              ((k, t.releases + t.inside_releases, t.epsilon + t.inside_epsilon,
                                t.delta + t.inside_delta) for k, t in sorted(tally.items()))))
    out.append("</section>")
    return "".join(out)


def _table(name: str, caption: str, head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A table whose first column names its row; numbers right-aligned; every cell escaped."""
    out = [f'<table id="{name}"><caption>{_text(caption)}</caption><thead><tr>'
           + "".join(f'<th scope="col">{_text(h)}</th>' for h in head) + "</tr></thead><tbody>"]
    for first, *rest in rows:
        out.append(f'<tr><th scope="row">{_text(first)}</th>'
                   + "".join(f'<td class="n">{_text(_num(v) if isinstance(v, float) else v)}'
                             "</td>" for v in rest) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _plots(report: AuditReport) -> str:
    """The audit's plots as inline PNG images; a sentence instead when they cannot be drawn."""
    out = ['<section id="plots"><h2>Spend over time</h2>']
    for alt, draw in (("Cumulative privacy spend per account over time, each limit dashed, "
                       "from the audit's replay of the records", plot_audit),
                      ("Share of each block's ε limit spent over time", plot_blocks)):
        png = _png(draw, report)
        if png is not None:
            out.append(f'<figure><img alt="{_text(alt)}" src="data:image/png;base64,'
                       f'{base64.b64encode(png).decode("ascii")}"><figcaption>{_text(alt)}'
                       "</figcaption></figure>")
        elif draw is plot_audit:
            out.append("<p>Plot not drawn: it needs matplotlib "
                       '(<code>pip install "dpbudget[plot]"</code>).</p>')
    out.append("</section>")
    return "".join(out)


def _png(draw: Callable[[AuditReport, IO[bytes]], object], report: AuditReport
         ) -> bytes | None:
    """What ``draw`` writes for ``report``, in memory; None when nothing was drawn (no block was
    charged, matplotlib missing) or it is not a PNG (a ``savefig.format`` set otherwise)."""
    buffer = io.BytesIO()
    try:
        if draw(report, buffer) is False:
            return None
    except PrivacyError:
        return None
    data = buffer.getvalue()
    return data if data.startswith(b"\x89PNG\r\n\x1a\n") else None
