"""The ``dpbudget`` command line: ``demo``, ``status``.

Exit status: 0 on success; 2 for bad usage or an unreadable ledger.
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
