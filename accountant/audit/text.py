"""The audit report as text, for reading (``dpbudget audit``; ``status`` borrows two lines);
``--json`` gives the exact values instead (``AuditReport.model_dump_json``)."""

from __future__ import annotations

from dpbudget.accountant.audit.findings import SECURE_NOISE, AuditReport, Tally

__all__ = ["SIMULATION", "STATUS_NOISE", "audit_text", "noise_line"]

SIMULATION = ("SIMULATION ledger: created for simulation (its first record says so); seeded noise "
              "is allowed here, and its releases protect no one")


def noise_line(by_noise: dict[str, Tally]) -> str:
    """How many releases drew exact noise from the OS CSPRNG, and how many did not (and how)."""
    def n(kind: str) -> int:
        t = by_noise.get(kind)
        return 0 if t is None else t.releases + t.inside_releases

    secure = n(SECURE_NOISE)
    others = {k: n(k) for k in sorted(by_noise) if k != SECURE_NOISE and n(k)}
    line = f"noise: {secure} release(s) with exact noise from the OS CSPRNG"
    if others:
        line += (f"; {sum(others.values())} WITHOUT secure noise ("
                 + ", ".join(f"{k} {v}" for k, v in others.items()) + ")")
    return line


# ``dpbudget status`` reads the accounts table, never the records (its cost must not grow with
# them: counting the noise kinds read every record, 8.6 s at 10^6), so it leaves the count to the
# audit rather than show a partial one.
STATUS_NOISE = ("noise: not counted by status, which reads no records; `dpbudget audit` counts "
                "the releases made without exact noise from the OS CSPRNG")


def _tally(t: Tally, group: str) -> str:
    charged = "allocation" if group == "pipeline" else "charged"
    parts = [f"{t.releases:>5} {charged}  Σε={t.epsilon:.6g} Σδ={t.delta:.3g}"]
    if t.inside_releases:
        where = ("releases inside it, paid by the allocation" if group == "pipeline" else
                 "inside pipelines, paid by their allocation")
        parts.append(f"{t.inside_releases} {where}: Σε={t.inside_epsilon:.6g} "
                     f"Σδ={t.inside_delta:.3g}")
    return "; ".join(parts)


def audit_text(report: AuditReport, plot_path: str | None) -> str:
    lines = [f"audit of {report.source}: {report.records} records, {report.verified} verified, "
             f"head {report.head_seq} {report.head_hash}"
             + (" (HMAC-keyed)" if report.keyed else "")]
    if report.simulation:
        lines.append(f"  {SIMULATION}")
    if report.first_time:
        lines.append(f"  from {report.first_time} to {report.last_time}")
    if report.duplicates:
        lines.append(f"  {report.duplicates} record(s) found more than once, identical "
                     "(read once)")
    if report.absent:
        shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in report.absent_ranges[:20])
        more = ", ..." if len(report.absent_ranges) > 20 else ""
        lines.append(
            f"  SUBSEQUENCE: {report.absent} record(s) are not in this source ({shown}{more}):"
            " other writers' records, not verified here; audit their logs together with this"
            " one, or the ledger, to verify them (with --complete an absent record counts as"
            f" deleted). {report.resynced} account state(s) after them were taken from the"
            " records, checked only to be possible.")
    if report.unused:
        lines.append(f"  {report.unused} number(s) held by no record: taken by transactions that "
                     "never committed (rolled back, or lost in a crash: never answered)")
    lines.append("\nper account (replayed from the records under each account's rule):")
    for a in report.accounts:
        limit = "no limit" if a.limit is None else (
            f"limit ε={a.limit['epsilon']:.6g} δ={a.limit['delta']:.3g}")
        agrees = {None: "", True: ", stored state agrees", False: ", STORED STATE DIFFERS"}[
            a.stored_state_agrees]
        flag = "  OVER LIMIT" if a.over_limit else ""
        lines.append(f"  {a.account:<34} {a.rule:<9} {a.releases:>7} releases  spent "
                     f"ε={a.spent['epsilon']:.6g} δ={a.spent['delta']:.3g} {a.per}  "
                     f"({limit}{agrees})"
                     f"{flag}")
    if report.policies:
        lines.append("\npolicy records (" + (f"owner key {report.owner}" if report.owner else
                                               "no owner key pinned") + "):")
        for p in report.policies:
            lines.append(f"  record {p.seq} {p.time or ''} by {p.by}: {p.reason}"
                         + ("" if p.signed or not report.owner else " (unsigned)"))
            lines += [f"    grants more: {r}" for r in p.raised]
    if report.datasets_first:
        lines.append("\ndatasets first charged (a misspelt name shows as a dataset of its own):")
        lines += [f"  {name:<34} record {seq}  {when or ''}".rstrip()
                  for name, (seq, when) in sorted(report.datasets_first.items(),
                                                  key=lambda item: item[1][0])]
    for title, table in (("dataset", report.by_dataset), ("analyst", report.by_analyst),
                         ("mechanism", report.by_mechanism),
                         ("pipeline", report.by_pipeline), ("label", report.by_label)):
        if table:
            lines.append(f"\nper {title} (sum of declared costs):")
            lines += [f"  {name:<34} {_tally(t, title)}" for name, t in sorted(table.items())]
    if report.by_noise:
        lines.append("\n" + noise_line(report.by_noise))
    if report.refused:
        lines.append(f"refused requests in the log (not spend; for review): "
                     f"{sum(report.refused.values())} ("
                     + ", ".join(f"{k} {v}" for k, v in sorted(report.refused.items())) + ")")
    if report.problems:
        lines.append(f"\nPROBLEMS ({report.problem_count}):")
        lines += [f"  [{p.kind}] {p.message}" for p in report.problems[:50]]
        if report.problem_count > 50:
            lines.append(f"  ... and {report.problem_count - 50} more (use --json)")
    else:
        lines.append("\n" + ("the records present verify; " if report.absent else
                              "chain verifies; ") +
                     "replay agrees with the stored state; no limit exceeded")
    if plot_path:
        lines.append(f"plot written to {plot_path}")
    lines.append(f"exit status {report.exit_status}")
    return "\n".join(lines)
