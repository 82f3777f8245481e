"""The ``dpbudget`` command line: ``demo``, ``status``, ``audit``, ``export``, ``import``.

Exit status: 0 on success; 2 for bad usage or an unreadable ledger; ``audit`` documents its own
problem bits (``accountant.audit``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from accountant.errors import PrivacyError
from accountant.ledger import open_ledger
from accountant.report import budget_rows, budget_table

__all__ = ["main"]


def _open_existing(location: str):
    if "://" not in location and not Path(location).exists():
        raise PrivacyError(f"no ledger at {location!r}")
    return open_ledger(location)


def _status(args: argparse.Namespace) -> int:
    with _open_existing(args.ledger) as ledger:
        seq, head = ledger.head()
        if args.json:
            print(json.dumps({"ledger": ledger.url, "records": seq, "head": head,
                              "accounts": budget_rows(ledger)}, indent=2))
        else:
            print(f"ledger {ledger.url}: {seq} records, head hash {head}")
            print(budget_table(ledger))
    return 0


def _audit(args: argparse.Namespace) -> int:
    from accountant.audit import audit

    report = audit(args.source, args.policy, since=args.since, until=args.until,
                   expected_head=args.expect_head, plot=args.plot is not None)
    if args.plot is not None:
        from accountant.plot import plot_audit

        plot_audit(report, args.plot)
    if args.json:
        print(report.model_dump_json(indent=2, exclude={"accounts": {"__all__": {"series"}}}))
    else:
        print(_audit_text(report, args.plot))
    return report.exit_status


def _audit_text(report, plot_path: str | None) -> str:
    lines = [f"audit of {report.source}: {report.records} records, {report.verified} verified, "
             f"head {report.head_seq} {report.head_hash}"
             + (" (HMAC-keyed)" if report.keyed else "")]
    if report.first_time:
        lines.append(f"  from {report.first_time} to {report.last_time}")
    lines.append("\nper account (replayed from the records under each account's rule):")
    for a in report.accounts:
        limit = "no limit" if a.limit is None else (
            f"limit ε={a.limit['epsilon']:.6g} δ={a.limit['delta']:.3g}")
        agrees = {None: "", True: ", stored state agrees", False: ", STORED STATE DIFFERS"}[
            a.stored_state_agrees]
        flag = "  OVER LIMIT" if a.over_limit else ""
        lines.append(f"  {a.account:<34} {a.rule:<9} {a.releases:>7} releases  spent "
                     f"ε={a.spent['epsilon']:.6g} δ={a.spent['delta']:.3g}  ({limit}{agrees})"
                     f"{flag}")
    for title, table in (("analyst", report.by_analyst), ("mechanism", report.by_mechanism),
                         ("pipeline", report.by_pipeline), ("label", report.by_label)):
        if table:
            lines.append(f"\nper {title} (sum of declared costs):")
            for name, t in sorted(table.items()):
                lines.append(f"  {name:<34} {t.releases:>7} releases  Σε={t.epsilon:.6g} "
                             f"Σδ={t.delta:.3g}")
    if report.problems:
        lines.append(f"\nPROBLEMS ({report.problem_count}):")
        lines += [f"  [{p.kind}] {p.message}" for p in report.problems[:50]]
        if report.problem_count > 50:
            lines.append(f"  ... and {report.problem_count - 50} more (use --json)")
    else:
        lines.append("\nchain verifies; replay agrees with the stored state; no limit exceeded")
    if plot_path:
        lines.append(f"plot written to {plot_path}")
    lines.append(f"exit status {report.exit_status}")
    return "\n".join(lines)


def _export(args: argparse.Namespace) -> int:
    from accountant.transfer import export_jsonl

    with _open_existing(args.ledger) as ledger:
        n = export_jsonl(ledger, args.out)
        seq, head = ledger.head()
    print(f"exported {n} records to {args.out}; head {seq} {head}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from accountant.transfer import import_jsonl

    with open_ledger(args.ledger) as ledger:
        n = import_jsonl(args.jsonl, ledger)
    print(f"imported {n} records into {args.ledger}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dpbudget_examples.demo import main as demo_main

    return demo_main(args.demo_args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbudget", description="Hard privacy budgets around data analysis.")
    sub = parser.add_subparsers(dest="command", required=True)
    # The demo parses its own options (--ledger, --seed, --help).
    demo = sub.add_parser("demo", help="run the bundled example pipeline on an SQLite ledger",
                          add_help=False)
    demo.set_defaults(func=_demo)
    status = sub.add_parser("status", help="spent and remaining budget per dataset")
    status.add_argument("ledger", help="ledger file or URL (sqlite:///..., postgresql://...)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)
    aud = sub.add_parser("audit", help="replay and verify a ledger or JSONL export/log")
    aud.add_argument("source", help="ledger file/URL or JSONL file")
    aud.add_argument("--policy", help="also check the limits of this policy file")
    aud.add_argument("--json", action="store_true", help="machine-readable report")
    aud.add_argument("--plot", metavar="PNG", help="write cumulative spend per account (needs "
                     "matplotlib)")
    aud.add_argument("--since", help="tally only records at or after this ISO 8601 time")
    aud.add_argument("--until", help="tally and replay only up to this ISO 8601 time")
    aud.add_argument("--expect-head", metavar="HASH", help="the head hash kept elsewhere; a "
                     "different end means a truncated or rewritten tail")
    aud.set_defaults(func=_audit)
    exp = sub.add_parser("export", help="write a ledger's records as JSONL")
    exp.add_argument("ledger")
    exp.add_argument("out")
    exp.set_defaults(func=_export)
    imp = sub.add_parser("import", help="load a verified JSONL export into a new ledger")
    imp.add_argument("jsonl")
    imp.add_argument("ledger", help="the new ledger (file or URL); must be empty")
    imp.set_defaults(func=_import)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        args.demo_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args)
    except PrivacyError as exc:
        print(f"dpbudget {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
